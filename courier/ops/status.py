"""`status`: the facts of one run now."""

from __future__ import annotations

from courier.ops.base import McpTool, Op
from courier.runs.context import Handler
from protocol.operations import Operation


def _handler() -> Handler:
    from courier.runs.service import status_op

    return status_op


OP = Op(
    wire=Operation("status", "result", ("agent_id",), needs_agent_id=True),
    handler=_handler,
    printed="result",
    mcp=McpTool("The facts of one run now (state, exit code, final message, usage, changes).", "result"),
)
