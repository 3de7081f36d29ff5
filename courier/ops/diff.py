"""`diff` (docs/cli.md#the-supervisors-loop): the run's change against its base."""

from __future__ import annotations

from typing import Any

from courier.ops.op import Arg, McpTool, NotOnANode, Op, ToolCall, ref_arg, to_arg
from protocol.models import DiffResult, RemoteRequest, RemoteResponse
from protocol.operations import Operation


def diff_request(reference: str, to: str | None, *, stat: bool) -> tuple[str, RemoteRequest]:
    """(machine, the diff request), or the CLI's usage error."""
    from courier.commands import target

    machine, run_id = target(reference, to)
    return machine, RemoteRequest.of("diff", agent_id=run_id, stat=stat)


def diff_of(response: RemoteResponse) -> DiffResult:
    """The reply's diff (this machine's, in-process, without the 2 MiB wire cap)."""
    return DiffResult.model_validate(response.result)


def patch_bytes(diff: DiffResult) -> bytes:
    """The patch exactly as git wrote it (a non-UTF-8 byte travels as a lone surrogate)."""
    return (diff.patch or "").encode("utf-8", "surrogateescape")


def stat_text(diff: DiffResult) -> str:
    from courier.text import sanitize

    lines = []
    for change in diff.files:
        note = " (binary)" if change.binary else ""
        lines.append(f"+{change.insertions} -{change.deletions} {sanitize(change.path)}{note}\n")
    count = len(diff.files)
    insertions = sum(change.insertions for change in diff.files)
    deletions = sum(change.deletions for change in diff.files)
    lines.append(f"{count} file{'s' if count != 1 else ''} changed, +{insertions} -{deletions}\n")
    return "".join(lines)


def diff_json(diff: DiffResult) -> str:
    from courier.render import to_json

    # A non-UTF-8 patch byte (kept as a lone \udcXX surrogate) is printed as that escape.
    return to_json(diff.to_wire())


async def diff_tool(call: ToolCall, args: Any) -> dict[str, Any]:
    from courier.errors import Finding
    from protocol.refs import format_reference

    machine, request = diff_request(args.ref, args.to, stat=args.stat)
    client = await call.client()
    diff = await call.blocking(lambda: diff_of(client.ask(machine, request)))
    if diff.patch is not None:
        try:
            diff.patch.encode("utf-8")
        except UnicodeEncodeError:  # a byte git wrote that is not UTF-8 travels as a lone surrogate
            ref = format_reference(machine, diff.agent_id)
            raise Finding(
                f"the patch of {ref} has bytes that are not UTF-8, which JSON cannot carry; "
                f"pass stat, or read it with: wb agent diff {ref}"
            ) from None
    return diff.to_wire()



def diff_before_start(request: RemoteRequest, response: RemoteResponse, run: NotOnANode) -> bool:
    """A run no node holds has no worktree to compare yet."""
    from courier.errors import Finding

    if run.phase == "lost":
        raise Finding(f"agent run {request.agent_id}: node {run.node} lost; its records are on that node")
    raise Finding(f"agent run {request.agent_id} has not started on a node yet ({run.phase}): no diff")


OP = Op(
    wire=Operation("diff", "diff", ("agent_id", "stat"), needs_agent_id=True, capability="diff"),
    handler="courier.runs.loop_ops:diff_op",
    cluster="forward",
    before_start=diff_before_start,
    printed="diff",
    mcp=McpTool(
        "The run's change against its base commit as one unified patch that git apply takes (with stat: only the "
        "per-file counts). Works while the run is running (a snapshot) and after it ends.",
        "diff",
        arguments=(ref_arg(), to_arg(), Arg("stat", bool, "Only the per-file counts, without the patch.", False)),
        handler=diff_tool,
    ),
)
