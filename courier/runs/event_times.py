"""When each stored event line reached wb (docs/runs.md#the-store): `events.times` beside `events.jsonl`.

The transcript is the harness's own bytes, so the times live beside it: one fixed-width line per
stored event line, `<offset after the line, 16 digits> <epoch ms, 13 digits>\\n`, in file order.
Fixed width makes a lookup a binary search with a few `pread`s, whatever the run's length, so a
follow reply can say when each of its actions happened (the page shows it).
"""

from __future__ import annotations

import contextlib
import os

from protocol.timestamps import rfc3339_ms

TIMES = "events.times"
_LINE = 31  # 16 + 1 + 13 + 1


def note(fd: int, end_offset: int, epoch_ms: int) -> None:
    """One line for the event line that ends at `end_offset`; a failed write loses only that time."""
    with contextlib.suppress(OSError):
        os.write(fd, f"{end_offset:016d} {epoch_ms:013d}\n".encode())


def times_at(path: str, ends: list[int]) -> list[str | None]:
    """The RFC 3339 time of each event line ending at one of `ends` (None where none was noted)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return [None] * len(ends)
    try:
        count = os.fstat(fd).st_size // _LINE
        return [_find(fd, count, end) for end in ends]
    finally:
        os.close(fd)


def _find(fd: int, count: int, end: int) -> str | None:
    low, high = 0, count - 1
    while low <= high:
        middle = (low + high) // 2
        line = os.pread(fd, _LINE, middle * _LINE)
        try:
            offset, epoch_ms = int(line[:16]), int(line[17:30])
        except ValueError:
            return None
        if offset == end:
            return rfc3339_ms(epoch_ms)
        if offset < end:
            low = middle + 1
        else:
            high = middle - 1
    return None
