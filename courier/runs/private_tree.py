"""A harness home kept private (docs/runs.md#the-store): copied without following links, 0700 directories, 0600
files."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from courier.runs.privacy import seal


def copy_private_tree(source: Path, destination: Path) -> None:
    """Copy a harness home without following symlinks; every directory 0700 and every file 0600."""
    if os.path.isdir(source) and not os.path.islink(source):
        shutil.copytree(source, destination, symlinks=True, dirs_exist_ok=True, ignore=_special_files)
    # 0700 directories, 0600 files, links left alone; what fails here the end of the run seals again.
    seal(destination, b"")


def _special_files(directory: str, names: list[str]) -> set[str]:
    """Sockets, FIFOs and devices a harness left behind are not copied (a FIFO would block the copy)."""
    skipped = set()
    for name in names:
        mode = os.lstat(os.path.join(directory, name)).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
            skipped.add(name)
    return skipped
