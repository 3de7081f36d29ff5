"""The one caller (docs/protocol.md#the-callers-rules): ask one machine one question over whatever channel reaches it.

prepare (validate, size) → `channel.run(argv tail, stdin, bounds)` within the call's time
bound → classify the exit → find, decode and check the reply through the operation table
(`courier.call.decode.decode_response`). The same code for every channel: ssh, exec,
the courier's socket, the tests' in-process receiver. In-band refusals (`failure`) are
returned, not raised: the caller maps `failure_kind` to its exit code. Everything else
that goes wrong is a TransportError (exit 255) whose `cause` classifies it for fleet views.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from courier.call.decode import decode_response
from courier.call.peer_text import configured_secrets, mask_error, mask_response, masked_outcome
from courier.channels.channel import Channel, Outcome
from courier.channels.exits import stderr_excerpt
from courier.channels.registry import channel_for, direct_channel
from courier.config import AnyTarget, Config
from courier.errors import CallTimedOut, ReplyUntrusted, UsageError, WbError
from courier.stage_trace import mark
from protocol import limits
from protocol.durations import format_duration_ms
from protocol.entry import REMOTE_ARGUMENT
from protocol.models import RemoteRequest, RemoteResponse
from protocol.reply import BadReply, find_reply
from protocol.validate import RequestRefused, validate_request


def remote_tail(target: AnyTarget) -> list[str]:
    """Exactly `[<wb_path or wb>, --wb-internal-agent-remote]`; no request byte ever reaches this argv."""
    return [target.wb_path or "wb", REMOTE_ARGUMENT]


def prepare(config: Config, machine: str, request: RemoteRequest) -> tuple[AnyTarget, bytes]:
    """Everything that must hold before connecting: a usable target and a valid, small enough request."""
    target = config.target(machine)
    try:
        validate_request(request)
    except RequestRefused as exc:
        raise UsageError(str(exc)) from None
    payload = request.encode()
    if len(payload) > limits.REQUEST_MAX_BYTES:
        raise UsageError(
            f"the {request.operation} request for {machine} is {len(payload)} bytes; "
            f"the limit is {limits.REQUEST_MAX_BYTES} bytes"
        )
    return target, payload


def call(config: Config, machine: str, request: RemoteRequest, *, timeout_s: float | None = None) -> RemoteResponse:
    """Send one request to `machine` and return its validated reply (see `call_async`)."""
    return asyncio.run(call_async(config, machine, request, timeout_s=timeout_s))


async def call_async(
    config: Config,
    machine: str,
    request: RemoteRequest,
    *,
    timeout_s: float | None = None,
    channel: Channel | None = None,
) -> RemoteResponse:
    """Send one request and return the validated reply; `channel` defaults to the one the target names.

    The whole call (connect, send, reply) is bounded by `timeout_s`, default 10 minutes.
    """
    target, payload = prepare(config, machine, request)
    way = channel if channel is not None else channel_for(config, machine)
    # The peer's words (stderr, failures, a crash's excerpt) never show this machine's credentials.
    secrets = configured_secrets(config)
    return await ask_over(way, remote_tail(target), request, payload, timeout_s=timeout_s, secrets=secrets)


async def ask_over(
    way: Channel,
    tail: list[str],
    request: RemoteRequest,
    payload: bytes,
    *,
    timeout_s: float | None = None,
    secrets: Sequence[str] = (),
) -> RemoteResponse:
    """One call over a channel already chosen (a configured machine's, or a cluster node's: courier/executor/):
    run `tail` there with the request's bytes within the bound, then classify, find, decode and check the reply."""
    machine = way.machine
    bound_s = timeout_s if timeout_s is not None else limits.REMOTE_CALL_MAX_MS / limits.MS_PER_SECOND
    try:
        try:
            async with asyncio.timeout(bound_s):
                mark("call.send")  # the channel's part starts (docs/benchmarks.md#dispatch-latency)
                outcome = await way.run(tail, payload)
                mark("call.reply")
        except TimeoutError:
            about = f" about agent run {machine}:{request.agent_id}" if request.agent_id else ""
            raise CallTimedOut(
                f"{machine} ({way.where}) did not answer the {request.operation} request{about} within "
                f"{format_duration_ms(int(bound_s * limits.MS_PER_SECOND))}"
            ) from None
        response = interpret(machine, way.target, request, masked_outcome(outcome, secrets), way)
    except WbError as exc:
        mask_error(exc, secrets)
        raise
    return mask_response(response, secrets)


def interpret(
    machine: str, target: AnyTarget, request: RemoteRequest, outcome: Outcome, channel: Channel | None = None
) -> RemoteResponse:
    """Classify the remote command's outcome and return its reply, validated and stamped."""
    way = channel if channel is not None else direct_channel(machine, target)
    if outcome.overflow == "stdout":
        raise ReplyUntrusted(
            f"{machine}: the reply exceeds {limits.REPLY_STDOUT_MAX_BYTES} bytes; refused (the channel was closed)"
        )
    if outcome.overflow == "stderr":
        raise ReplyUntrusted(
            f"{machine}: the remote wrote more than {limits.REPLY_STDERR_MAX_BYTES} bytes on stderr; "
            "refused (the channel was closed)"
        )
    way.classify_exit(outcome)
    try:
        document = find_reply(outcome.stdout)
    except BadReply as exc:
        note = f"; stderr: {stderr_excerpt(outcome.stderr)}" if outcome.stderr.strip() else ""
        raise ReplyUntrusted(f"{machine}: the reply cannot be trusted: {exc}{note}") from None
    return decode_response(machine, request, document)
