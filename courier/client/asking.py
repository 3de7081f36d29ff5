"""Ask one machine through its transport and turn an in-band failure into the error class it names; the one
await loop.

An in-band failure becomes the error class its `failure_kind` names, prefixed with the
machine when it came from elsewhere. The client (courier/client/client.py) and the features
below it (the fleet, placement, watch, follow) ask through here.
"""

from __future__ import annotations

import re
import time

from courier.client.transport import transport_for
from courier.config import Config
from courier.errors import CallTimedOut, UsageError, error_for_failure_kind
from courier.ops.await_ import AwaitLoop
from courier.text import clip_bytes, sanitize
from protocol import limits
from protocol.models import RemoteRequest, RemoteResponse, Result


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


def await_result(
    config: Config,
    machine: str,
    agent_id: str,
    wait_timeout_ms: int,
    *,
    started_at: float | None = None,
    chunk_ms: int | None = None,
) -> Result:
    """Await a run with `AwaitLoop`'s rules, blocking. The CLI passes the start of the command as
    `started_at`, so its start-up counts inside the user's bound. This machine is awaited the same way,
    through its transport (docs/architecture.md: no caller forks on local or remote)."""
    transport_for(config, machine).prepare()  # a one-time cost (importing asyncssh) is paid before a chunk counts
    loop = AwaitLoop(machine, agent_id, wait_timeout_ms, started_at=started_at, chunk_ms=chunk_ms)
    while True:
        request, bound_s = loop.step()
        try:
            result = ask(config, machine, request, timeout_s=bound_s).result_of()
        except CallTimedOut as exc:
            return loop.timed_out(exc)
        pause_s = loop.answered(result)
        if pause_s is None:
            return result
        if pause_s:
            time.sleep(pause_s)
