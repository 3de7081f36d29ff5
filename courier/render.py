"""The pieces of text rendering that several operations share; every foreign string is sanitised on the way out.

What one operation prints is its module's (courier/ops/: `status_text`, `list_lines`, `dispatch_line` ...).
"""

from __future__ import annotations

import json
from typing import Any

import pydantic_core

from courier.text import escape_json_unsafe, sanitize
from protocol.models import Result
from protocol.refs import format_reference
from protocol.timestamps import epoch_seconds, parse_rfc3339, utc_now


def ref_of(result: Result) -> str:
    return format_reference(result.machine or "", result.agent_id)


def json_text(document: Any, *, indent: int | None = 2, exclude_none: bool = False) -> str:
    """The one JSON printer: every JSON document wb prints (CLI `--json`, MCP text) comes from here.

    pydantic-core's encoder (fast on 10,000 results; models, dicts and lists alike), then the
    characters text output sanitises escaped as `\\uXXXX` (docs/cli.md, "Formats"). A document
    holding a lone surrogate (a non-UTF-8 patch byte kept as `\\udcXX`) takes the standard
    library's encoder, whose raw surrogate the escaping then writes as that escape.
    """
    try:
        encoded = pydantic_core.to_json(document, indent=indent, exclude_none=exclude_none).decode()
    except pydantic_core.PydanticSerializationError:
        plain = pydantic_core.to_jsonable_python(document, exclude_none=exclude_none)
        separators = (",", ": ") if indent is not None else (",", ":")
        encoded = json.dumps(plain, indent=indent, ensure_ascii=False, separators=separators)
    return escape_json_unsafe(encoded)


def to_json(document: Any, *, exclude_none: bool = False) -> str:
    """2-space indented JSON with a trailing newline (docs/cli.md, "Formats")."""
    return json_text(document, exclude_none=exclude_none) + "\n"


def results_json(results: list[Result]) -> str:
    """A list of results as JSON, absent fields omitted, without a dict per result in between."""
    return to_json(results, exclude_none=True)


def _s(text: object) -> str:
    return sanitize(str(text))


def sort_results(results: list[Result]) -> list[Result]:
    """Newest first; ties by machine (local first) then run ID (docs/cli.md, wb agent list)."""
    return sorted(results, key=lambda r: (-_started_key(r.started_at), r.machine or "", r.agent_id))


def _started_key(text: str) -> float:
    return epoch_seconds(text)


def model_label(result: Result) -> str:
    """`provider/model`, or the harness name for one without a provider (`command`)."""
    resolved = result.resolved
    if not resolved.provider and not resolved.model:
        return resolved.harness
    return f"{resolved.provider}/{resolved.model}"


def local_minute(text: str) -> str:
    """An RFC 3339 stamp as this machine's local `YYYY-MM-DD HH:MM`; an unreadable one as it is, sanitised."""
    try:
        moment = parse_rfc3339(text)
    except ValueError:
        return _s(text)
    return moment.astimezone().strftime("%Y-%m-%d %H:%M")


def is_stalled(result: Result) -> bool:
    return result.state == "running" and result.stalled_since is not None


def silence(seconds: float) -> str:
    """docs/cli.md#stalled-runs: whole minutes from 1m, whole seconds below."""
    seconds = max(0, int(seconds))
    return f"{seconds // 60}m" if seconds >= 60 else f"{seconds}s"


def state_text(result: Result) -> str:
    """The state as text: `running (stalled 14m)` for a stalled run (time since its last output)."""
    if result.state == "queued" and result.queued_for:  # docs/ray.md: what it waits for
        return f"queued (waiting for {result.queued_for})"
    if not is_stalled(result) or not result.last_output_at:
        return result.state
    try:
        last = parse_rfc3339(result.last_output_at)
    except ValueError:
        return f"{result.state} (stalled)"
    return f"{result.state} (stalled {silence((utc_now() - last).total_seconds())})"


def budget_text(result: Result) -> str:
    """`3,210 of 10,000 tokens` (and/or `$0.0123 of $0.5000`): the run's usage against its bounds
    (docs/cli.md#budgets)."""
    budget, usage = result.budget, result.usage
    assert budget is not None
    parts = []
    if budget.tokens is not None:
        used = usage.input_tokens + usage.output_tokens if usage else 0
        parts.append(f"{used:,} of {budget.tokens:,} tokens")
    if budget.cost_usd is not None:
        # An unknown cost is never shown as $0.0000 (docs/cli.md#budgets).
        cost = f"${usage.cost_usd:.4f}" if usage and usage.cost_usd is not None else "cost: unknown"
        parts.append(f"{cost} of ${budget.cost_usd:.4f}")
    return "; ".join(parts)
