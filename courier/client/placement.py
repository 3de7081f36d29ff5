"""`dispatch --to auto[:LABEL]`: choose the machine with the most free slots, then dispatch there
(docs/cli.md#placement-across-a-fleet).

Every candidate is asked concurrently, once, for its placement facts (a `version` with
`placement: true`), each bounded by one shared deadline. Those that can take the run are
ranked (most free slots, then fewest running, then config order) and tried in that order
with the slot bound in the request (`max_running`): the receiver refuses in-band when it is
already full, so two concurrent placements never overfill a machine, and the caller tries the
next. A peer that does not list `placement` cannot enforce the bound, so it is never chosen:
its reason is the upgrade message. None fits: exit 1 naming every candidate's reason.
"""

from __future__ import annotations

import asyncio
import queue
import time
from dataclasses import dataclass
from typing import Protocol

from courier.call.fan_out import Ask, ask_each
from courier.capabilities import BUDGET, PLACEMENT, harnesses_of
from courier.client.asking import raise_failure, upgrade_message
from courier.client.transport import connections_shared, transport_for
from courier.commands import label_of
from courier.config import Config, Problem, Profile
from courier.errors import Finding, TransportError, UsageError, WbError
from courier.text import sanitize
from protocol import limits
from protocol.models import RemoteRequest, RemoteResponse, Result
from protocol.refs import format_reference

_REASON_MAX_CHARS = 200  # one machine's reason in the exit-1 line


@dataclass
class Candidate:
    machine: str
    order: int
    slots: int | None
    running: int = 0
    reason: str | None = None  # why it cannot take the run (None: it can)

    @property
    def free(self) -> float:
        return float("inf") if self.slots is None else self.slots - self.running


class NoRoom(Finding):
    """No candidate can take the run now (exit 1): each one's reason is in the message."""


class Asker(Protocol):
    """What placement asks of the client (courier/client/client.py): its configuration, one request, and
    to keep what each candidate's probe said it supports."""

    config: Config

    def ask(self, machine: str, request: RemoteRequest, *, timeout_s: float | None = None) -> RemoteResponse: ...

    def remember(self, machine: str, version: RemoteResponse) -> None: ...


def dispatch_auto(
    client: Asker, to: str, request: RemoteRequest, machine_timeout_s: float, wait_for_slot_ms: int = 0
) -> Result:
    """Place the dispatch `request` on the best candidate of `to` and start it there; with `wait_for_slot_ms`,
    when none can take it now, wait that long for one (`_wait_for_room`)."""
    try:
        return _place(client, to, request, machine_timeout_s)
    except NoRoom as exc:
        if wait_for_slot_ms <= 0:
            raise
        return _wait_for_room(client, to, request, machine_timeout_s, wait_for_slot_ms, exc)


def _wait_for_room(
    client: Asker, to: str, request: RemoteRequest, machine_timeout_s: float, wait_ms: int, refused: NoRoom
) -> Result:
    """Watch the candidates and try again when one of their runs finishes (and at least every
    SLOT_RECHECK_S, for a slot freed some other way: a clone made, a wb upgraded), never more often
    than once per SLOT_RETRY_MIN_S; past `wait_ms`, the last refusal."""
    from courier.client.watching import Watch

    deadline = time.monotonic() + wait_ms / limits.MS_PER_SECOND
    machines = [c.machine for c in _candidates(client.config, label_of(to)) if c.reason is None]
    fleet = Watch(client.config, machines, warn=lambda _: None)
    fleet.start()
    try:
        tried_at = time.monotonic()
        while True:
            recheck_at = min(deadline, tried_at + limits.SLOT_RECHECK_S)
            while (left := recheck_at - time.monotonic()) > 0:
                try:
                    _, events = fleet.events.get(timeout=left)
                except queue.Empty:
                    break
                if any(getattr(event, "event", "") == "finished" for event in events):
                    break
            if time.monotonic() >= deadline:
                raise refused
            time.sleep(max(0.0, tried_at + limits.SLOT_RETRY_MIN_S - time.monotonic()))
            tried_at = time.monotonic()
            try:
                return _place(client, to, request, machine_timeout_s)
            except NoRoom as exc:
                refused = exc
    finally:
        fleet.stop()


