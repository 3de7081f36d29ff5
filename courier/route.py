"""Ask one machine through its transport and turn an in-band failure into the error class it names.

An in-band failure becomes the error class its `failure_kind` names, prefixed with the
machine when it came from elsewhere.
"""

from __future__ import annotations

import os
import time

from courier.config import Config
from courier.errors import error_for_failure_kind
from courier.text import clip_bytes, sanitize
from courier.transport import transport_for
from protocol import limits
from protocol.models import RemoteRequest, RemoteResponse, Result


def ask(config: Config, machine: str, request: RemoteRequest) -> RemoteResponse:
    """Send one request and return its reply; an in-band failure is raised as its error class."""
    response = transport_for(config, machine).ask(request)
    raise_failure(machine, response)
    return response


def raise_failure(machine: str, response: RemoteResponse) -> None:
    if not response.failure:
        return
    text = response.failure
    if machine:
        text = sanitize(clip_bytes(text, limits.REMOTE_FAILURE_SHOWN_MAX_BYTES))
        if response.failure_kind is None:
            text += " (the peer's wb predates failure_kind; upgrade it for exact exit codes)"
        text = f"{machine}: {text}"
    raise error_for_failure_kind(response.failure_kind)(text)


def await_chunk_ms() -> int:
    """At most 5 min per remote await call; a smaller chunk can be set for tests."""
    override = os.environ.get("WB_AWAIT_CHUNK_MS", "")
    if override.isdigit() and 0 < int(override) <= limits.AWAIT_CHUNK_MS:
        return int(override)
    return limits.AWAIT_CHUNK_MS


def await_result(config: Config, machine: str, agent_id: str, wait_timeout_ms: int) -> Result:
    """Await a run; a remote await is sent in chunks so no remote poller outlives a dead client."""
    if not machine:
        request = RemoteRequest(
            schema_version=limits.SCHEMA_VERSION, operation="await", agent_id=agent_id, wait_timeout_ms=wait_timeout_ms
        )
        return ask(config, machine, request).result_of()
    deadline = time.monotonic() + wait_timeout_ms / 1000 if wait_timeout_ms > 0 else None
    chunk = await_chunk_ms()
    while True:
        this_chunk = chunk
        if deadline is not None:
            this_chunk = max(1, min(chunk, int((deadline - time.monotonic()) * 1000)))
        request = RemoteRequest(
            schema_version=limits.SCHEMA_VERSION, operation="await", agent_id=agent_id, wait_timeout_ms=this_chunk
        )
        result = ask(config, machine, request).result_of()
        if result.terminal or (deadline is not None and time.monotonic() >= deadline):
            return result
