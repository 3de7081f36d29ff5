"""`await`: wait until a run is terminal (or the bound passes)."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from courier.ops.op import Arg, McpTool, Op, ToolCall, ref_arg, to_arg
from protocol import limits
from protocol.durations import default_duration
from protocol.models import RemoteRequest, Result
from protocol.operations import Operation
from protocol.rules import RequestRefused

if TYPE_CHECKING:
    from courier.errors import Finding

# How often a waiting MCP `await` reports progress (docs/mcp.md: at least every 10 s).
AWAIT_PROGRESS_MS = 5_000
# How often a waiting MCP `await` asks for the run's status: soon at first, then backing off.
AWAIT_POLL_FIRST_S = 0.2
AWAIT_POLL_MAX_S = 2.0


def _check(request: RemoteRequest) -> None:
    if request.wait_timeout_ms < 0:
        raise RequestRefused("wait_timeout_ms must be >= 0 (0 means no bound)")


def await_target(reference: str, to: str | None, wait_timeout: str) -> tuple[str, str, int]:
    """(machine, run ID, the wait bound in ms) from the reference, --to and --wait-timeout."""
    from courier.commands import target, wait_bound_ms

    machine, run_id = target(reference, to)
    return machine, run_id, wait_bound_ms(wait_timeout)


def await_text(result: Result) -> str:
    """The awaited run's facts, with its changed files and final message."""
    from courier.ops.status import status_text

    return status_text(result, details=True)


def await_remedy(ref: str) -> str:
    """What a transport failure during the wait says: the run goes on, await it again."""
    return f"the run is not affected; await it again with: wb agent await {ref}"


def still_running(ref: str) -> Finding:
    from courier.errors import Finding

    return Finding(f"agent run {ref} is still running after the wait bound; it has not finished")


def progress_interval_ms() -> int:
    """AWAIT_PROGRESS_MS; a smaller interval can be set for tests."""
    override = os.environ.get("WB_MCP_PROGRESS_MS", "")
    if override.isdigit() and 0 < int(override) <= AWAIT_PROGRESS_MS:
        return int(override)
    return AWAIT_PROGRESS_MS


async def await_tool(call: ToolCall, args: Any) -> dict[str, Any]:
    """Poll the run's status until it is terminal or the bound passes; past it, the run as observed.

    Each poll is one quick status call in the tools' pool; between polls the call holds no thread.
    Progress goes out from a task of its own, so a slow poll never delays it.
    """
    import anyio

    from courier.commands import naming
    from protocol.refs import format_reference

    machine, run_id, bound_ms = await_target(args.ref, args.to, args.wait_timeout)
    # An MCP client gives up on a request after 60 s: `0` (no bound) or a longer wait is taken as the cap.
    bound_ms = min(bound_ms or limits.MCP_AWAIT_MAX_MS, limits.MCP_AWAIT_MAX_MS)
    ref = format_reference(machine, run_id)
    reach = await call.reach()
    request = RemoteRequest.of("status", agent_id=run_id)
    began = time.monotonic()
    deadline = began + bound_ms / limits.MS_PER_SECOND
    observed = ["running"]

    async def report_progress() -> None:
        while True:
            await anyio.sleep(progress_interval_ms() / limits.MS_PER_SECOND)
            waited = time.monotonic() - began
            await call.progress(
                round(waited, 1),
                bound_ms / limits.MS_PER_SECOND,
                f"{ref} is {observed[0]}; waited {int(waited)}s",
            )

    async def poll() -> Result:
        pause = AWAIT_POLL_FIRST_S
        while True:
            with naming(await_remedy(ref)):
                result = await call.blocking(lambda: reach.ask(machine, request).result_of())
            observed[0] = result.state
            now = time.monotonic()
            if result.terminal or now >= deadline:
                return result
            await anyio.sleep(min(pause, deadline - now))
            pause = min(pause * 2, AWAIT_POLL_MAX_S)

    failure: Exception | None = None
    async with anyio.create_task_group() as group:
        group.start_soon(report_progress)
        try:
            result = await poll()
        except Exception as exc:  # raised below as itself, not wrapped in the task group's ExceptionGroup
            failure = exc
        group.cancel_scope.cancel()
    if failure is not None:
        raise failure
    return result.to_wire()



OP = Op(
    wire=Operation("await", "result", ("agent_id", "wait_timeout_ms"), needs_agent_id=True, check=_check),
    handler="courier.runs.service:await_op",
    cluster="head",
    printed="result",
    mcp=McpTool(
        "Wait until the run is terminal and return its result (any terminal state is a success). Waits at most "
        "wait_timeout (default 45s, at most 50s: 0 or a longer value is taken as 50s, below the 60 s request timeout "
        "of common MCP clients), reporting progress every few seconds; past it, returns the result as observed "
        "(terminal false, not an error): call await again to keep waiting. Cancelling the call leaves the run going.",
        "result",
        arguments=(
            ref_arg(),
            to_arg(),
            Arg(
                "wait_timeout",
                str,
                "Bound on the wait, a Go duration (default 45s, below the usual 60 s MCP request timeout); at most "
                "50s: 0 or a longer value is taken as 50s. Past it: the run's result as observed (terminal false); "
                "call await again.",
                default_duration(limits.MCP_AWAIT_DEFAULT_MS),
            ),
        ),
        handler=await_tool,
    ),
)
