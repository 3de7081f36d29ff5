"""`logs`: the last worker actions, the raw transcript, or (follow) the actions as they happen."""

from __future__ import annotations

from courier.ops.base import McpTool, Op
from courier.runs.context import Handler
from protocol import limits
from protocol.models import RemoteRequest
from protocol.operations import Operation
from protocol.rules import RequestRefused


def _check(request: RemoteRequest) -> None:
    if request.tail < 0:
        raise RequestRefused(f"tail must be >= 0 (0 means the default of {limits.LOGS_TAIL_DEFAULT})")
    if not 0 <= request.follow_from <= limits.BYTE_OFFSET_MAX:
        raise RequestRefused("follow_from must be a byte offset of events.jsonl, 0 <= n < 2^63")
    if request.wait_timeout_ms < 0:
        raise RequestRefused("wait_timeout_ms must be >= 0")
    if request.follow and request.wait_timeout_ms > limits.FOLLOW_WAIT_MAX_MS:
        raise RequestRefused(
            f"a follow call waits at most {limits.FOLLOW_WAIT_MAX_MS} ms ({limits.FOLLOW_WAIT_MAX_TEXT}); "
            "repeat the call from next_offset"
        )


def _handler() -> Handler:
    from courier.runs.service import logs_op

    return logs_op


OP = Op(
    wire=Operation(
        "logs",
        "logs",
        ("agent_id", "raw", "tail", "follow", "follow_from", "wait_timeout_ms"),
        needs_agent_id=True,
        check=_check,
    ),
    handler=_handler,
    printed="actions",
    mcp=McpTool("The transcript path, then the last worker actions (tail), or with raw the whole transcript.", "logs"),
)
