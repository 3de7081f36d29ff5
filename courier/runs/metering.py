"""What the owner meters while a run works (docs/cli.md#budgets, docs/cli.md#waiting-out-a-usage-limit): its budget
and the usage limits it meets.

The owner keeps one `RunMeter` per run. When `relay_needed` says so it puts the metering relay
(courier/runs/meter.py) between the worker and the provider: the worker holds a per-run
placeholder instead of the credential, and the relay counts every model response's tokens.
Each response counts as the larger of the relay's figure and the harness stream's figure for
it (Claude Code's per-message usage, matched by the message's ID); a response neither side
reports usage for stops a bounded run. The meter tells the owner when to stop the worker: a
bound crossed, or a usage limit to wait out. The harness's own stream decides everything else.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from courier.runs.budget import exceeded
from courier.runs.environment import Credential
from courier.runs.usage_wait import Limit
from protocol.models import Usage

if TYPE_CHECKING:
    from courier.config import Provider
    from courier.runs.harness.interface import EventParser, MessageUsage
    from courier.runs.meter import LimitRefusal, Meter, ResponseUsage
    from courier.runs.store import Record

NO_USAGE_FAILURE = "budget cannot be enforced: a model response reported no usage"
# How long the relay holds a worker's next request while a response the provider reported no
# usage for waits for the harness's stream to report it (Claude Code prints a message's usage
# before it makes its next request; the owner may read that line a moment after).
_STREAM_USAGE_WAIT_S = 10.0
# Responses remembered by ID for matching the stream's figure to the relay's; older ones are final.
_OPEN_RESPONSES = 256


def relay_needed(record: Record) -> bool:
    """THE one decision whether the metering relay is in front of this run's worker (docs/cli.md#budgets):
    a budget or a usage-limit wait is in force, or the worker is confined and has a provider (the relay is its
    only way out, docs/security.md#confined-runs). Every run the relay serves gets the placeholder credential."""
    confined = record.sandbox is not None and record.sandbox.kind == "bwrap" and bool(record.resolved.provider)
    return record.budget is not None or record.usage_limit is not None or confined


@dataclass
class _Response:
    """One model response as each side reported it."""

    relay: ResponseUsage | None = None
    stream: ResponseUsage | None = None
    relay_seen: bool = False

    def counted(self) -> ResponseUsage | None:
        return _larger(self.relay, self.stream)


def _larger(one: ResponseUsage | None, other: ResponseUsage | None) -> ResponseUsage | None:
    """The larger of two figures for one response, count by count."""
    from courier.runs.meter import ResponseUsage

    if one is None or other is None:
        return one or other
    return ResponseUsage(
        max(one.input_tokens, other.input_tokens),
        max(one.output_tokens, other.output_tokens),
        max(one.cached_input_tokens, other.cached_input_tokens),
    )


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
    def __init__(self, record: Record, *, stream_reports_messages: bool = False) -> None:
        self.budget = record.budget
        self.price = record.price
        self.policy = record.usage_limit
        self.needed = relay_needed(record)
        self.provider_name = record.resolved.provider or record.resolved.harness
        # Whether the harness's stream reports each model response's usage (Claude Code): then a response the
        # provider reported none for waits for the stream's figure before the run is stopped for it.
        self.stream_reports_messages = stream_reports_messages
        self.relay: Meter | None = None
        self.placeholder: str | None = None
        self._lock = threading.Condition()
        self.input_tokens = 0
        self.output_tokens = 0
        self.cached_input_tokens = 0
        self.responses = 0
        self._open: OrderedDict[str, _Response] = OrderedDict()  # by response ID, newest last
        self._settled = (0, 0, 0)  # input, output, cached of the responses no longer open
        self._unreported: set[str] = set()  # responses the relay saw no usage in, waiting for the stream's figure
        self._anonymous = 0
        self.budget_failure: str | None = None  # set once a bound is crossed
        self.limit_failure: str | None = None  # set when a usage limit ends the run
        self.limit_stopped = False  # the worker was stopped to wait out a usage limit
        self._limit: Limit | None = None
        self._stop_pending = False
        self._carried: Usage | None = None  # what earlier attempts of this run reported
        self.attempts = 1

    # -- the relay

    def wrap(self, provider: Provider, wire_api: str, credential: Credential) -> Provider:
        """The provider as the worker sees it: through the relay when `relay_needed`."""
        if not self.needed:
            return provider
        # Imported here: the relay's http, email and ssl modules are ~20 ms of every owner's
        # start, and only a run the relay serves needs them.
        from courier.runs.meter import Meter, new_placeholder

        self.placeholder = new_placeholder()
        relay = Meter(
            provider.base_url,
            wire_api,
            self._responded,
            self._limited,
            placeholder=self.placeholder,
            credential=credential.value,
            admit=self._admit if self.budget is not None else None,
        )
        self.relay = relay
        return provider.model_copy(update={"base_url": relay.start()})

    def worker_credential(self, credential: Credential | None) -> Credential | None:
        """What the worker's environment holds: the placeholder when the relay is in front, never the credential."""
        if credential is None or self.placeholder is None:
            return credential
        return Credential(credential.env_name, self.placeholder)

    def stop(self) -> None:
        if self.relay is not None:
            self.relay.stop()

    def _responded(self, usage: ResponseUsage | None, response_id: str | None) -> None:
        """A model response the relay answered (from its handler thread)."""
        with self._lock:
            self.responses += 1
            if response_id is None:
                self._anonymous += 1
                response_id = f"#relay-{self._anonymous}"
            entry = self._entry(response_id)
            entry.relay, entry.relay_seen = usage, True
            if entry.counted() is None and self.budget is not None:
                if self.stream_reports_messages:
                    self._unreported.add(response_id)  # the stream may still report it; the next request waits
                else:
                    self._fail(NO_USAGE_FAILURE)
            self._recount()

    def observe(self, summary: EventParser) -> None:
        """After each line of the harness's stream: its per-message usage, and its own cost (Claude Code's `result`)."""
        reported = summary.take_message_usage()
        if reported:
            with self._lock:
                for message in reported:
                    self._stream_usage(message)
                self._recount()
                self._lock.notify_all()
        if self.budget is not None and self.budget.cost_usd is not None:
            self.check_cost(summary)

    def _stream_usage(self, message: MessageUsage) -> None:
        from courier.runs.meter import ResponseUsage

        entry = self._entry(message.message_id)
        new = ResponseUsage(message.input_tokens, message.output_tokens, message.cached_input_tokens)
        entry.stream = _larger(entry.stream, new)
        self._unreported.discard(message.message_id)

    def _entry(self, response_id: str) -> _Response:
        entry = self._open.get(response_id)
        if entry is None:
            entry = self._open[response_id] = _Response()
            while len(self._open) > _OPEN_RESPONSES:
                _, old = self._open.popitem(last=False)
                counted = old.counted()
                if counted is not None:
                    tokens_in, tokens_out, cached = self._settled
                    self._settled = (
                        tokens_in + counted.input_tokens,
                        tokens_out + counted.output_tokens,
                        cached + counted.cached_input_tokens,
                    )
        return entry

    def _recount(self) -> None:
        """The run's tokens so far (each response the larger of both sides), checked against the bounds."""
        tokens_in, tokens_out, cached = self._settled
        for entry in self._open.values():
            counted = entry.counted()
            if counted is not None:
                tokens_in += counted.input_tokens
                tokens_out += counted.output_tokens
                cached += counted.cached_input_tokens
        self.input_tokens, self.output_tokens, self.cached_input_tokens = tokens_in, tokens_out, cached
        failure = exceeded(self.budget, tokens_in + tokens_out, self.priced_cost())
        if failure:
            self._fail(failure)

    def priced_cost(self) -> float | None:
        """The metered tokens' cost at the profile's price (docs/config.md#price), or None without a price."""
        if self.price is None or self.relay is None:
            return None  # only what the relay metered is priced
        return self.price.cost_usd(self.input_tokens, self.cached_input_tokens, self.output_tokens)

    def _fail(self, failure: str) -> None:
        if self.budget_failure is None:
            self.budget_failure = failure
            self._stop_pending = True
            if self.relay is not None:
                self.relay.close()  # before the worker sees this response end: nothing more is answered

    def _admit(self) -> bool:
        """Asked by the relay before it forwards a request: a response without usage on either side stops the run."""
        with self._lock:
            if self._unreported:
                self._lock.wait_for(lambda: not self._unreported, timeout=_STREAM_USAGE_WAIT_S)
            if self._unreported:
                self._fail(NO_USAGE_FAILURE)
            return self.budget_failure is None

    def settle(self) -> None:
        """After the worker ended: a response still without usage on either side is the run's failure."""
        with self._lock:
            if self._unreported and self.budget is not None:
                self._fail(NO_USAGE_FAILURE)

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
            if failure:
                self._fail(failure)

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
        """The run's usage: the harness's own count, unless the meter counted more (a stopped or resumed worker);
        with a price, its cost is at least the metered tokens' cost."""
        reported = _add(self._carried, summary.usage)
        found = reported
        metered = self.input_tokens + self.output_tokens
        # Without a bound the relay only carries the credential (a confined run): the harness's count stands.
        bounded = self.budget is not None or self.policy is not None
        if bounded and self.relay is not None and self.responses and metered:
            covers = reported is not None and reported.input_tokens + reported.output_tokens >= metered
            if not (covers and self.attempts == 1):
                cost = reported.cost_usd if reported is not None else None
                found = Usage(input_tokens=self.input_tokens, output_tokens=self.output_tokens, cost_usd=cost)
        priced = self.priced_cost()
        if found is not None and priced is not None and (found.cost_usd is None or found.cost_usd < priced):
            found = found.model_copy(update={"cost_usd": priced})
        return found
