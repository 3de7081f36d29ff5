"""`watch`: one long-poll per machine for `wb agent watch` (docs/protocol.md#watch)."""

from __future__ import annotations

from courier.ops.base import McpTool, Op
from courier.runs.context import Handler
from protocol import limits
from protocol.models import RemoteRequest
from protocol.operations import Operation
from protocol.rules import RequestRefused


def _check(request: RemoteRequest) -> None:
    if not 0 <= request.wait_timeout_ms <= limits.FOLLOW_WAIT_MAX_MS:
        raise RequestRefused(
            f"a watch call waits at most {limits.FOLLOW_WAIT_MAX_MS} ms ({limits.FOLLOW_WAIT_MAX_TEXT}); "
            "repeat the call with the reply's watch_cursor"
        )
    if len(request.watch_cursor) > limits.WATCH_CURSOR_MAX_BYTES:
        raise RequestRefused(f"watch_cursor is longer than {limits.WATCH_CURSOR_MAX_BYTES} bytes")


def _handler() -> Handler:
    from courier.runs.watch_op import watch_op

    return watch_op


OP = Op(
    wire=Operation("watch", "results", ("watch_cursor", "wait_timeout_ms"), check=_check, capability="watch"),
    handler=_handler,
    printed="event",
    mcp=McpTool(
        "The run transitions of this machine (or to, or all machines), as wb agent watch prints them: the first call "
        "returns one event per run not terminal (running, queued, waiting); pass its cursor to the next call to get "
        "the changes after it (dispatched, started, stalled, waiting, finished with the result; machine_error for a "
        "machine that did not answer). Each call waits at most wait_timeout (default 45s) and answers soon after the "
        "first event; idle true means no watched run is running.",
        "watch",
    ),
)
