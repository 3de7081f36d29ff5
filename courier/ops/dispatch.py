"""`dispatch`: start one task in a worktree."""

from __future__ import annotations

from typing import BinaryIO

from courier.ops.base import McpTool, Op
from courier.runs.context import Handler
from protocol import limits
from protocol.models import WORKTREE_MODES, RemoteRequest
from protocol.operations import Operation
from protocol.refs import check_repository, check_run_id, check_worktree_name, new_run_id
from protocol.rules import RequestRefused, check_ref_text, check_task, check_timeout_ms


def _check(request: RemoteRequest) -> None:
    if request.mode not in WORKTREE_MODES:
        raise RequestRefused(f'dispatch mode must be "new" or "existing", not "{request.mode[:32]}"')
    if not request.worktree:
        raise RequestRefused("dispatch needs worktree")
    check_worktree_name(request.worktree)
    if not request.profile.strip():
        raise RequestRefused("dispatch needs profile")
    if not request.profile.isprintable() or len(request.profile) > limits.PROFILE_NAME_MAX_CHARS:
        raise RequestRefused(f"profile must be a printable name of at most {limits.PROFILE_NAME_MAX_CHARS} characters")
    check_task(request.task)
    if request.mode == "new" and not request.repository:
        raise RequestRefused("dispatch with mode new needs repository (OWNER/REPO)")
    if request.repository:
        check_repository(request.repository)
    if request.branch:
        if request.mode != "new":
            raise RequestRefused("branch applies only to mode new (a new worktree)")
        check_ref_text(request.branch, "branch")
    if request.base:
        check_ref_text(request.base, "base")
    check_timeout_ms(request.timeout_ms)
    if request.agent_id:
        check_run_id(request.agent_id)
    if request.max_running < 0:
        raise RequestRefused("max_running must be >= 0 (0 means no bound)")


def build_dispatch(
    *,
    new_worktree: str | None,
    use_worktree: str | None,
    profile: str | None,
    task: str | None,
    task_file: str | None,
    repo: str | None,
    branch: str | None,
    base: str | None,
    to: str | None,
    timeout: str,
    stdin: BinaryIO | None = None,
    max_tokens: int | None = None,
    max_cost_usd: float | None = None,
) -> tuple[str, RemoteRequest]:
    """(machine, dispatch request with a freshly minted run ID), or the CLI's usage error.

    With `--to auto[:LABEL]` the machine is "" here: placement (courier/starting.py) chooses it.
    """
    from courier.commands import budget_flags, is_auto, label_of, read_task, repository, request, target, timeout_ms
    from courier.errors import UsageError

    if (new_worktree is None) == (use_worktree is None):
        raise UsageError("pass exactly one of --new-worktree NAME and --use-worktree NAME")
    if profile is None:
        raise UsageError("pass --profile NAME (a profile from agents.profiles in wb.yaml)")
    if use_worktree is not None and branch is not None:
        raise UsageError("--branch applies only to --new-worktree")
    bound = timeout_ms(timeout)
    budget = budget_flags(max_tokens, max_cost_usd)
    if is_auto(to):
        assert to is not None
        label_of(to)  # a malformed label is refused before the task is read
        machine = ""
    else:
        machine, _ = target(None, to)
    text = read_task(task, task_file, stdin)
    mode = "new" if new_worktree is not None else "existing"
    return machine, request(
        "dispatch",
        mode=mode,
        worktree=new_worktree or use_worktree or "",
        profile=profile,
        task=text,
        repository=repository(repo) if mode == "new" else (repo or ""),
        branch=branch or "",
        base=base or "",
        timeout_ms=bound,
        agent_id=new_run_id(),
        **budget,
    )


def _handler() -> Handler:
    from courier.runs.service import dispatch_op

    return dispatch_op


OP = Op(
    wire=Operation(
        "dispatch",
        "result",
        (
            "mode",
            "worktree",
            "profile",
            "task",
            "repository",
            "branch",
            "base",
            "timeout_ms",
            "agent_id",
            "max_running",
        ),
        check=_check,
    ),
    handler=_handler,
    printed="result",
    mcp=McpTool(
        "Start one task in a git worktree (new or existing) with a configured profile, here or on a configured "
        "machine (to). Returns the run's result at once (state running): its agent_id, and machine when it runs "
        'elsewhere; pass "MACHINE:agent_id" (or agent_id alone for this machine) as ref to await, status, diff.',
        "result",
        read_only=False,
    ),
)
