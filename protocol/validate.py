"""The one request validation path, used by the caller before connecting and by the receiver."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from protocol import limits
from protocol.models import OPERATIONS, WORKTREE_MODES, RemoteRequest
from protocol.refs import BadName, check_repository, check_run_id, check_worktree_name


class RequestRefused(ValueError):
    """A request that contract §5.2 refuses; the message says what and how to fix it."""


def describe_validation_error(error: ValidationError) -> str:
    parts = []
    for item in error.errors(include_url=False, include_context=False, include_input=False):
        where = ".".join(str(p) for p in item["loc"]) or "document"
        # The plain-text pattern itself is made of control characters: name the rule instead.
        message = (
            "contains control characters or is malformed" if item["type"] == "string_pattern_mismatch" else item["msg"]
        )
        parts.append(f"{where}: {message}")
    return "; ".join(parts[:5])


def decode_request(data: bytes) -> RemoteRequest:
    """Parse and validate one request document; every refusal is a RequestRefused."""
    if len(data) > limits.REQUEST_MAX_BYTES:
        raise RequestRefused(f"request exceeds {limits.REQUEST_MAX_BYTES} bytes")
    if not data.strip():
        raise RequestRefused("empty request: expected one JSON document on stdin")
    try:
        document: Any = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise RequestRefused(f"request is not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(document, dict):
        raise RequestRefused("request must be a JSON object")
    version = document.get("schema_version")
    if type(version) is not int:
        raise RequestRefused("request schema_version must be the integer 1")
    check_schema_version(version, peer="request")
    try:
        request = RemoteRequest.model_validate(document)
    except ValidationError as exc:
        raise RequestRefused(f"invalid request: {describe_validation_error(exc)}") from None
    validate_request(request)
    return request


def check_schema_version(version: int, *, peer: str) -> None:
    if version == limits.SCHEMA_VERSION:
        return
    direction = "newer" if version > limits.SCHEMA_VERSION else "older"
    raise RequestRefused(
        f"{peer} schema_version {version} is {direction} than this wb's {limits.SCHEMA_VERSION}; "
        f"upgrade wb on the {'receiving' if direction == 'newer' else 'sending'} machine"
    )


def validate_request(request: RemoteRequest) -> RemoteRequest:
    """Apply contract §5.2's rules; the receiver applies no CLI defaults."""
    try:
        _validate(request)
    except BadName as exc:
        raise RequestRefused(str(exc)) from None
    return request


def _validate(request: RemoteRequest) -> None:
    if request.schema_version != limits.SCHEMA_VERSION:
        check_schema_version(request.schema_version, peer="request")
    operation = request.operation
    if operation not in OPERATIONS:
        raise RequestRefused(f'unknown operation "{operation[:64]}": expected one of {", ".join(OPERATIONS)}')
    if operation == "dispatch":
        _validate_dispatch(request)
    elif operation in ("status", "await", "logs", "stop", "diff", "continue"):
        if not request.agent_id:
            raise RequestRefused(f"{operation} needs agent_id")
        check_run_id(request.agent_id)
    if operation in ("await", "logs") and request.wait_timeout_ms < 0:
        raise RequestRefused("wait_timeout_ms must be >= 0 (0 means no bound)")
    if operation == "logs":
        _validate_logs(request)
    elif operation == "continue":
        _validate_continue(request)
    elif operation == "prune" and request.older_than_ms < 0:
        raise RequestRefused("older_than_ms must be >= 0")


def _validate_logs(request: RemoteRequest) -> None:
    if request.tail < 0:
        raise RequestRefused("tail must be >= 0 (0 means the default of 8)")
    if request.follow_from < 0:
        raise RequestRefused("follow_from must be >= 0 (a byte offset of events.jsonl)")
    if request.follow and request.wait_timeout_ms > limits.AWAIT_CHUNK_MS:
        raise RequestRefused(f"a follow call waits at most {limits.AWAIT_CHUNK_MS} ms (5 min); repeat the call")


def _validate_continue(request: RemoteRequest) -> None:
    check_task(request.task)
    if request.profile and (not request.profile.isprintable() or len(request.profile) > 128):
        raise RequestRefused("profile must be a printable name of at most 128 characters")
    _check_timeout(request.timeout_ms)
    if request.new_agent_id:
        check_run_id(request.new_agent_id)


def _check_timeout(timeout_ms: int) -> None:
    if timeout_ms <= 0:
        raise RequestRefused("timeout_ms must be > 0")
    if timeout_ms > limits.TIMEOUT_MAX_MS:
        raise RequestRefused(f"timeout_ms must be at most {limits.TIMEOUT_MAX_MS} (168h)")


def _validate_dispatch(request: RemoteRequest) -> None:
    if request.mode not in WORKTREE_MODES:
        raise RequestRefused(f'dispatch mode must be "new" or "existing", not "{request.mode[:32]}"')
    if not request.worktree:
        raise RequestRefused("dispatch needs worktree")
    check_worktree_name(request.worktree)
    if not request.profile.strip():
        raise RequestRefused("dispatch needs profile")
    if not request.profile.isprintable() or len(request.profile) > 128:
        raise RequestRefused("profile must be a printable name of at most 128 characters")
    check_task(request.task)
    if request.mode == "new" and not request.repository:
        raise RequestRefused("dispatch with mode new needs repository (OWNER/REPO)")
    if request.repository:
        check_repository(request.repository)
    if request.branch:
        if request.mode != "new":
            raise RequestRefused("branch applies only to mode new (a new worktree)")
        check_ref_text(request.branch, "branch")
    if request.base:
        check_ref_text(request.base, "base")
    _check_timeout(request.timeout_ms)
    if request.agent_id:
        check_run_id(request.agent_id)


def check_task(task: str) -> None:
    if not task.strip():
        raise RequestRefused("task is blank: give the worker something to do")
    size = len(task.encode("utf-8", "surrogatepass"))
    if size > limits.TASK_MAX_BYTES:
        raise RequestRefused(f"task is {size} bytes; the limit is {limits.TASK_MAX_BYTES} bytes (1 MiB)")
    try:
        task.encode("utf-8")
    except UnicodeEncodeError:
        raise RequestRefused("task is not valid UTF-8") from None


def check_ref_text(value: str, what: str) -> None:
    """Shape checks before git sees the value; git itself has the final word on the target."""
    if value.startswith("-"):
        raise RequestRefused(f'{what} "{value[:64]}" must not start with "-"')
    if len(value) > 256 or not value.isprintable() or any(ch.isspace() for ch in value):
        raise RequestRefused(f"{what} must be at most 256 printable characters without spaces")
