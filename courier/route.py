"""Ask one machine through its transport and turn an in-band failure into the error class it names.

An in-band failure becomes the error class its `failure_kind` names, prefixed with the
machine when it came from elsewhere.
"""

from __future__ import annotations

import os
import re
import time

from courier.config import Config
from courier.errors import CallTimedOut, UsageError, error_for_failure_kind
from courier.text import clip_bytes, sanitize
from courier.transport import transport_for
from protocol import limits
from protocol.durations import format_duration_ms
from protocol.models import RemoteRequest, RemoteResponse, Result
from protocol.refs import format_reference


def ask(config: Config, machine: str, request: RemoteRequest, *, timeout_s: float | None = None) -> RemoteResponse:
    """Send one request and return its reply; an in-band failure is raised as its error class."""
    response = transport_for(config, machine).ask(request, timeout_s=timeout_s)
    raise_failure(machine, response, request.operation)
    return response


_UNSUPPORTED = re.compile(r"\b(unknown|unsupported) operation\b", re.IGNORECASE)


def upgrade_message(machine: str, version: str | None, feature: str) -> str:
    """docs/protocol.md#optional-features: what the caller says when a peer lacks an operation or feature."""
    who = f"wb {sanitize(version)[:64]}" if version else "an older wb"
    return f"machine {machine} runs {who}, which does not support {feature}; upgrade wb there"


def raise_failure(machine: str, response: RemoteResponse, operation: str = "") -> None:
    if not response.failure:
        return
    if (
        machine
        and operation
        and response.failure_kind in (None, "request")
        and _UNSUPPORTED.search(response.failure)
        and operation in response.failure
    ):
        raise UsageError(upgrade_message(machine, response.wb_version, operation))
    text = response.failure
    if machine:
        text = sanitize(clip_bytes(text, limits.REMOTE_FAILURE_SHOWN_MAX_BYTES))
        if response.failure_kind is None:
            text += " (the peer's wb predates failure_kind; upgrade it for exact exit codes)"
        text = f"{machine}: {text}"
    raise error_for_failure_kind(response.failure_kind)(text)


def command_started_at() -> float:
    """When the user's command started, on the time.monotonic() clock (its start-up included)."""
    from courier.runs.process import command_age_s

    return time.monotonic() - command_age_s()


def await_chunk_ms() -> int:
    """At most 5 min per remote await call; a smaller chunk can be set for tests."""
    override = os.environ.get("WB_AWAIT_CHUNK_MS", "")
    if override.isdigit() and 0 < int(override) <= limits.AWAIT_CHUNK_MS:
        return int(override)
    return limits.AWAIT_CHUNK_MS


def await_result(
    config: Config, machine: str, agent_id: str, wait_timeout_ms: int, *, started_at: float | None = None
) -> Result:
    """Await a run, in chunks of at most 5 min, so no remote poller outlives a dead client.

    The bound counts from `started_at` (time.monotonic(); default now): the CLI passes the start
    of the command, so its start-up counts inside the user's bound. Each chunk's call
    is bounded by the chunk plus a small slack (connect and reply), so the whole wait ends by
    the user's bound plus that slack even when the peer never answers: with the last
    observation when there is one, else the call's transport error. A peer that answers
    `running` without waiting is asked again after growing pauses, not at once. This machine
    is awaited the same way, through its transport (docs/architecture.md: no caller forks on
    local or remote).
    """
    transport_for(config, machine).prepare()  # a one-time cost (importing asyncssh) is paid before a chunk counts
    started = time.monotonic() if started_at is None else started_at
    deadline = started + wait_timeout_ms / limits.MS_PER_SECOND if wait_timeout_ms > 0 else None
    chunk = await_chunk_ms()
    slack_s = limits.AWAIT_CALL_SLACK_MS / limits.MS_PER_SECOND
    last: Result | None = None
    pause_s = 0.0
    while True:
        this_chunk = chunk
        if deadline is not None:
            this_chunk = max(1, min(chunk, int((deadline - time.monotonic()) * limits.MS_PER_SECOND)))
        request = RemoteRequest.of("await", agent_id=agent_id, wait_timeout_ms=this_chunk)
        asked_at = time.monotonic()
        try:
            result = ask(config, machine, request, timeout_s=this_chunk / limits.MS_PER_SECOND + slack_s).result_of()
        except CallTimedOut:
            if deadline is None or time.monotonic() < deadline:
                raise  # silent for a whole chunk and its slack, long before the user's bound
            if last is not None:
                return last  # the bound passed while the peer was silent: report what it said last
            raise CallTimedOut(
                f"{machine} did not answer the await of {format_reference(machine, agent_id)} within the wait bound "
                f"({format_duration_ms(wait_timeout_ms)}, plus {format_duration_ms(limits.AWAIT_CALL_SLACK_MS)} "
                "to connect and reply)"
            ) from None
        last = result
        if result.terminal or (deadline is not None and time.monotonic() >= deadline):
            return result
        pause_s = _reask_pause(pause_s, time.monotonic() - asked_at, this_chunk / limits.MS_PER_SECOND)
        if pause_s:
            time.sleep(pause_s if deadline is None else max(0.0, min(pause_s, deadline - time.monotonic())))


def _reask_pause(previous_s: float, answered_in_s: float, chunk_s: float) -> float:
    """The pause before the next chunk: none after a chunk the peer waited out, else growing."""
    if answered_in_s >= chunk_s / 2:
        return 0.0
    return min(limits.AWAIT_REASK_MAX_S, max(limits.AWAIT_REASK_FIRST_S, previous_s * 2))
