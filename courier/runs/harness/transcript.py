"""Reading a stored transcript (events.jsonl) backwards, for `logs`' last N worker actions."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from typing import Any

from courier.runs.harness.lines import action_lines, clean
from protocol import limits

_BLOCK = limits.READ_CHUNK_BYTES


def lines_backwards(path: str | os.PathLike[str] | int, block: int = _BLOCK) -> Iterator[bytes | None]:
    """The file's lines from last to first (without their newlines), read in blocks from the end.

    The empty text after a final newline comes out as a blank line. A line longer than
    `limits.EVENT_LINE_MAX_BYTES` is not accumulated: it comes out as None (the owner never
    stores one, so it means the file was written by something else).
    """
    # An int is a descriptor the store already opened and checked: read a duplicate of it.
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.dup(path) if isinstance(path, int) else os.open(path, flags)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        position = handle.seek(0, os.SEEK_END)
        carry = b""  # the start of the file's unread part holds the rest of this line
        oversize = False  # the line being accumulated is too long: its bytes are dropped
        while position > 0:
            step = min(block, position)
            position -= step
            handle.seek(position)
            buffer = handle.read(step)
            if not oversize:
                buffer += carry
            end = len(buffer)
            while (newline := buffer.rfind(b"\n", 0, end)) >= 0:
                if oversize:
                    oversize = False
                    yield None
                else:
                    yield buffer[newline + 1 : end]
                end = newline
            carry = b"" if oversize else buffer[:end]
            if len(carry) > limits.EVENT_LINE_MAX_BYTES:
                carry, oversize = b"", True
        yield None if oversize else carry


LineActions = Callable[[bytes | None], tuple[dict[str, Any] | None, list[str] | None]]


def last_actions(
    path: str | os.PathLike[str] | int,
    limit: int,
    actions_of: Callable[[dict[str, Any]], list[str]],
    line_actions: LineActions = action_lines,
) -> list[str]:
    """The last `limit` worker actions of a transcript, oldest first (docs/cli.md, wb agent logs;
    docs/runs.md#summaries).

    Reads backwards from the end of the file, so the cost is proportional to how far back the
    last `limit` actions are, not to the file's size. Each action is sanitised and at most 240
    bytes, a cut one ending in `…`. A missing file, a symlink or anything but a regular file
    raises OSError.
    """
    if limit <= 0:
        return []
    found: list[str] = []
    for line in lines_backwards(path):
        event, actions = line_actions(line)
        if actions is None:
            assert event is not None
            actions = actions_of(event)
        for action in reversed(actions):
            found.append(clean(action, limits.LOG_ACTION_MAX_BYTES))
            if len(found) >= limit:
                found.reverse()
                return found
    found.reverse()
    return found
