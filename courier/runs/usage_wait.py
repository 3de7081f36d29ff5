"""Waiting out a usage limit (docs/cli.md#waiting-out-a-usage-limit, docs/cli.md): when to resume, when to give up,
how to wait.

The owner calls these when the provider refused the run for a usage or rate limit and the
profile says `on_usage_limit: {resume: true}`. The wait itself is a sleep that a `stop`
request ends at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from protocol import limits
from protocol.durations import format_duration_ms
from protocol.models import UsageLimitPolicy, Wait
from protocol.timestamps import rfc3339

DEFAULT_WAIT_S = 15 * 60  # when the provider says neither a reset time nor a retry-after
_STOP_POLL_S = 0.2


@dataclass(frozen=True)
class Limit:
    """One usage-limit refusal: whose, what it said, and when it resets (epoch seconds) if known."""

    provider: str
    message: str
    reset_at: float | None = None

    @property
    def reason(self) -> str:
        return f"usage limit ({self.provider})"

    @property
    def failure(self) -> str:
        return f"usage limit ({self.provider}): {self.message}"


def resume_at(limit: Limit, now: float) -> float:
    """The provider's reset time (or its retry-after), else 15 minutes from now."""
    return limit.reset_at if limit.reset_at is not None else now + DEFAULT_WAIT_S


def refusal(policy: UsageLimitPolicy, waits_so_far: int, until: float, now: float, limit: Limit) -> str | None:
    """The failure that ends the run instead of waiting (too many waits, or a reset too far away), else None."""
    if waits_so_far >= policy.max_waits:
        return f"{limit.failure} (gave up after {policy.max_waits} wait(s), the on_usage_limit.max_waits bound)"
    if (until - now) * limits.MS_PER_SECOND > policy.max_wait_ms:
        resets = rfc3339(datetime.fromtimestamp(until, UTC))
        return (
            f"{limit.failure} (it resets at {resets}, further away than on_usage_limit.max_wait "
            f"{format_duration_ms(policy.max_wait_ms)})"
        )
    return None


def wait_record(limit: Limit, started: float, until: float) -> Wait:
    return Wait(
        started_at=rfc3339(datetime.fromtimestamp(started, UTC)),
        until=rfc3339(datetime.fromtimestamp(until, UTC)),
        reason=limit.reason,
    )


def wait_out(until: float, stop_requested: Callable[[], bool]) -> bool:
    """Sleep until `until` (epoch seconds); True as soon as a stop is requested."""
    while True:
        if stop_requested():
            return True
        left = until - time.time()
        if left <= 0:
            return False
        time.sleep(min(_STOP_POLL_S, left))
