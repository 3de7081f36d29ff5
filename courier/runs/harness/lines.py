"""One line of a harness's event stream: decoding it, and the bounded, sanitised text taken from it.

Below both the parser interface (`base.py`, which reads lines as they arrive) and the
stored-transcript reader (`transcript.py`, which reads them backwards), so neither imports
the other for these.
"""

from __future__ import annotations

import json
from typing import Any

from courier.text import clip_bytes, sanitize
from protocol import limits

DIAGNOSTIC_MAX_BYTES = limits.LOG_ACTION_MAX_BYTES
# A line the owner itself adds to a confined run's transcript when its proxy refuses a host
# (docs/security.md#confined-runs): the worker action `network refused: HOST`, whatever the harness.
NETWORK_REFUSED = "wb.network_refused"
MALFORMED_EXCERPT_CHARS = 120


def clean(text: str, limit: int = DIAGNOSTIC_MAX_BYTES) -> str:
    """Sanitised, valid UTF-8 (JSON may decode lone surrogates) and at most `limit` bytes."""
    return clip_bytes(sanitize(text.encode("utf-8", "replace").decode()), limit)


def decode_line(line: bytes) -> tuple[str, Any, bool]:
    """(text, value, ok): ok is False when the line is not a JSON object."""
    text = line.decode("utf-8", "replace").rstrip("\r\n")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return text, None, False
    return text, value, isinstance(value, dict)


def malformed_excerpt(text: str) -> str:
    return sanitize(text[:MALFORMED_EXCERPT_CHARS])


def action_lines(line: bytes | None) -> tuple[dict[str, Any] | None, list[str] | None]:
    """(event, actions) for one stored line: a malformed or oversize line is its own diagnostic action.

    Returns (event, None) for a well-formed event, whose actions the harness decides; (None, [])
    for a blank line. `line` is None for a line over the line bound.
    """
    if line is None:
        return None, [f"diagnostic: event line over {limits.EVENT_LINE_MAX_BYTES} bytes"]
    if not line or line.isspace():
        return None, []
    text, event, ok = decode_line(line)
    if not ok:
        return None, [f"diagnostic: malformed event line: {malformed_excerpt(text)}"]
    refused = network_refused(event)
    if refused is not None:
        return None, [refused]
    return event, None


def network_refused(event: Any) -> str | None:
    """`network refused: HOST` for the owner's own line, else None."""
    if isinstance(event, dict) and event.get("type") == NETWORK_REFUSED and isinstance(event.get("host"), str):
        return f"network refused: {clean(event['host'], 300)}"
    return None
