"""Ask one machine one question (contract §5.5): validate, send over SSH, bound, decode, classify.

`call` is the synchronous entry for one command; `call_async` is the same call for a
fan-out (it keeps no global state, so many may run at once, each with its own bound, or
share one `ssh.Connection` per host). In-band refusals (`failure`) are returned, not
raised: the caller maps `failure_kind` to its exit code. Everything else that goes wrong
is a TransportError (exit 255) whose `cause` classifies it for fleet views.
"""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Awaitable, Callable
from typing import Any, assert_never

from pydantic import ValidationError

import courier.ops  # noqa: F401  the operation registry installs the wire table the checks below read
from courier.config import Config, Target
from courier.errors import (
    CallTimedOut,
    RemoteWbMissing,
    ReplyUntrusted,
    SchemaSkew,
    TransportError,
    UsageError,
)
from courier.remote import pool, ssh
from courier.remote.reply import BadReply, find_reply
from courier.text import clip_bytes, sanitize
from protocol import limits
from protocol.durations import format_duration_ms
from protocol.entry import REMOTE_ARGUMENT
from protocol.models import (
    DiffResult,
    ListWarning,
    PruneResult,
    RemoteRequest,
    RemoteResponse,
    Result,
    StopResult,
    collector_paused,
)
from protocol.operations import TABLE, Reply
from protocol.validate import RequestRefused, describe_validation_error, validate_request

_RESULT_OPERATIONS = ("dispatch", "status", "await")

# What carries one call's bytes when it is not a new connection of this process: the warm
# courier (contract §16) passes its pooled, re-verified connection here. Everything before
# (validation) and after (bounds, decoding, classification) is the same code as cold.
Carrier = Callable[[Config, ssh.Endpoint, str, bytes, str], Awaitable[ssh.Outcome]]
_SHORT_TEXT_MAX = 256


def remote_command(target: Target) -> str:
    """Exactly `<wb_path or wb> --wb-internal-agent-remote`; no request byte ever reaches this argv."""
    return f"{shlex.quote(target.wb_path or 'wb')} {REMOTE_ARGUMENT}"


def endpoint_of(machine: str, target: Target) -> ssh.Endpoint:
    return ssh.Endpoint(machine=machine, host=target.host, user=target.user, port=target.port)


async def open_connection(config: Config, machine: str) -> ssh.Connection:
    """One authenticated connection to `machine` for several `call_async(..., connection=...)`; close it after."""
    return await ssh.connect(endpoint_of(machine, config.target(machine)))


def prepare(config: Config, machine: str, request: RemoteRequest) -> tuple[Target, bytes]:
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
    connection: ssh.Connection | None = None,
    carrier: Carrier | None = None,
) -> RemoteResponse:
    """Send one request and return the validated reply; `connection` reuses an open one to that machine.

    The whole call (connect, send, reply) is bounded by `timeout_s`, default 10 minutes.
    """
    target, payload = prepare(config, machine, request)
    bound_s = timeout_s if timeout_s is not None else limits.REMOTE_CALL_MAX_MS / limits.MS_PER_SECOND
    command = remote_command(target)
    try:
        async with asyncio.timeout(bound_s):
            shared = pool.active()
            if connection is not None:
                outcome = await connection.run(command, payload)
            elif carrier is not None:
                outcome = await carrier(config, endpoint_of(machine, target), command, payload, request.operation)
            elif shared is not None:
                outcome = await shared.run(endpoint_of(machine, target), command, payload)
            else:
                async with await ssh.connect(endpoint_of(machine, target)) as opened:
                    outcome = await opened.run(command, payload)
    except TimeoutError:
        where = f"{target.host}:{target.port}" if target.port else target.host
        raise CallTimedOut(
            f"{machine} ({where}) did not answer the {request.operation} request within "
            f"{format_duration_ms(int(bound_s * limits.MS_PER_SECOND))}"
        ) from None
    return interpret(machine, target, request, outcome)


