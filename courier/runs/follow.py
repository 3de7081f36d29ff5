"""Worker actions as they happen (contract §15.2): read events.jsonl forward from a byte offset.

Only complete lines are consumed, so an offset never splits a line and a reader that resumes
from `next_offset` neither repeats nor loses an action. Codex repeats a failed turn's message
as an `error` event right before `turn.failed`; `logs` shows it once, so while the run is
live a trailing `error` line is held back (not consumed) until the next line shows whether
a `turn.failed` follows it.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from typing import Any

from courier.runs.harness.codex import _action_of, _clean, _decode, _malformed, _message_of
from courier.runs.store import EVENTS, Store, render
from protocol import limits
from protocol.models import Result

# One reply carries at most this many actions (each ≤ 240 bytes): well under the 2 MiB transcript bound.
ACTIONS_PER_REPLY_MAX = 4096
_READ_MAX = 2 * limits.EVENT_LINE_MAX_BYTES


def _read_from(path: str, offset: int) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return b""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        return os.pread(fd, _READ_MAX, offset)
    finally:
        os.close(fd)


def _event(line: bytes) -> dict[str, Any] | None:
    _, event, ok = _decode(line)
    return event if ok else None


def read_actions(path: str, offset: int, *, final: bool) -> tuple[list[str], int]:
    """(actions, next_offset) for the complete lines of `path` from `offset`.

    `final` (the run is terminal, so the file will not grow) releases a held-back trailing line.
    """
    data = _read_from(path, offset)
    end = data.rfind(b"\n") + 1
    if end == 0 and len(data) >= _READ_MAX:
        # A line longer than the window: the owner never stores one, so skip it as one diagnostic.
        return [f"diagnostic: event line over {limits.EVENT_LINE_MAX_BYTES} bytes"], offset + len(data)
    lines = data[:end].split(b"\n")[:-1]
    actions: list[str] = []
    consumed = 0
    for index, line in enumerate(lines):
        size = len(line) + 1
        if len(actions) >= ACTIONS_PER_REPLY_MAX:
            break
        if not line.strip():
            consumed += size
            continue
        event = _event(line)
        if event is None:
            text, _, _ = _decode(line)
            actions.append(_clean(f"diagnostic: malformed event line: {_malformed(text)}", limits.LOG_ACTION_MAX_BYTES))
            consumed += size
            continue
        if event.get("type") == "error":
            following = next((_event(later) for later in lines[index + 1 :] if later.strip()), None)
            if following is None and not final and index + 1 >= len(lines):
                break  # hold it back: the next line decides whether it is a turn.failed's echo
            if (
                following is not None
                and following.get("type") == "turn.failed"
                and _message_of(following.get("error")) == _message_of(event)
            ):
                consumed += size
                continue
        action = _action_of(event)
        if action is not None:
            actions.append(_clean(action, limits.LOG_ACTION_MAX_BYTES))
        consumed += size
    return actions, offset + consumed


def follow_once(
    store: Store,
    agent_id: str,
    offset: int,
    wait_timeout_ms: int,
    client_gone: Callable[[], bool],
) -> tuple[list[str], int, Result]:
    """Wait until there is a new action, the run is terminal or the wait ends; then answer.

    The state is read before the file, so a terminal answer carries every action the run wrote.
    """
    path = str(store.run_dir(agent_id) / EVENTS)
    deadline = time.monotonic() + wait_timeout_ms / 1000
    while True:
        result = render(store.load(agent_id), store)
        actions, next_offset = read_actions(path, offset, final=result.terminal)
        now = time.monotonic()
        if actions or result.terminal or now >= deadline or client_gone():
            return actions, next_offset, result
        offset = next_offset  # blank lines consumed without an action
        time.sleep(max(0.001, min(limits.AWAIT_POLL_S, deadline - now)))
