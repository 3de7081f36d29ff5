"""`await`: wait until a run is terminal (or the bound passes)."""

from __future__ import annotations

from courier.ops.base import McpTool, Op
from courier.runs.context import Handler
from protocol.models import RemoteRequest
from protocol.operations import Operation
from protocol.rules import RequestRefused


def _check(request: RemoteRequest) -> None:
    if request.wait_timeout_ms < 0:
        raise RequestRefused("wait_timeout_ms must be >= 0 (0 means no bound)")


def _handler() -> Handler:
    from courier.runs.service import await_op

    return await_op


OP = Op(
    wire=Operation("await", "result", ("agent_id", "wait_timeout_ms"), needs_agent_id=True, check=_check),
    handler=_handler,
    printed="result",
    mcp=McpTool(
        "Wait until the run is terminal and return its result (any terminal state is a success). Waits at most "
        "wait_timeout (default 45s), reporting progress every few seconds; past it, returns the result as observed "
        "(terminal false, not an error): call await again to keep waiting. Cancelling the call leaves the run going.",
        "result",
    ),
)
