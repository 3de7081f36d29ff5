"""The line `await` draws on a terminal while it waits (docs/cli.md, wb agent await).

`gpu-box:agt-… running 1m12s · 12,400 tokens · ran: pytest -q`: state, time since the run
started, tokens so far (when the machine knows them), the last worker action. It is drawn on
stderr only when stderr is a terminal and the output is text, redrawn at most every
REDRAW_S, cut to the terminal's width (a wrapped line could not be erased), and erased
before the facts are printed; stdout is what it is without it. The wait is `logs --follow`'s
loop (courier/client/following.py) with short calls, so each reply brings the state and the
actions; a machine whose wb cannot follow is awaited as before, without the line.
"""

from __future__ import annotations

import os
import shutil
import time
from typing import TYPE_CHECKING, TextIO

from courier.client.asking import command_started_at
from courier.client.following import NoFollow
from courier.text import sanitize
from protocol import limits
from protocol.durations import format_duration_ms
from protocol.refs import format_reference
from protocol.timestamps import epoch_seconds

if TYPE_CHECKING:
    from collections.abc import Callable

    from courier.client.client import Client
    from protocol.models import Result

REDRAW_S = 0.5
# Each follow call's wait: the line's state and elapsed time are at most this stale.
CALL_WAIT_MS = 1 * limits.MS_PER_SECOND
_ERASE = "\r\x1b[K"  # to the line's start, then clear to its end


class LiveLine:
    """One redrawn line on a terminal stream."""

    def __init__(self, stream: TextIO, ref: str) -> None:
        self.stream = stream
        self.ref = ref
        self.action = ""
        self.drawn_at = 0.0
        self.shown = False

    def actions(self, text: str) -> None:
        """The follow's output: the last indented line is the last worker action; the end line is not one."""
        found = [line.strip() for line in text.split("\n") if line.startswith("  ") and line.strip()]
        if found:
            self.action = found[-1]

    def draw(self, result: Result) -> None:
        now = time.monotonic()
        if now - self.drawn_at < REDRAW_S:
            return
        self.drawn_at = now
        width = max(20, _columns(self.stream) - 1)
        self.stream.write(_ERASE + line_text(self.ref, result, self.action, time.time())[:width])
        self.stream.flush()
        self.shown = True

    def erase(self) -> None:
        if self.shown:
            self.stream.write(_ERASE)
            self.stream.flush()
            self.shown = False

    def warning(self, warn: Callable[[str], None]) -> Callable[[str], None]:
        """`warn`, on a line of its own: the live line is erased first and drawn again on the next reply."""

        def erased_first(message: str) -> None:
            self.erase()
            warn(message)

        return erased_first


def _columns(stream: TextIO) -> int:
    """The width of the terminal the line is drawn on (stderr's, not stdout's, which may be a pipe)."""
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError):
        return shutil.get_terminal_size().columns


def line_text(ref: str, result: Result, action: str, now: float) -> str:
    elapsed_ms = max(0, int(now - epoch_seconds(result.started_at, now))) * limits.MS_PER_SECOND
    parts = [f"{ref} {sanitize(result.state)} {format_duration_ms(elapsed_ms)}"]
    if result.usage is not None:
        parts.append(f"{result.usage.input_tokens + result.usage.output_tokens:,} tokens")
    if action:
        parts.append(sanitize(action))
    return " · ".join(parts)


def await_with_line(
    client: Client, machine: str, run_id: str, bound_ms: int, stream: TextIO, warn: Callable[[str], None]
) -> Result:
    """`await` with the live line on `stream`; the same Result `Client.await_` gives."""
    line = LiveLine(stream, format_reference(machine, run_id))
    started_at = command_started_at()
    try:
        return client.follow(
            machine, run_id, line.actions, line.warning(warn),
            bound_ms=bound_ms, progress=line.draw, chunk_ms=CALL_WAIT_MS,
        )  # fmt: skip
    except NoFollow:
        line.erase()
        return client.await_(machine, run_id, bound_ms, started_at=started_at)
    finally:
        line.erase()
