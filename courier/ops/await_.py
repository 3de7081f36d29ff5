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
    from courier.errors import CallTimedOut, Finding

# How often a waiting MCP `await` reports progress (docs/mcp.md: at least every 10 s).
AWAIT_PROGRESS_MS = 5_000
# How often a waiting MCP `await` looks at the run: soon at first, then backing off (the first and the longest pause).
AWAIT_POLL_PAUSES_S = (0.2, 2.0)


def await_chunk_ms() -> int:
    """At most 5 min per remote await call; a smaller chunk can be set for tests."""
    override = os.environ.get("WB_AWAIT_CHUNK_MS", "")
    if override.isdigit() and 0 < int(override) <= limits.AWAIT_CHUNK_MS:
        return int(override)
    return limits.AWAIT_CHUNK_MS


class AwaitLoop:
    """The one await loop's rules (docs/cli.md, wb agent await), driven by `await_result` (blocking) or by a
    caller that must not hold a thread while it waits (the MCP `await` tool, courier/ops/await_.py).

    Each step is one `await` call of at most a chunk (5 min, or `chunk_ms`), so no remote poller
    outlives a dead client; its own bound is the chunk plus a small slack (connect and reply), so
    the whole wait ends by the user's bound plus that slack even when the peer never answers. A
    peer that answers `running` without waiting is asked again after growing pauses (`pauses`:
    the first and the longest), not at once. The bound counts from `started_at`. With `holding`
    false every call answers at once (a look, not a wait) and the pauses always grow: the caller
    waits between calls without a thread.
    """

    def __init__(
        self,
        machine: str,
        agent_id: str,
        wait_timeout_ms: int,
        *,
        started_at: float | None = None,
        chunk_ms: int | None = None,
        pauses: tuple[float, float] = (limits.AWAIT_REASK_FIRST_S, limits.AWAIT_REASK_MAX_S),
        holding: bool = True,
    ) -> None:
        self.machine, self.agent_id, self.wait_timeout_ms = machine, agent_id, wait_timeout_ms
        started = time.monotonic() if started_at is None else started_at
        self.deadline = started + wait_timeout_ms / limits.MS_PER_SECOND if wait_timeout_ms > 0 else None
        self.chunk_ms = min(chunk_ms, await_chunk_ms()) if chunk_ms else await_chunk_ms()
        if not holding:
            self.chunk_ms = 1  # the receiver looks once and answers
        self.pauses, self.holding = pauses, holding
        self.last: Result | None = None
        self._pause_s = 0.0
        self._this_chunk = self.chunk_ms
        self._asked_at = 0.0

    def step(self) -> tuple[RemoteRequest, float]:
        """The next call: its request and its own time bound (seconds)."""
        self._this_chunk = self.chunk_ms
        if self.deadline is not None:
            left_ms = int((self.deadline - time.monotonic()) * limits.MS_PER_SECOND)
            self._this_chunk = max(1, min(self.chunk_ms, left_ms))
        self._asked_at = time.monotonic()
        request = RemoteRequest.of("await", agent_id=self.agent_id, wait_timeout_ms=self._this_chunk)
        slack_s = limits.AWAIT_CALL_SLACK_MS / limits.MS_PER_SECOND
        return request, self._this_chunk / limits.MS_PER_SECOND + slack_s

    def answered(self, result: Result) -> float | None:
        """None when the wait is over (`last` is the answer); else the pause before the next step."""
        self.last = result
        if result.terminal or (self.deadline is not None and time.monotonic() >= self.deadline):
            return None
        chunk_s = self._this_chunk / limits.MS_PER_SECOND
        if self.holding and time.monotonic() - self._asked_at >= chunk_s / 2:
            self._pause_s = 0.0  # the peer waited the chunk out: ask again at once
        else:
            first, longest = self.pauses
            self._pause_s = min(longest, max(first, self._pause_s * 2))
        if self.deadline is None:
            return self._pause_s
        return max(0.0, min(self._pause_s, self.deadline - time.monotonic()))

    def timed_out(self, silent: CallTimedOut) -> Result:
        """A step's call timed out: past the user's bound, the last observation (or why there is none)."""
        if self.deadline is None or time.monotonic() < self.deadline:
            raise silent  # silent for a whole chunk and its slack, long before the user's bound
        if self.last is not None:
            return self.last  # the bound passed while the peer was silent: report what it said last
        from courier.errors import CallTimedOut
        from protocol.durations import format_duration_ms
        from protocol.refs import format_reference

        raise CallTimedOut(
            f"{self.machine} did not answer the await of {format_reference(self.machine, self.agent_id)} within "
            f"the wait bound ({format_duration_ms(self.wait_timeout_ms)}, plus "
            f"{format_duration_ms(limits.AWAIT_CALL_SLACK_MS)} to connect and reply)"
        )


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
    """The one await loop (courier/client/asking.py `AwaitLoop`), driven without holding a thread: each
    look is one quick call in the tools' pool, the pauses in between (0.2 s, growing to 2 s) hold none.
    Progress goes out from a task of its own, so a slow look never delays it."""
    import functools

    import anyio

    from courier.commands import naming
    from courier.errors import CallTimedOut
    from protocol.refs import format_reference

    machine, run_id, bound_ms = await_target(args.ref, args.to, args.wait_timeout)
    # An MCP client gives up on a request after 60 s: `0` (no bound) or a longer wait is taken as the cap.
    bound_ms = min(bound_ms or limits.MCP_AWAIT_MAX_MS, limits.MCP_AWAIT_MAX_MS)
    ref = format_reference(machine, run_id)
    client = await call.client()
    began = time.monotonic()
    loop = AwaitLoop(machine, run_id, bound_ms, started_at=began, pauses=AWAIT_POLL_PAUSES_S, holding=False)
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

    def look(request: RemoteRequest, bound_s: float) -> Result:
        return client.ask(machine, request, timeout_s=bound_s).result_of()

    async def wait() -> Result:
        while True:
            request, bound_s = loop.step()
            try:
                with naming(await_remedy(ref)):
                    result = await call.blocking(functools.partial(look, request, bound_s))
            except CallTimedOut as exc:
                return loop.timed_out(exc)
            observed[0] = result.state
            pause_s = loop.answered(result)
            if pause_s is None:
                return result
            await anyio.sleep(pause_s)

    failure: Exception | None = None
    async with anyio.create_task_group() as group:
        group.start_soon(report_progress)
        try:
            result = await wait()
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