def _place(client: Asker, to: str, request: RemoteRequest, machine_timeout_s: float) -> Result:
    label = label_of(to)
    candidates = _candidates(client.config, label)
    harness = _harness(client.config, request.profile)
    probe = RemoteRequest.of("version", placement=True, repository=request.repository)
    open_ones = [c for c in candidates if c.reason is None]
    answers = asyncio.run(_probe_all(client.config, [c.machine for c in open_ones], probe, machine_timeout_s))
    for candidate in open_ones:
        answer = answers[candidate.machine]
        candidate.reason = _judge(candidate, answer, harness, request)
        if isinstance(answer, RemoteResponse):
            client.remember(candidate.machine, answer)
    ranked = sorted((c for c in candidates if c.reason is None), key=lambda c: (-c.free, c.running, c.order))
    for candidate in ranked:
        starting = request.model_copy(update={"max_running": candidate.slots or 0})
        try:
            return client.ask(candidate.machine, starting).result_of()
        except TransportError as exc:
            if exc.request_maybe_sent:  # the run may exist there: trying another machine could start it twice
                ref = format_reference(candidate.machine, request.agent_id)
                exc.message += f"\nthe run may have started; ask for it with: wb agent status {ref}"
                raise
            candidate.reason = f"unreachable ({_clip(exc.message, candidate.machine)})"
        except WbError as exc:  # an in-band refusal (full since the probe, no such worktree, …): try the next
            candidate.reason = _clip(exc.message, candidate.machine)
    reasons = "; ".join(f"{c.machine}: {c.reason}" for c in candidates)
    raise NoRoom(f"no machine can take this run now: {reasons}")


def _candidates(config: Config, label: str | None) -> list[Candidate]:
    """The configured machines `auto[:LABEL]` names, in config order; none is a usage error."""
    out: list[Candidate] = []
    for order, (machine, entry) in enumerate(config.targets.items()):
        if isinstance(entry, Problem):
            if label is None:  # its labels are unknown, so only plain `auto` names it
                out.append(Candidate(machine, order, None, reason=f"misconfigured ({_clip(entry.message, '')})"))
            continue
        if label is None or label in entry.labels:
            out.append(Candidate(machine, order, entry.slots))
    if not out:
        what = f"has label {label}" if label else "is configured"
        raise UsageError(
            f"--to auto{':' + label if label else ''}: no machine {what} "
            f"(add machines or labels under session_move.targets in {config.path})"
        )
    return out


def _harness(config: Config, profile: str) -> str | None:
    """The profile's harness as this machine's wb.yaml says; None when only the peers define the profile."""
    entry = config.profiles.get(profile)
    return entry.harness if isinstance(entry, Profile) else None


def _judge(
    candidate: Candidate, answer: RemoteResponse | BaseException, harness: str | None, request: RemoteRequest
) -> str | None:
    """Why this candidate cannot take the run, from its probe answer; None when it can."""
    machine = candidate.machine
    if isinstance(answer, TransportError):
        return f"unreachable ({_clip(answer.message, machine)})"
    if isinstance(answer, BaseException):
        return _clip(answer.message if isinstance(answer, WbError) else f"internal: {answer}", machine)
    try:
        raise_failure(machine, answer, "version")
    except WbError as exc:
        return _clip(exc.message, machine)
    capabilities = answer.capabilities or []
    if PLACEMENT not in capabilities or answer.placement is None:
        return _clip(upgrade_message(machine, answer.wb_version, "--to auto (placement)"), machine)
    if harness and harness not in harnesses_of(capabilities):
        return f"no harness {harness}"
    if (request.max_tokens or request.max_cost_usd) and BUDGET not in capabilities:
        return _clip(upgrade_message(machine, answer.wb_version, "--max-tokens and --max-cost-usd"), machine)
    if answer.placement.has_repository is False:
        return f"no clone of {request.repository}"
    candidate.running = answer.placement.running
    if candidate.slots is not None and candidate.running >= candidate.slots:
        return f"{candidate.running} of {candidate.slots} slots busy"
    return None


async def _probe_all(
    config: Config, machines: list[str], probe: RemoteRequest, bound_s: float
) -> dict[str, RemoteResponse | BaseException]:
    """Every candidate's probe answer (or failure), concurrently, within one deadline (courier/call/fan_out.py)."""

    def asker(machine: str) -> Ask:
        async def ask(remaining: float) -> RemoteResponse:
            return await transport_for(config, machine).ask_async(probe, timeout_s=remaining)

        return ask

    async with connections_shared():
        deadline = time.monotonic() + bound_s
        late = "not attempted before the machine timeout"
        answers = await ask_each({machine: asker(machine) for machine in machines}, deadline, late=late)
    out: dict[str, RemoteResponse | BaseException] = {}
    for machine, answer in answers.items():
        if answer.response is not None:
            out[machine] = answer.response
        else:
            assert answer.error is not None
            out[machine] = answer.error
    return out


def _clip(text: str, machine: str) -> str:
    """One machine's reason: one line, without its own `machine: ` prefix, bounded."""
    line = sanitize(text).splitlines()[0] if text.strip() else "no reason given"
    if machine:
        line = line.removeprefix(f"{machine}: ")
    return line[:_REASON_MAX_CHARS]
