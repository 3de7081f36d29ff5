"""Worker actions as they happen (docs/cli.md, wb agent logs): read events.jsonl forward from a byte offset.

Only complete lines are consumed, so an offset never splits a line and a reader that resumes
from `next_offset` neither repeats nor loses an action. An event whose meaning the next one
decides (Codex's `error` repeated by `turn.failed`, a Gemini tool call its error result undoes)
is held back, not consumed, while it is the last line of a live run, and every line is read
through the harness's `line_actions`, so `--follow` shows exactly what `logs` shows.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from courier.runs.event_times import TIMES, times_at
from courier.runs.harness import harness_for
from courier.runs.harness.interface import Harness
from courier.runs.harness.lines import clean
from courier.runs.store import EVENTS, Store, open_transcript_file, render
from protocol import limits
from protocol.models import Result

# One reply carries at most this many actions (each ≤ 240 bytes): well under the 2 MiB transcript bound.
ACTIONS_PER_REPLY_MAX = limits.FOLLOW_ACTIONS_PER_REPLY_MAX
_READ_MAX = 2 * limits.EVENT_LINE_MAX_BYTES


def _read_from(path: str, offset: int) -> bytes:
    """The bytes after `offset`; the file checked and refused as `logs` refuses it (no link, FIFO or hard link)."""
    opened = open_transcript_file(path)
    if opened is None:
        return b""
    fd, _ = opened
    try:
        return os.pread(fd, _READ_MAX, offset)
    finally:
        os.close(fd)


def _next_event(harness: Harness, lines: list[bytes]) -> tuple[bool, dict[str, Any] | None]:
    """(seen, event): what follows among `lines`, as `logs` reading backwards sees it. Lines that
    stand for nothing are passed over; a line that is its own action follows as no event."""
    for later in lines:
        event, found = harness.line_actions(later)
        if event is not None or found:
            return True, event
    return False, None


def read_actions(harness: Harness, path: str, offset: int, *, final: bool) -> tuple[list[str], int]:
    """(actions, next_offset) for the complete lines of `path` from `offset`.

    `final` (the run is terminal, so the file will not grow) releases a held-back last line.
    """
    actions, next_offset, _ = read_timed_actions(harness, path, offset, final=final)
    return actions, next_offset


def read_timed_actions(harness: Harness, path: str, offset: int, *, final: bool) -> tuple[list[str], int, list[int]]:
    """`read_actions`, and for each action the offset just after the line it came from (its time's key in
    events.times, courier/runs/event_times.py)."""
    data = _read_from(path, offset)
    end = data.rfind(b"\n") + 1
    if end == 0 and len(data) >= _READ_MAX:
        # A line longer than the window: the owner never stores one, so skip it as `logs` shows it.
        _, found = harness.line_actions(None)
        skipped = [clean(action, limits.LOG_ACTION_MAX_BYTES) for action in found or []]
        return skipped, offset + len(data), [-1] * len(skipped)
    lines = data[:end].split(b"\n")[:-1]
    actions: list[str] = []
    ends: list[int] = []
    consumed = 0
    for index, line in enumerate(lines):
        if len(actions) >= ACTIONS_PER_REPLY_MAX:
            break
        event, found = harness.line_actions(line)
        if found is None:
            assert event is not None
            if harness.may_echo(event):
                seen, following = _next_event(harness, lines[index + 1 :])
                if not seen and not final:
                    break  # hold it back: the next event decides whether it is an echo
                if following is not None and harness.echoed_by(event, following):
                    found = []
            if found is None:
                found = harness.actions_of(event)
        actions.extend(clean(action, limits.LOG_ACTION_MAX_BYTES) for action in found)
        consumed += len(line) + 1
        ends.extend([offset + consumed] * len(found))
    return actions, offset + consumed, ends


def follow_once(
    store: Store,
    agent_id: str,
    offset: int,
    wait_timeout_ms: int,
    client_gone: Callable[[], bool],
) -> tuple[list[str], int, Result, list[str | None]]:
    """Wait until there is a new action, the run is terminal or the wait ends; then answer, with when each
    action's line arrived.

    The state is read before the file, so a terminal answer carries every action the run wrote.
    """
    path = str(store.run_dir(agent_id) / EVENTS)
    deadline = time.monotonic() + wait_timeout_ms / limits.MS_PER_SECOND
    harness: Harness | None = None
    while True:
        record = store.load(agent_id)
        result = render(record, store)
        harness = harness or harness_for(record.resolved.harness)
        actions, next_offset, ends = read_timed_actions(harness, path, offset, final=result.terminal)
        now = time.monotonic()
        if actions or result.terminal or now >= deadline or client_gone():
            times = times_at(str(store.run_dir(agent_id) / TIMES), ends) if actions else []
            return actions, next_offset, result, times
        offset = next_offset  # blank lines consumed without an action
        time.sleep(max(0.001, min(limits.AWAIT_POLL_S, deadline - now)))
