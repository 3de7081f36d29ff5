"""The one request validation path, used by the caller before connecting and by the receiver."""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import ValidationError

from protocol import limits
from protocol.models import RemoteRequest
from protocol.operations import operation
from protocol.refs import BadName, check_run_ref
from protocol.rules import RequestRefused

__all__ = ["RequestRefused", "check_schema_version", "decode_request", "describe_validation_error", "validate_request"]


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
    check_unicode(document)
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


_SURROGATE = re.compile("[\ud800-\udfff]")


def check_unicode(document: dict[str, Any]) -> None:
    """JSON may spell a lone surrogate (`"\\ud800"`), which no UTF-8 text can hold: refuse the field."""
    for key in RemoteRequest.model_fields:
        value = document.get(key)
        if isinstance(value, str) and _SURROGATE.search(value):
            raise RequestRefused(f"{key} is not valid Unicode text (it contains a lone surrogate)")


def check_schema_version(version: int, *, peer: str) -> None:
    if version == limits.SCHEMA_VERSION:
        return
    direction = "newer" if version > limits.SCHEMA_VERSION else "older"
    raise RequestRefused(
        f"{peer} schema_version {version} is {direction} than this wb's {limits.SCHEMA_VERSION}; "
        f"upgrade wb on the {'receiving' if direction == 'newer' else 'sending'} machine"
    )


def validate_request(request: RemoteRequest) -> RemoteRequest:
    """Apply docs/protocol.md#the-request from the operation table; the receiver applies no CLI defaults."""
    try:
        if request.schema_version != limits.SCHEMA_VERSION:
            check_schema_version(request.schema_version, peer="request")
        entry = operation(request.operation)
        if entry.needs_agent_id:
            if not request.agent_id:
                raise RequestRefused(f"{entry.name} needs agent_id")
            check_run_ref(request.agent_id)  # a prefix is resolved by the receiver (courier/runs/prefixes.py)
        if entry.check is not None:
            entry.check(request)
    except BadName as exc:
        raise RequestRefused(str(exc)) from None
    return request
