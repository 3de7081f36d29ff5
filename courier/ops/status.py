"""`status`: the facts of one run now."""

from __future__ import annotations

from typing import Any

from courier.ops.op import McpTool, NotOnANode, Op, ToolCall, ref_arg, to_arg
from protocol.models import RemoteRequest, RemoteResponse, Result, Sandbox
from protocol.operations import Operation


def status_request(reference: str | None, to: str | None) -> tuple[str, RemoteRequest]:
    """(machine, the status request) from a reference and --to, or the CLI's usage error."""
    from courier.commands import target

    machine, run_id = target(reference, to)
    return machine, RemoteRequest.of("status", agent_id=run_id)


def sandbox_text(sandbox: Sandbox) -> str:
    """`bwrap (network: provider only)`, `bwrap (network: all)`, `bwrap (network: a.com, b.org)`, `none (why)`."""
    if sandbox.kind != "bwrap":
        return f"none ({sandbox.reason or 'unknown'})"
    network = sandbox.network
    if network in (None, "provider"):
        shown = "provider only"
    else:
        shown = network if isinstance(network, str) else ", ".join(network)
    return f"bwrap (network: {shown})"


def status_text(result: Result, *, details: bool = False) -> str:
    """`wb agent status` (and with `details`, `wb agent await`): one labelled line per fact, foreign text sanitised."""
    from courier.render import budget_text, model_label, ref_of, state_text
    from courier.text import sanitize
    from protocol.durations import format_duration_ms
    from protocol.refs import format_reference

    def fact(label: str, value: object) -> str:
        return f"{label + ':':<10}{value}\n"

    def s(text: object) -> str:
        return sanitize(str(text))

    r = result
    out = [fact("agent", ref_of(r))]
    state = s(state_text(r))
    if r.state == "abandoned" and r.worker_alive:
        state += f" (its worker is still running: stop it with wb agent stop {ref_of(r)})"
    out.append(fact("state", state))
    out.append(fact("profile", s(r.profile)))
    resolved = r.resolved.harness if model_label(r) == r.resolved.harness else f"{r.resolved.harness} {model_label(r)}"
    if r.resolved.reasoning:
        resolved += f" (reasoning {r.resolved.reasoning})"
    out.append(fact("resolved", s(resolved)))
    if r.sandbox is not None:
        out.append(fact("sandbox", s(sandbox_text(r.sandbox))))
    where = r.worktree_dir or r.worktree
    out.append(fact("worktree", s(f"{where} ({r.worktree_mode}, {r.repository})")))
    if r.branch:
        out.append(fact("branch", s(r.branch)))
    if r.base or r.base_sha:
        # The ref that was named, with the commit it was; no ref named (the worktree's HEAD): the commit alone.
        short = r.base_sha[:12] if r.base_sha else None
        base = f"{r.base} ({short})" if r.base and short else (r.base or short)
        out.append(fact("base", s(base)))
    out.append(fact("started", s(r.started_at)))
    if r.finished_at:
        out.append(fact("finished", s(r.finished_at)))
    if r.duration_ms is not None:
        out.append(fact("duration", format_duration_ms(r.duration_ms)))
    processes = []
    if r.owner_pid:
        processes.append(f"owner {r.owner_pid} ({'alive' if r.owner_alive else 'gone'})")
    if r.worker_pid:
        processes.append(f"worker {r.worker_pid} ({'alive' if r.worker_alive else 'gone'})")
    if processes:
        out.append(fact("process", ", ".join(processes)))
    if r.node:
        out.append(fact("node", s(r.node)))
    if r.exit_code is not None:
        out.append(fact("exit", r.exit_code))
    if r.failure:
        out.append(fact("failure", s(r.failure)))
    if r.changes:
        c = r.changes
        parts = [f"{c.files_changed} file{'s' if c.files_changed != 1 else ''} changed"]
        if c.insertions is not None or c.deletions is not None:
            parts.append(f"+{c.insertions or 0} -{c.deletions or 0}")
        if c.commits:
            parts.append(f"{c.commits} commit{'s' if c.commits != 1 else ''}")
        if c.preexisting_changes:
            parts.append(f"{c.preexisting_changes} already dirty at dispatch")
        out.append(fact("changes", ", ".join(parts)))
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
        elif r.budget and r.budget.cost_usd is not None:
            usage += ", cost: unknown"  # never $0.0000 (docs/cli.md#budgets)
        out.append(fact("usage", usage))
    if r.budget:
        out.append(fact("budget", budget_text(r)))
    if r.state == "running" and r.waits and not r.worker_pid:
        wait = r.waits[-1]
        of = f" of {r.max_waits}" if r.max_waits else ""
        out.append(fact("waiting", s(f"{wait.reason}; resuming at {wait.until} (wait {len(r.waits)}{of})")))
    if r.parent_id:
        out.append(fact("parent", format_reference(r.machine or "", r.parent_id)))
    if r.session_id:
        out.append(fact("session", s(r.session_id)))
    if r.log_path:
        out.append(fact("log", s(r.log_path)))
    if details:
        for name in (r.changes.files or []) if r.changes else []:
            out.append(fact("changed", s(name)))
        if r.changes and r.changes.files_truncated:
            out.append(fact("changed", "… (more files not listed)"))
        if r.result:
            lines = sanitize(r.result, keep_newlines=True).splitlines() or [""]
            out.append(fact("result", lines[0]))
            out.extend(f"{'':10}{line}\n" for line in lines[1:])
    return "".join(out)


async def status_tool(call: ToolCall, args: Any) -> dict[str, Any]:
    machine, request = status_request(args.ref, args.to)
    client = await call.client()
    result = await call.blocking(lambda: client.ask(machine, request).result_of())
    return result.to_wire()



def status_before_start(request: RemoteRequest, response: RemoteResponse, run: NotOnANode) -> bool:
    """What the executor knows of a run no node holds: queued, ended before it started, its node lost."""
    response.set_result(run.result)
    return True


OP = Op(
    wire=Operation("status", "result", ("agent_id",), needs_agent_id=True),
    handler="courier.runs.service:status_op",
    cluster="forward",
    before_start=status_before_start,
    printed="result",
    mcp=McpTool(
        "The facts of one run now (state, exit code, final message, usage, changes).",
        "result",
        arguments=(ref_arg(), to_arg()),
        handler=status_tool,
    ),
)
