"""Text rendering of results; every foreign string is sanitised on the way out."""

from __future__ import annotations

import json
from typing import Any

import pydantic_core

from courier.text import escape_json_unsafe, sanitize
from protocol.durations import format_duration_ms
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


def dispatch_line(result: Result) -> str:
    """`<ref> <state> <location> (<provider>/<model>)`; the location is the worktree name
    (docs/cli.md#wb-agent-dispatch)."""
    location = result.worktree
    if result.machine:
        location = f"{result.machine}:{location}"
    return f"{ref_of(result)} {_s(result.state)} {_s(location)} ({_s(model_label(result))})\n"


def model_label(result: Result) -> str:
    """`provider/model`, or the harness name for one without a provider (`command`)."""
    resolved = result.resolved
    if not resolved.provider and not resolved.model:
        return resolved.harness
    return f"{resolved.provider}/{resolved.model}"


def _local_minute(text: str) -> str:
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


def list_lines(results: list[Result]) -> str:
    if not results:
        return "no dispatched agent runs\n"
    rows = []
    for r in results:
        model = r.resolved.model or r.resolved.harness
        fields = [ref_of(r), state_text(r), r.profile, model, r.worktree, _local_minute(r.started_at)]
        rows.append("\t".join(_s(field) for field in fields))
    return "\n".join(rows) + "\n"


def _line(label: str, value: object) -> str:
    return f"{label + ':':<10}{value}\n"


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
        cost = f"${usage.cost_usd:.4f}" if usage and usage.cost_usd is not None else "$0.0000"
        parts.append(f"{cost} of ${budget.cost_usd:.4f}")
    return "; ".join(parts)


def status_text(result: Result, *, details: bool = False) -> str:
    r = result
    out = [_line("agent", ref_of(r))]
    state = _s(state_text(r))
    if r.state == "abandoned" and r.worker_alive:
        state += f" (its worker is still running: stop it with wb agent stop {ref_of(r)})"
    out.append(_line("state", state))
    out.append(_line("profile", _s(r.profile)))
    resolved = r.resolved.harness if model_label(r) == r.resolved.harness else f"{r.resolved.harness} {model_label(r)}"
    if r.resolved.reasoning:
        resolved += f" (reasoning {r.resolved.reasoning})"
    out.append(_line("resolved", _s(resolved)))
    where = r.worktree_dir or r.worktree
    out.append(_line("worktree", _s(f"{where} ({r.worktree_mode}, {r.repository})")))
    if r.branch:
        out.append(_line("branch", _s(r.branch)))
    if r.base or r.base_sha:
        base = " ".join(part for part in (r.base, f"({r.base_sha[:12]})" if r.base_sha else None) if part)
        out.append(_line("base", _s(base)))
    out.append(_line("started", _s(r.started_at)))
    if r.finished_at:
        out.append(_line("finished", _s(r.finished_at)))
    if r.duration_ms is not None:
        out.append(_line("duration", format_duration_ms(r.duration_ms)))
    processes = []
    if r.owner_pid:
        processes.append(f"owner {r.owner_pid} ({'alive' if r.owner_alive else 'gone'})")
    if r.worker_pid:
        processes.append(f"worker {r.worker_pid} ({'alive' if r.worker_alive else 'gone'})")
    if processes:
        out.append(_line("process", ", ".join(processes)))
    if r.node:
        out.append(_line("node", _s(r.node)))
    if r.exit_code is not None:
        out.append(_line("exit", r.exit_code))
    if r.failure:
        out.append(_line("failure", _s(r.failure)))
    if r.changes:
        c = r.changes
        parts = [f"{c.files_changed} file{'s' if c.files_changed != 1 else ''} changed"]
        if c.insertions is not None or c.deletions is not None:
            parts.append(f"+{c.insertions or 0} -{c.deletions or 0}")
        if c.commits:
            parts.append(f"{c.commits} commit{'s' if c.commits != 1 else ''}")
        if c.preexisting_changes:
            parts.append(f"{c.preexisting_changes} already dirty at dispatch")
        out.append(_line("changes", ", ".join(parts)))
    if r.usage:
        u = r.usage
        usage = f"input {u.input_tokens}"
        if u.cached_input_tokens:
            usage += f" (cached {u.cached_input_tokens})"
        usage += f", output {u.output_tokens}"
        if u.reasoning_output_tokens:
            usage += f" (reasoning {u.reasoning_output_tokens})"
        if u.cost_usd is not None:
            usage += f", cost ${u.cost_usd:.4f} (the harness's estimate)"
        out.append(_line("usage", usage))
    if r.budget:
        out.append(_line("budget", budget_text(r)))
    if r.state == "running" and r.waits and not r.worker_pid:
        wait = r.waits[-1]
        of = f" of {r.max_waits}" if r.max_waits else ""
        out.append(_line("waiting", _s(f"{wait.reason}; resuming at {wait.until} (wait {len(r.waits)}{of})")))
    if r.parent_id:
        out.append(_line("parent", format_reference(r.machine or "", r.parent_id)))
    if r.session_id:
        out.append(_line("session", _s(r.session_id)))
    if r.log_path:
        out.append(_line("log", _s(r.log_path)))
    if details:
        for name in (r.changes.files or []) if r.changes else []:
            out.append(_line("changed", _s(name)))
        if r.changes and r.changes.files_truncated:
            out.append(_line("changed", "… (more files not listed)"))
        if r.result:
            lines = sanitize(r.result, keep_newlines=True).splitlines() or [""]
            out.append(_line("result", lines[0]))
            out.extend(f"{'':10}{line}\n" for line in lines[1:])
    return "".join(out)
