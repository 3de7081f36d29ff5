"""`list`: the runs of one machine, newest first."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from courier.ops.op import Arg, McpTool, Op, ToolCall, to_arg
from protocol import limits
from protocol.durations import default_duration
from protocol.models import RemoteRequest, RemoteResponse, Result
from protocol.operations import Operation


def list_request() -> RemoteRequest:
    return RemoteRequest.of("list")


def listed(response: RemoteResponse, *, stalled_only: bool) -> list[Result]:
    """The reply's runs newest first (docs/cli.md, wb agent list); with --stalled only the stalled ones."""
    from courier.render import is_stalled, sort_results

    results = sort_results(response.results_of())
    return [result for result in results if is_stalled(result)] if stalled_only else results


def list_lines(results: list[Result]) -> str:
    """One tab-separated row per run (reference, state, profile, model, worktree, local start minute)."""
    from courier.render import local_minute, ref_of, state_text
    from courier.text import sanitize

    if not results:
        return "no dispatched agent runs\n"
    rows = []
    for r in results:
        model = r.resolved.model or r.resolved.harness
        fields = [ref_of(r), state_text(r), r.profile, model, r.worktree, local_minute(r.started_at)]
        rows.append("\t".join(sanitize(str(field)) for field in fields))
    return "\n".join(rows) + "\n"


async def list_tool(call: ToolCall, args: Any) -> dict[str, Any]:
    from courier.commands import check_list_scope, machine_timeout_s, target

    check_list_scope(args.to, args.all)
    client = await call.client()
    if args.all:
        timeout_s = machine_timeout_s(args.machine_timeout)
        return await call.blocking(lambda: client.fleet_document(timeout_s, stalled_only=args.stalled))
    machine, _ = target(None, args.to)
    return await call.blocking(lambda: _list_one(client.ask, machine, args.stalled))


def _list_one(ask: Callable[[str, RemoteRequest], RemoteResponse], machine: str, stalled_only: bool) -> dict[str, Any]:
    """One machine's runs in the fleet document's shape: its single row says whether it answered fully."""
    import time

    from protocol.documents import FleetDocument, FleetMachine
    from protocol.models import collector_paused
    from protocol.refs import format_reference

    began = time.monotonic()
    with collector_paused():
        response = ask(machine, list_request())
        results = listed(response, stalled_only=False)
    warnings = response.warnings or []
    runs = len(results)
    if stalled_only:
        from courier.render import is_stalled

        results = [result for result in results if is_stalled(result)]
    row = FleetMachine(
        machine=machine,
        ok=not warnings,
        runs=runs,
        error="; ".join(f"{format_reference(machine, w.agent_id)}: {w.error}" for w in warnings) or None,
        elapsed_ms=int((time.monotonic() - began) * limits.MS_PER_SECOND),
    )
    return FleetDocument(results=results, machines=[row]).to_json()



OP = Op(
    wire=Operation("list", "results"),
    handler="courier.runs.service:list_op",
    cluster="fan_out",
    printed="list",
    printed_all="fleet",
    mcp=McpTool(
        "The runs of this machine (or `to`), newest first; with all, of every configured machine too. Each row of "
        "`machines` says whether that machine answered fully (ok) and why not (error).",
        "fleet",
        arguments=(
            to_arg(),
            Arg("all", bool, "This machine and every configured machine (not with to).", False),
            Arg("stalled", bool, "Only running runs whose harness went silent (stalled).", False),
            Arg(
                "machine_timeout",
                str,
                "Per-machine deadline with all.",
                default_duration(limits.MACHINE_TIMEOUT_DEFAULT_MS),
            ),
        ),
        handler=list_tool,
    ),
)
