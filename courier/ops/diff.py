"""`diff` (docs/cli.md#the-supervisors-loop): the run's change against its base."""

from __future__ import annotations

from courier.ops.base import McpTool, Op
from courier.runs.context import Handler
from protocol.models import DiffResult, RemoteRequest
from protocol.operations import Operation


def diff_request(agent_id: str, *, stat: bool) -> RemoteRequest:
    return RemoteRequest.of("diff", agent_id=agent_id, stat=stat)


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


def _handler() -> Handler:
    from courier.runs.loop_ops import diff_op

    return diff_op


OP = Op(
    wire=Operation("diff", "diff", ("agent_id", "stat"), needs_agent_id=True, capability="diff"),
    handler=_handler,
    printed="diff",
    mcp=McpTool(
        "The run's change against its base commit as one unified patch that git apply takes (with stat: only the "
        "per-file counts). Works while the run is running (a snapshot) and after it ends.",
        "diff",
    ),
)
