"""`list`: the runs of one machine, newest first."""

from __future__ import annotations

from courier.ops.base import McpTool, Op
from courier.runs.context import Handler
from protocol.operations import Operation


def _handler() -> Handler:
    from courier.runs.service import list_op

    return list_op


OP = Op(
    wire=Operation("list", "results"),
    handler=_handler,
    printed="list",
    printed_all="fleet",
    mcp=McpTool(
        "The runs of this machine (or `to`), newest first; with all, of every configured machine too. Each row of "
        "`machines` says whether that machine answered fully (ok) and why not (error).",
        "fleet",
    ),
)
