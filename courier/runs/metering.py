"""What the owner meters while a run works (docs/cli.md#budgets, docs/cli.md#waiting-out-a-usage-limit): its budget
and the usage limits it meets.

The owner keeps one `RunMeter` per run. With a budget or `on_usage_limit` in force it puts the
metering relay (courier/runs/meter.py) between the worker and the provider, counts every model
response's tokens there, and tells the owner when to stop the worker: a bound crossed, or a
usage limit to wait out. The harness's own stream still decides everything else.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from courier.runs.budget import exceeded
from courier.runs.usage_wait import Limit
from protocol.models import Usage

if TYPE_CHECKING:
    from courier.config import Provider
    from courier.runs.harness.base import EventParser
    from courier.runs.meter import LimitRefusal, Meter, ResponseUsage
    from courier.runs.store import Record


def _add(one: Usage | None, other: Usage | None) -> Usage | None:
    if one is None or other is None:
        return one or other

    def both(a: int | None, b: int | None) -> int | None:
        return None if a is None and b is None else (a or 0) + (b or 0)

    cost = None if one.cost_usd is None and other.cost_usd is None else (one.cost_usd or 0) + (other.cost_usd or 0)
    return Usage(
        input_tokens=one.input_tokens + other.input_tokens,
        cached_input_tokens=both(one.cached_input_tokens, other.cached_input_tokens),
        cache_write_input_tokens=both(one.cache_write_input_tokens, other.cache_write_input_tokens),
        output_tokens=one.output_tokens + other.output_tokens,
        reasoning_output_tokens=both(one.reasoning_output_tokens, other.reasoning_output_tokens),
        cost_usd=cost,
    )


class RunMeter:
    def __init__(self, record: Record) -> None:
        self.budget = record.budget
        self.policy = record.usage_limit
        self.provider_name = record.resolved.provider or record.resolved.harness
        self.relay: Meter | None = None
        self._lock = threading.Lock()
        self.input_tokens = 0
        self.output_tokens = 0
        self.responses = 0
        self.budget_failure: str | None = None  # set once a bound is crossed
        self.limit_failure: str | None = None  # set when a usage limit ends the run
        self.limit_stopped = False  # the worker was stopped to wait out a usage limit
        self._limit: Limit | None = None
        self._stop_pending = False
        self._carried: Usage | None = None  # what earlier attempts of this run reported
        self.attempts = 1

    # -- the relay

    def wrap(self, provider: Provider, wire_api: str, confined: bool = False) -> Provider:
        """The provider as the worker sees it: through the relay when a budget or a wait is in force, or the
        worker is confined (its only way out is the relay, docs/security.md#confinement)."""
        if self.budget is None and self.policy is None and not confined:
            return provider
        # Imported here: the relay's http, email and ssl modules are ~20 ms of every owner's
        # start, and only a run through a provider with a budget or a wait in force needs them.
        from courier.runs.meter import Meter

        relay = Meter(provider.base_url, wire_api, self._responded, self._limited)
        self.relay = relay
        return provider.model_copy(update={"base_url": relay.start()})

    def stop(self) -> None:
        if self.relay is not None:
            self.relay.stop()

    def _responded(self, usage: ResponseUsage) -> None:
        with self._lock:
            self.responses += 1
            self.input_tokens += usage.input_tokens
            self.output_tokens += usage.output_tokens
            failure = exceeded(self.budget, self.input_tokens + self.output_tokens, None)
            if failure and self.budget_failure is None:
                self.budget_failure = failure
                self._stop_pending = True
                if self.relay is not None:
                    self.relay.close()  # before the worker sees this response end: nothing more is answered

    def _limited(self, refusal: LimitRefusal) -> None:
        with self._lock:
            if self.policy is None or self._limit is not None or self.budget_failure:
                return  # without on_usage_limit the harness meets the limit as it always does
            self._limit = Limit(self.provider_name, f"{refusal.message} (HTTP {refusal.status})", refusal.reset_at)
            self.limit_stopped = True
            self._stop_pending = True
            if self.relay is not None:
                self.relay.pause()  # the worker's own retries would only meet the limit again

    # -- asked by the owner while the worker runs

    def should_stop_worker(self) -> bool:
        """True once for each reason to stop the worker now (a bound crossed, a limit to wait out)."""
        with self._lock:
            pending, self._stop_pending = self._stop_pending, False
            return pending

    def check_cost(self, summary: EventParser) -> None:
        """A cost bound, checked whenever the harness reports a cost (Claude Code: its `result`)."""
        usage = _add(self._carried, summary.usage)
        cost = usage.cost_usd if usage is not None else None
        with self._lock:
            failure = exceeded(self.budget, None, cost)
            if failure and self.budget_failure is None:
                self.budget_failure = failure
                self._stop_pending = True
                if self.relay is not None:
                    self.relay.close()

    # -- after the worker ended

    def limit_after_exit(self, summary: EventParser, exit_code: int | None) -> bool:
        """A usage limit the harness itself reported as its failure (no 429 passed the relay)."""
        if self.policy is None or self.budget_failure or summary.usage_limit is None:
            return False
        if summary.failure(exit_code) is None:
            return False
        with self._lock:
            self._limit = Limit(self.provider_name, summary.usage_limit, summary.limit_reset_at)
        return True

    def take_limit(self, summary: EventParser) -> Limit | None:
        with self._lock:
            return self._limit

    def give_up(self, failure: str | None) -> None:
        self.limit_failure = failure

    def resumed(self) -> None:
        with self._lock:
            self._limit = None
            self.limit_stopped = False
            self._stop_pending = False
            self.attempts += 1
            if self.relay is not None:
                self.relay.reopen()

    def fold(self, summary: EventParser) -> None:
        self._carried = _add(self._carried, summary.usage)

    def usage(self, summary: EventParser) -> Usage | None:
        """The run's usage: the harness's own count, unless the relay counted more (a stopped or resumed worker)."""
        reported = _add(self._carried, summary.usage)
        if self.relay is None or not self.responses:
            return reported
        metered = self.input_tokens + self.output_tokens
        if reported is not None and self.attempts == 1 and reported.input_tokens + reported.output_tokens >= metered:
            return reported
        cost = reported.cost_usd if reported is not None else None
        return Usage(input_tokens=self.input_tokens, output_tokens=self.output_tokens, cost_usd=cost)
