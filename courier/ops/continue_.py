"""`continue` (docs/cli.md, wb agent continue): a new run in the same worktree resuming a finished run's session."""

from __future__ import annotations

from typing import Any, BinaryIO

from courier.ops.op import Arg, McpTool, Op, ToolCall, ref_arg, to_arg
from protocol import limits
from protocol.durations import default_duration
from protocol.models import RemoteRequest
from protocol.operations import Operation
from protocol.refs import check_run_id, new_run_id
from protocol.rules import RequestRefused, check_budget, check_task, check_timeout_ms


def _check(request: RemoteRequest) -> None:
    check_budget(request.max_tokens, request.max_cost_usd)
    check_task(request.task)
    if request.profile and (not request.profile.isprintable() or len(request.profile) > limits.PROFILE_NAME_MAX_CHARS):
        raise RequestRefused(f"profile must be a printable name of at most {limits.PROFILE_NAME_MAX_CHARS} characters")
    check_timeout_ms(request.timeout_ms)
    if request.new_agent_id:
        check_run_id(request.new_agent_id)


def build_continue(
    *,
    reference: str,
    task: str | None,
    task_file: str | None,
    profile: str | None,
    timeout: str,
    to: str | None,
    stdin: BinaryIO | None = None,
    max_tokens: int | None = None,
    max_cost_usd: float | None = None,
) -> tuple[str, RemoteRequest, str]:
    """(machine, continue request, the new run's minted ID), or the CLI's usage error."""
    from courier.commands import budget_flags, read_task, request, target, timeout_ms

    bound = timeout_ms(timeout)
    budget = budget_flags(max_tokens, max_cost_usd)
    machine, run_id = target(reference, to)
    text = read_task(task, task_file, stdin)
    new_id = new_run_id()
    return (
        machine,
        request(
            "continue",
            agent_id=run_id,
            task=text,
            profile=profile or "",
            timeout_ms=bound,
            new_agent_id=new_id,
            **budget,
        ),
        new_id,
    )


async def continue_tool(call: ToolCall, args: Any) -> dict[str, Any]:
    machine, request, new_id = build_continue(
        reference=args.ref, task=args.task, task_file=None, profile=args.profile, timeout=args.timeout, to=args.to
    )
    client = await call.client()
    result = await call.blocking(lambda: client.start(machine, request, new_id))
    return result.to_wire()



OP = Op(
    wire=Operation(
        "continue",
        "result",
        ("agent_id", "task", "profile", "timeout_ms", "new_agent_id"),
        needs_agent_id=True,
        check=_check,
        capability="continue",
    ),
    handler="courier.runs.loop_ops:continue_op",
    cluster="place",
    fresh_environment=True,
    printed="result",
    mcp=McpTool(
        "Start a new run in the same worktree that resumes a finished run's harness session with a follow-up task. "
        "Returns the new run's result (its parent_id is the run continued).",
        "result",
        read_only=False,
        arguments=(
            ref_arg(),
            to_arg(),
            Arg("task", str, f"The follow-up task, at most {limits.TASK_MAX_TEXT}, not blank."),
            Arg("profile", str | None, "Default: the profile of the run continued.", None),
            Arg(
                "timeout",
                str,
                f"Bound on the new run, a Go duration; at most {limits.TIMEOUT_MAX_TEXT}.",
                default_duration(limits.TIMEOUT_DEFAULT_MS),
            ),
        ),
        handler=continue_tool,
    ),
)
