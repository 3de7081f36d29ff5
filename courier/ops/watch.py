"""`watch`: one long-poll per machine for `wb agent watch` (docs/protocol.md#watch)."""

from __future__ import annotations

from typing import Any

from courier.ops.op import Arg, McpTool, Op, ToolCall, to_arg
from protocol import limits
from protocol.durations import default_duration
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


async def watch_tool(call: ToolCall, args: Any) -> dict[str, Any]:
    from courier.commands import check_list_scope, target, wait_bound_ms

    check_list_scope(args.to, args.all)
    # Bounded like await, below the 60 s request timeout of common MCP clients.
    bound_ms = min(wait_bound_ms(args.wait_timeout) or limits.MCP_AWAIT_DEFAULT_MS, limits.MCP_AWAIT_MAX_MS)
    client = await call.client()
    machine, _ = target(None, args.to)
    machines = ["", *sorted(client.config.targets)] if args.all else [machine]
    return await call.blocking(lambda: client.watch_once(machines, args.cursor, bound_ms / limits.MS_PER_SECOND))



OP = Op(
    wire=Operation("watch", "results", ("watch_cursor", "wait_timeout_ms"), check=_check, capability="watch"),
    handler="courier.runs.watch_op:watch_op",
    cluster="head",
    printed="event",
    mcp=McpTool(
        "The run transitions of this machine (or to, or all machines), as wb agent watch prints them: the first call "
        "returns one event per run not terminal (running, queued, waiting); pass its cursor to the next call to get "
        "the changes after it (dispatched, started, stalled, waiting, finished with the result; machine_error for a "
        "machine that did not answer). Each call waits at most wait_timeout (default 45s, at most 50s) and answers "
        "soon after the first event; idle true means no watched run is running.",
        "watch",
        arguments=(
            to_arg(),
            Arg("all", bool, "This machine and every configured machine (not with to).", False),
            Arg("cursor", str | None, "The cursor of the previous watch call; none at first.", None),
            Arg(
                "wait_timeout",
                str,
                "Bound on the wait for an event, a Go duration (default 45s, at most 50s); it answers soon after the "
                "first.",
                default_duration(limits.MCP_AWAIT_DEFAULT_MS),
            ),
        ),
        handler=watch_tool,
    ),
)
