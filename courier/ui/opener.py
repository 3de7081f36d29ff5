"""`wb ui --open`: hand the browser a private redirect file, never the token on a command line.

`webbrowser.open(url)` starts the browser (or `xdg-open`, or `$BROWSER`) with the address as an
argument, and any user of the machine can read a process's arguments (/proc/PID/cmdline). So
the browser is given a file instead, readable only by this user, whose page redirects to the
address with its token (as Jupyter does). The file lives in `<home>/ui/` (0700) while the
server runs and is removed when it stops.
"""

from __future__ import annotations

import contextlib
import html
import os
from pathlib import Path

from courier.runs.store import write_private

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><meta http-equiv="refresh" content="0;url={url}"><title>wb ui</title></head>
<body><p><a href="{url}">Open wb ui</a></p></body></html>
"""


def redirect_file(home: Path, port: int, url: str) -> Path:
    """Write the 0600 page that redirects to `url` (token included); its path."""
    directory = home / "ui"
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(directory, 0o700)  # an existing directory too: the file names the token
    path = directory / f"open-{port}.html"
    write_private(path, PAGE.format(url=html.escape(url, quote=True)).encode("utf-8"))
    return path


def open_in_browser(home: Path, port: int, url: str) -> Path:
    """Ask the user's browser to open `url` through a redirect file; the file, to remove at the end."""
    import threading
    import webbrowser

    path = redirect_file(home, port, url)
    # webbrowser waits for a `$BROWSER` command to exit: the server must not wait with it.
    threading.Thread(target=webbrowser.open, args=(path.as_uri(),), name="wb-ui-open", daemon=True).start()
    return path


def remove(path: Path | None) -> None:
    if path is not None:
        with contextlib.suppress(OSError):
            path.unlink()
