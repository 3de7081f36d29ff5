"""A stamp of the program on disk, so a long-lived process notices that wb was upgraded under it.

The stamp covers every `.py` file of the `courier` and `protocol` packages (path, size,
mtime, inode): a reinstall, an upgrade or an edit of an editable checkout changes it.
Light on purpose (os only): the remote serve mode and the courier check it between calls.
"""

from __future__ import annotations

import os

_MASK = (1 << 64) - 1  # an order-independent sum: directory order does not matter


def _package_dirs() -> list[str]:
    courier_dir = os.path.dirname(os.path.abspath(__file__))  # .../courier
    protocol_dir = os.path.join(os.path.dirname(courier_dir), "protocol")
    return [courier_dir, protocol_dir]


def program_stamp() -> int:
    """A number that changes when any of wb's source files is replaced, edited, added or removed."""
    total = 0
    stack = _package_dirs()
    while stack:
        directory = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            total = (total + hash((directory, "missing"))) & _MASK
            continue
        for entry in entries:
            name = entry.name
            if name.endswith(".py"):
                try:
                    info = entry.stat()
                except OSError:
                    continue
                total = (total + hash((entry.path, info.st_size, info.st_mtime_ns, info.st_ino))) & _MASK
            elif name != "__pycache__" and not name.startswith(".") and entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
    return total
