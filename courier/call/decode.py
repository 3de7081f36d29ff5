"""Decode and check one reply document through the operation table (docs/protocol.md#the-callers-rules).

The caller (`courier.call.caller`) finds the document on the channel's stdout; everything
here is about the document itself: schema version, counts before any model is built, the
envelope, the operation echoed, and each result validated once and stamped with the
machine that answered. Any doubt is a ReplyUntrusted (exit 255).
"""

from __future__ import annotations

from typing import Any, assert_never

from pydantic import ValidationError

import courier.ops  # noqa: F401  the operation registry installs the wire table the checks below read
from courier.errors import ReplyUntrusted, SchemaSkew
from courier.text import sanitize
from protocol import limits
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
from protocol.refs import is_run_prefix
from protocol.validate import describe_validation_error

_SHORT_TEXT_MAX = 256


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
    # A short reference is answered about the one run it names, whose ID it begins (docs/cli.md#short-references).
    if asked and named != asked and not (is_run_prefix(asked) and named.startswith(asked)):
        raise ReplyUntrusted(
            f"{machine}: the {operation} reply is about agent run {sanitize(named)[:64]}, not {asked}; refused"
        )
