"""Ask several machines at once, each bounded by one shared deadline: `wb agent list --all`, `wb machines
--check`, `--to auto`'s candidates, a Ray head's nodes.

At most FLEET_MAX_IN_FLIGHT calls are in flight; a call not started before the deadline is not
attempted. Every machine's failure is its own answer, never the whole one's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from courier.errors import TransportError
from protocol import limits
from protocol.models import RemoteResponse


@dataclass
class Answer:
    """One machine's reply (or failure), with when it was asked and answered (wall clock)."""

    response: RemoteResponse | None
    error: BaseException | None
    elapsed_ms: int = 0
    sent_at: float = 0.0
    received_at: float = 0.0


# One machine's call: the seconds left before the deadline → its reply.
Ask = Callable[[float], Awaitable[RemoteResponse]]


async def ask_each(
    askers: Mapping[str, Ask],
    deadline: float,
    in_flight: int = limits.FLEET_MAX_IN_FLIGHT,
    late: str = "not attempted before the deadline",
) -> dict[str, Answer]:
    """Every machine's answer, concurrently, each call bounded by what is left of `deadline` (time.monotonic());
    `late`: what a machine not asked before the deadline is told."""
    slots = asyncio.Semaphore(in_flight)
    out: dict[str, Answer] = {}

    async def one(name: str, ask: Ask) -> None:
        async with slots:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                error = TransportError(f"{name}: {late}", cause="not attempted")
                out[name] = Answer(None, error)
                return
            began, sent_at = time.monotonic(), time.time()
            response: RemoteResponse | None = None
            failure: BaseException | None = None
            try:
                response = await ask(remaining)
            except Exception as exc:  # each machine's failure is its answer, never the whole one's
                failure = exc
            elapsed = int((time.monotonic() - began) * limits.MS_PER_SECOND)
            out[name] = Answer(response, failure, elapsed, sent_at, time.time())

    await asyncio.gather(*(one(name, ask) for name, ask in askers.items()))
    return out
