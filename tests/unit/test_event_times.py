"""events.times (courier/runs/event_times.py): each stored line's arrival, found again by the offset after it."""

from __future__ import annotations

import os
from pathlib import Path

from courier.runs import event_times
from protocol.timestamps import parse_rfc3339


def test_each_noted_line_is_found_by_its_end_offset_and_an_unnoted_one_is_none(tmp_path: Path) -> None:
    path = tmp_path / event_times.TIMES
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    base = 1_796_000_000_000
    for n in range(1, 1001):
        event_times.note(fd, n * 100, base + n)
    os.close(fd)
    found = event_times.times_at(str(path), [100, 55_500, 100_000, 150, -1])
    assert [parse_rfc3339(t).timestamp() * 1000 if t else None for t in found] == [
        base + 1, base + 555, base + 1000, None, None,
    ]  # fmt: skip
    assert event_times.times_at(str(tmp_path / "absent"), [100]) == [None]
