"""`diff` (contract §15): the run's change against its base."""

from __future__ import annotations

from courier.ops.base import McpTool, Op
from courier.runs.context import Handler
from protocol.operations import Operation


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