def stderr_excerpt(stderr: bytes) -> str:
    """One sanitised line of at most 1024 bytes: the end of stderr, where the error usually is."""
    text = " ".join(sanitize(stderr.decode("utf-8", "replace")).split())
    if not text:
        return "(nothing on stderr)"
    limit = limits.REMOTE_STDERR_EXCERPT_MAX_BYTES
    raw = text.encode()
    if len(raw) <= limit:
        return text
    marker = "…"
    tail = raw[len(raw) - (limit - len(marker.encode())) :].decode("utf-8", "ignore")
    return clip_bytes(marker + tail, limit)


def interpret(machine: str, target: Target, request: RemoteRequest, outcome: ssh.Outcome) -> RemoteResponse:
    """Classify the remote command's outcome and return its reply, validated and stamped."""
    if outcome.overflow == "stdout":
        raise ReplyUntrusted(
            f"{machine}: the reply exceeds {limits.REPLY_STDOUT_MAX_BYTES} bytes; refused (the channel was closed)"
        )
    if outcome.overflow == "stderr":
        raise ReplyUntrusted(
            f"{machine}: the remote wrote more than {limits.REPLY_STDERR_MAX_BYTES} bytes on stderr; "
            "refused (the channel was closed)"
        )
    wb = target.wb_path or "wb"
    if outcome.exit_status == 127:
        raise RemoteWbMissing(
            f"wb is not installed on {machine} (or not on the PATH of a non-interactive shell); "
            f"set session_move.targets.{machine}.ssh.wb_path"
        )
    if outcome.exit_status == 126:
        raise TransportError(
            f"{machine}: {wb} is not executable there (exit 126); "
            f"fix its permissions or set session_move.targets.{machine}.ssh.wb_path",
            cause="wb not executable",
        )
    if outcome.exit_signal is not None:
        raise TransportError(
            f"{machine}: the remote {wb} was killed by signal {sanitize(outcome.exit_signal)[:32]}: "
            f"{stderr_excerpt(outcome.stderr)}",
            cause="remote crashed",
        )
    if outcome.exit_status != 0:
        raise TransportError(
            f"{machine}: the remote {wb} exited with status {outcome.exit_status}: {stderr_excerpt(outcome.stderr)}",
            cause="remote crashed",
        )
    try:
        document = find_reply(outcome.stdout)
    except BadReply as exc:
        note = f"; stderr: {stderr_excerpt(outcome.stderr)}" if outcome.stderr.strip() else ""
        raise ReplyUntrusted(f"{machine}: the reply cannot be trusted: {exc}{note}") from None
    return decode_response(machine, request, document)


def decode_response(machine: str, request: RemoteRequest, document: dict[str, Any]) -> RemoteResponse:
    """Schema, operation and result checks on one decoded reply document; results get `machine`."""
    version = document["schema_version"]
    if version != limits.SCHEMA_VERSION:
        remedy = f"upgrade wb on {machine}" if version < limits.SCHEMA_VERSION else "upgrade wb here"
        shown = version if abs(version) < 10**6 else "(out of range)"
        raise SchemaSkew(f"{machine} speaks protocol schema {shown}, this wb speaks {limits.SCHEMA_VERSION}: {remedy}")
    _check_counts(machine, request.operation, document)
    try:
        response = RemoteResponse.model_validate(document)
    except ValidationError as exc:
        raise ReplyUntrusted(
            f"{machine}: the reply does not fit protocol schema 1: {describe_validation_error(exc)}"
        ) from None
    if response.operation != request.operation:
        if response.operation == "" and response.failure:
            return response  # the peer could not parse the request: a refusal, not a mismatch
        raise ReplyUntrusted(
            f'{machine}: answered operation "{sanitize(response.operation)[:64]}" to a {request.operation} request'
        )
    _check_envelope(machine, response)
    if response.failure:
        response.clear_results()
        return response
    asked = request.new_agent_id if request.operation == "continue" else request.agent_id
    _check_results(machine, request.operation, response, asked)
    return response


