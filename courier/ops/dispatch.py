"""`dispatch`: start one task in a worktree."""

from __future__ import annotations

from typing import Any, BinaryIO

from courier.ops.op import Arg, McpTool, Op, ToolCall
from protocol import limits
from protocol.durations import default_duration
from protocol.models import WORKTREE_MODES, RemoteRequest, Result
from protocol.operations import Operation
from protocol.refs import check_repository, check_run_id, check_worktree_name, new_run_id
from protocol.rules import RequestRefused, check_budget, check_ref_text, check_task, check_timeout_ms


def _check(request: RemoteRequest) -> None:
    check_budget(request.max_tokens, request.max_cost_usd)
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

    With `--to auto[:LABEL]` the machine is "" here: placement (courier/client/placement.py) chooses it.
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


def dispatch_line(result: Result) -> str:
    """`<ref> <state> <location> (<provider>/<model>)`; the location is the worktree name
    (docs/cli.md#wb-agent-dispatch). `continue` prints the same line for its new run."""
    from courier.render import model_label, ref_of
    from courier.text import sanitize

    location = result.worktree
    if result.machine:
        location = f"{result.machine}:{location}"
    return f"{ref_of(result)} {sanitize(result.state)} {sanitize(location)} ({sanitize(model_label(result))})\n"


async def dispatch_tool(call: ToolCall, args: Any) -> dict[str, Any]:
    machine, request = build_dispatch(
        new_worktree=args.new_worktree,
        use_worktree=args.use_worktree,
        profile=args.profile,
        task=args.task,
        task_file=None,
        repo=args.repo,
        branch=args.branch,
        base=args.base,
        to=args.to,
        timeout=args.timeout,
    )
    client = await call.client()
    bound_s = limits.PLACEMENT_TIMEOUT_DEFAULT_MS / limits.MS_PER_SECOND  # to: auto asks the candidates this long
    result = await call.blocking(lambda: client.dispatch(args.to, machine, request, bound_s))
    return result.to_wire()



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
    handler="courier.runs.service:dispatch_op",
    cluster="place",
    fresh_environment=True,
    printed="result",
    mcp=McpTool(
        "Start one task in a git worktree (new or existing) with a configured profile, here or on a configured "
        "machine (to). Returns the run's result at once (state running): its agent_id, and machine when it runs "
        'elsewhere; pass "MACHINE:agent_id" (or agent_id alone for this machine) as ref to await, status, diff.',
        "result",
        read_only=False,
        arguments=(
            Arg(
                "task",
                str,
                f"The task for the worker, at most {limits.TASK_MAX_TEXT}, not blank. Never printed back.",
            ),
            Arg("profile", str, "A profile from agents.profiles in wb.yaml."),
            Arg("new_worktree", str | None, "Create this worktree (exactly one of the two).", None),
            Arg("use_worktree", str | None, "Use this existing worktree (exactly one of the two).", None),
            Arg(
                "repo",
                str | None,
                "OWNER/REPO; default: the origin of the server's working directory (new only).",
                None,
            ),
            Arg("branch", str | None, "Branch for a new worktree (default wb/NAME).", None),
            Arg("base", str | None, "Commit to start from.", None),
            Arg(
                "to",
                str | None,
                'Start it on this configured machine (as --to); "auto" or "auto:LABEL": on the configured '
                "machine (with that label) with the most free slots; default: this machine.",
                None,
            ),
            Arg(
                "timeout",
                str,
                f"Bound on the run, a Go duration (30m, 2h); at most {limits.TIMEOUT_MAX_TEXT}.",
                default_duration(limits.TIMEOUT_DEFAULT_MS),
            ),
        ),
        handler=dispatch_tool,
    ),
)
