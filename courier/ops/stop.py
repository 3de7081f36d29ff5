"""`stop`: signal a running run's worker and record the run as stopped."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from courier.ops.op import McpTool, NotOnANode, Op, ToolCall, ref_arg, to_arg
from protocol.models import RemoteRequest, RemoteResponse, StopResult
from protocol.operations import Operation

if TYPE_CHECKING:
    from protocol.documents import StopDocument


def stop_request(reference: str, to: str | None) -> tuple[str, RemoteRequest]:
    """(machine, the stop request), or the CLI's usage error."""
    from courier.commands import target

    machine, run_id = target(reference, to)
    return machine, RemoteRequest.of("stop", agent_id=run_id)


def stop_remedy(ref: str) -> str:
    """What a transport failure after sending says: the stop may have happened."""
    return f"the stop may have reached the run; check it with: wb agent status {ref}"


def stop_message(machine: str, stopped: StopResult) -> str:
    """What `stop` says happened (docs/cli.md); a reply whose state is terminal signalled nothing."""
    from courier.text import sanitize
    from protocol.refs import format_reference

    ref = format_reference(machine, stopped.agent_id)
    if stopped.state == "queued":  # a Ray head's run that no node had started (docs/ray.md#stop-of-a-queued-run)
        return f"{ref}: stopped before it started"
    if stopped.state != "running":
        return f"{ref}: its worker is already gone; recorded as {sanitize(stopped.state)}"
    if stopped.worker_pid:
        return f"stopping {ref} worker process {stopped.worker_pid}"
    return f"stopping {ref} before its worker started"


def stop_document(machine: str, stopped: StopResult) -> StopDocument:
    """`stop --json` (docs/supervisors.md#the-documents): the same words as the text."""
    from protocol.documents import StopDocument

    return StopDocument(
        agent_id=stopped.agent_id,
        machine=machine or None,
        message=stop_message(machine, stopped),
        state=stopped.state,
    )


async def stop_tool(call: ToolCall, args: Any) -> dict[str, Any]:
    from courier.commands import naming
    from protocol.refs import format_reference

    machine, request = stop_request(args.ref, args.to)
    client = await call.client()
    with naming(stop_remedy(format_reference(machine, request.agent_id))):
        response = await call.blocking(lambda: client.ask(machine, request))
    return response.stop_result_of().to_wire()  # `machine` is stamped for a remote run



def stop_before_start(request: RemoteRequest, response: RemoteResponse, run: NotOnANode) -> bool:
    """A queued run is stopped before it starts (`state` queued: docs/protocol.md); one that has just
    started is stopped on its node (False)."""
    from courier.errors import Finding

    if run.phase == "lost":
        raise Finding(f"agent run {request.agent_id}: node {run.node} lost; nothing to stop")
    if run.phase == "ended":
        raise Finding(f"agent run {request.agent_id} is already failed ({run.result.failure})")
    if not run.cancel():
        return False
    # `state` is the run's state when the stop was asked, as for a running run: `queued` tells
    # the caller it never started (`<ref>: stopped before it started`).
    response.set_result(StopResult(agent_id=request.agent_id, worker_pid=0, state="queued"))
    return True


OP = Op(
    wire=Operation("stop", "stop", ("agent_id",), needs_agent_id=True),
    handler="courier.runs.service:stop_op",
    cluster="forward",
    before_start=stop_before_start,
    printed="stopped",
    mcp=McpTool(
        "Stop a running run: its worker is signalled and the run recorded as failed (stopped on request).",
        "stop",
        read_only=False,
        arguments=(ref_arg(), to_arg()),
        handler=stop_tool,
    ),
)
