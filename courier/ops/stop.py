"""`stop`: signal a running run's worker and record the run as stopped."""

from __future__ import annotations

from courier.ops.base import McpTool, Op
from courier.runs.context import Handler
from protocol.operations import Operation


def _handler() -> Handler:
    from courier.runs.service import stop_op

    return stop_op


OP = Op(
    wire=Operation("stop", "stop", ("agent_id",), needs_agent_id=True),
    handler=_handler,
    printed="stopped",
    mcp=McpTool(
        "Stop a running run: its worker is signalled and the run recorded as failed (stopped on request).",
        "stop",
        read_only=False,
    ),
)
