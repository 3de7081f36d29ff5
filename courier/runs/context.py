"""What an operation's handler may use besides its request: the caller's configuration and a gone-check.

Below every handler module and the handler registry (`courier/operations.py`), so that the
registry can import its handlers and the handlers need nothing from it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from courier.runs.store import Store

if TYPE_CHECKING:  # the receiver does not import the configuration unless it dispatches
    from courier.config import Config
    from protocol.models import RemoteRequest, RemoteResponse


def never_gone() -> bool:
    return False


@dataclass
class Context:
    """The caller's already-loaded configuration (the CLI; None on the receiver) and a gone-check.

    `in_process` is true when the asker is this very process (the local transport): nothing
    crosses a wire, so the bounds that exist for the wire (diff's 2 MiB patch) do not apply.
    """

    client_gone: Callable[[], bool] = never_gone
    config: Config | None = None
    in_process: bool = False


Handler = Callable[["RemoteRequest", "RemoteResponse", Context], None]


# agents.home per wb.yaml as last read: (path, inode, size, mtime, ctime, WB_HOME) -> home.
_homes: dict[tuple[str, int, int, int, int, str | None], Path] = {}


def configured_home() -> Path:
    """agents.home as `load_config().home` resolves it, without reading wb.yaml when there is none.

    The receiver's hot path (status, await, list, logs, stop) needs only the home. With no
    wb.yaml, `load_config` would resolve it from WB_HOME or ~/.wb and could refuse nothing,
    so that answer costs no yaml and no config models; when the file exists it is read by
    `load_config` exactly as for every other command (same refusals), once for as long as
    the file stays the same: a receiver asks twice (the operation's store and the reply's
    home_id), a serve session at every request, and each read is yaml plus the config models.
    Any write, replacement or chmod of the file changes its inode, mtime or ctime, and it is
    read again.
    """
    from courier.paths import HOME_ENV, config_path, default_home

    path = config_path()
    if not path.exists():
        return default_home()
    from courier.config import load_config

    try:
        info = path.stat()
    except OSError:
        return load_config(path).home  # its own message for a file that cannot be read
    key = (str(path), info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns, os.environ.get(HOME_ENV))
    if key not in _homes:
        _homes.clear()
        _homes[key] = load_config(path).home
    return _homes[key]


def store_for(context: Context) -> Store:
    """The run store a handler reads: the caller's configured home, else the one wb.yaml names."""
    # Only dispatch needs the whole configuration (and the harness facts).
    return Store(context.config.home if context.config else configured_home()).ensure()