def _check_counts(machine: str, operation: str, document: dict[str, Any]) -> None:
    """Before any model is built: no more results or warnings than a real list reply can carry."""
    for name in ("results", "warnings"):
        items = document.get(name)
        if isinstance(items, list) and len(items) > limits.REPLY_RESULTS_MAX:
            raise ReplyUntrusted(
                f"{machine}: the {operation} reply carries {len(items)} {name}; "
                f"more than {limits.REPLY_RESULTS_MAX} cannot be a real answer, refused"
            )


def _check_unique(machine: str, results: list[Result], warnings: list[ListWarning]) -> None:
    """One machine lists each run once: a repeated agent ID (in results or warnings) is a hostile reply."""
    seen: set[str] = set()
    for agent_id in [result.agent_id for result in results] + [warning.agent_id for warning in warnings]:
        if agent_id in seen:
            raise ReplyUntrusted(
                f"{machine}: the list reply names agent run {sanitize(agent_id)[:64]} more than once; refused"
            )
        seen.add(agent_id)


def _check_envelope(machine: str, response: RemoteResponse) -> None:
    for name in ("home_id", "wb_version", "failure_kind"):
        value = getattr(response, name)
        if value is not None and (len(value) > _SHORT_TEXT_MAX or not value.isprintable()):
            raise ReplyUntrusted(f"{machine}: the reply's {name} is not a short printable string")


def _check_results(machine: str, operation: str, response: RemoteResponse, asked: str = "") -> None:
    """Validate what the reply carries, once, and keep it typed; results get `machine`.

    `asked` is the run the request names ("" when it names none): a result about another run
    is as untrusted as a wrong operation echo.
    """
    reply: Reply = TABLE[operation].reply if operation in TABLE else "none"
    try:
        # One case per reply kind of the table: a new kind that is not handled here fails mypy.
        match reply:
            case "result":
                if response.result is None:
                    raise ReplyUntrusted(f"{machine}: the {operation} reply carries no result")
                response.set_result(_stamped(response.result, machine, asked, operation))
            case "stop":
                if response.result is None:
                    raise ReplyUntrusted(f"{machine}: the stop reply carries no result")
                body = dict(response.result)
                body.pop("machine", None)
                stopped = StopResult.model_validate(body)
                _check_subject(machine, operation, asked, stopped.agent_id)
                stopped.machine = machine
                response.set_result(stopped)
            case "logs":
                if response.result is not None:  # a follow reply: the run's
                    response.set_result(_stamped(response.result, machine, asked, operation))
            case "diff":
                if response.result is None:
                    raise ReplyUntrusted(f"{machine}: the diff reply carries no result")
                diff = DiffResult.model_validate(response.result)
                _check_subject(machine, operation, asked, diff.agent_id)
                diff.machine = machine
                response.result = diff.to_wire()
            case "prune":
                response.result = PruneResult.model_validate(response.result or {}).to_wire()
            case "results":
                with collector_paused():
                    results = [_stamped(item, machine) for item in response.results or []]
                _check_unique(machine, results, response.warnings or [])
                response.set_results(results)
                response.result = None
            case "none":
                response.result = None
            case _:
                assert_never(reply)
    except ValidationError as exc:
        raise ReplyUntrusted(
            f"{machine}: the {operation} reply carries a result that fails validation: {describe_validation_error(exc)}"
        ) from None


def _stamped(item: dict[str, Any], machine: str, asked: str = "", operation: str = "") -> Result:
    body = dict(item)
    body.pop("machine", None)  # the receiver never sets it; this side decides which machine answered
    result = Result.model_validate(body)
    _check_subject(machine, operation, asked, result.agent_id)
    result.machine = machine
    return result


def _check_subject(machine: str, operation: str, asked: str, named: str) -> None:
    if asked and named != asked:
        raise ReplyUntrusted(
            f"{machine}: the {operation} reply is about agent run {sanitize(named)[:64]}, not {asked}; refused"
        )
