"""wb.yaml's parsed document, kept between processes as JSON (docs/config.md#the-parsed-copy).

Every cold command and every receiver that finds a wb.yaml used to import PyYAML and parse the
file: about 15 ms of a cold start on a two-core machine, more for a large fleet's file
(docs/benchmarks.md, "The parsed copy of wb.yaml"). The copy is read instead only while the file is
exactly the file it was made from: the same device, inode, size, mtime and ctime, in
nanoseconds. Any write, replacement (an editor's rename) or chmod of the file changes its ctime
or inode, and the file is parsed again.

An edit made within one tick of the file system's clock after the copy was made could keep all
five, so a copy is made only of a file whose last change is at least RACY_S old (git's rule for
racy index entries). The copy holds what wb.yaml holds and is trusted as wb.yaml is: it is kept
only in a directory that is the user's own and closed to others, written atomically with mode
0600, and used only when it is owned by the user and writable by no one else. Every failure
here means "parse the file", never an error.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import time
import zlib
from pathlib import Path
from typing import Any

FORMAT = 1
# FAT's mtime has a 2 s resolution; every other file system wb meets is finer.
RACY_S = 2.0


def cache_dir() -> Path | None:
    """$XDG_CACHE_HOME/wb, else ~/.cache/wb; None when there is no home to keep it in."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "wb"
    try:
        return Path.home() / ".cache" / "wb"
    except (RuntimeError, KeyError):
        return None


def _identity(info: os.stat_result) -> list[int]:
    return [info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns]


def _copy_path(directory: Path, path: Path) -> Path:
    # One copy per wb.yaml path; the name only spreads paths out, the copy itself names its file.
    return directory / f"config-{zlib.crc32(os.fsencode(path)):08x}.json"


def _ours_and_closed(info: os.stat_result) -> bool:
    return info.st_uid == os.getuid() and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def read_copy(path: Path, info: os.stat_result) -> dict[str, Any] | None:
    """The parsed document of the file at `path` (its stat is `info`), when a copy of exactly it is kept."""
    directory = cache_dir()
    if directory is None:
        return None
    try:
        fd = os.open(_copy_path(directory, path), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not (_ours_and_closed(os.fstat(fd)) and _ours_and_closed(os.stat(directory))):
            return None
        with os.fdopen(fd, "rb", closefd=False) as handle:
            kept = json.loads(handle.read())
    except (OSError, ValueError, RecursionError):
        return None
    finally:
        os.close(fd)
    if (
        not isinstance(kept, dict)
        or kept.get("format") != FORMAT
        or kept.get("path") != str(path)
        or kept.get("identity") != _identity(info)
        or not isinstance(kept.get("document"), dict)
    ):
        return None
    document: dict[str, Any] = kept["document"]
    return document


def keep_copy(path: Path, info: os.stat_result, document: dict[str, Any], *, racy_s: float | None = None) -> bool:
    """Keep the parsed `document` of the file at `path` (its stat before the parse was `info`); True when kept.

    Not kept: a file changed less than `racy_s` ago, a document JSON would not give back as it is
    (a date, a binary value, a key that is not a string), or any failure to write.
    """
    racy = RACY_S if racy_s is None else racy_s
    if time.time() - max(info.st_mtime_ns, info.st_ctime_ns) / 1e9 < racy or not _plain(document):
        return False
    directory = cache_dir()
    if directory is None:
        return False
    temporary = directory / f".config-{os.getpid()}-{time.monotonic_ns()}.tmp"
    body = json.dumps({"format": FORMAT, "path": str(path), "identity": _identity(info), "document": document})
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not _ours_and_closed(os.stat(directory)):
            return False
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, body.encode())
        finally:
            os.close(fd)
        os.replace(temporary, _copy_path(directory, path))
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        return False
    return True


def _plain(value: Any, depth: int = 0) -> bool:
    """True when JSON gives `value` back unchanged: mappings with string keys, lists, str, int, float, bool, None."""
    if depth > 64:
        return False
    if value is None or isinstance(value, (str, bool, int, float)):
        return True
    if isinstance(value, list):
        return all(_plain(item, depth + 1) for item in value)
    if isinstance(value, dict):
        return all(isinstance(key, str) and _plain(item, depth + 1) for key, item in value.items())
    return False
