"""Handlers of the supervisor's loop (docs/cli.md#the-supervisors-loop): diff, logs --follow, continue, prune on this
machine."""

from __future__ import annotations

from courier.errors import Finding
from courier.runs.context import Context, store_for
from courier.runs.store import Store
from protocol import limits
from protocol.models import DiffFile, DiffResult, RemoteRequest, RemoteResponse


def diff_result(store: Store, agent_id: str, *, stat: bool, wire_cap: bool) -> DiffResult:
    """The run's diff (docs/cli.md, wb agent diff); over the wire a patch over 2 MiB is refused, not cut."""
    from courier.runs.patch import compute_diff

    record = store.load(agent_id)
    if not record.worktree_dir:
        raise Finding(f"agent run {agent_id} has no worktree recorded; there is no change to show")
    diff = compute_diff(record.worktree_dir, record.base_sha, with_patch=not stat)
    if wire_cap and len(diff.patch) > limits.DIFF_PATCH_WIRE_MAX_BYTES:
        raise Finding(
            f"patch for {agent_id} is {len(diff.patch)} bytes; use --stat, "
            f"or fetch it on that machine with wb agent diff {agent_id}"
        )
    return DiffResult(
        agent_id=agent_id,
        base_sha=diff.base_sha,
        head_sha=diff.head_sha,
        files=[
            DiffFile(
                path=change.path,
                status=change.status,
                insertions=change.insertions,
                deletions=change.deletions,
                binary=change.binary,
            )
            for change in diff.files
        ],
        patch=None if stat else diff.patch.decode("utf-8", "surrogateescape"),
    )


def diff_op(request: RemoteRequest, response: RemoteResponse, context: Context) -> None:
    # The 2 MiB cap is for the wire: asked in-process (the CLI on this machine), there is none.
    cap = not context.in_process
    response.result = diff_result(store_for(context), request.agent_id, stat=request.stat, wire_cap=cap).to_wire()


def follow_op(request: RemoteRequest, response: RemoteResponse, context: Context) -> None:
    from courier.runs.follow import follow_once

    wait_ms = min(request.wait_timeout_ms or limits.FOLLOW_WAIT_MAX_MS, limits.FOLLOW_WAIT_MAX_MS)
    store = store_for(context)
    actions, next_offset, result, times = follow_once(
        store, request.agent_id, request.follow_from, wait_ms, context.client_gone
    )
    response.logs = "".join(f"  {action}\n" for action in actions)
    response.next_offset = next_offset
    response.action_times = times if actions else None
    response.result = result.to_wire()


def continue_op(request: RemoteRequest, response: RemoteResponse, context: Context) -> None:
    from courier.runs.context import configured_config
    from courier.runs.resume import continue_run

    config = context.config or configured_config()
    response.result = continue_run(config, request, fresh_login=context.fresh_login).to_wire()


def prune_op(request: RemoteRequest, response: RemoteResponse, context: Context) -> None:
    from courier.runs.pruning import prune

    projects_root = None
    if request.worktrees:  # only then is wb.yaml needed (agents.projects_root)
        from courier.runs.context import configured_config

        projects_root = (context.config or configured_config()).projects_root
    done = prune(store_for(context), request.older_than_ms, dry_run=request.dry_run, projects_root=projects_root)
    response.result = {
        "dry_run": request.dry_run,
        "removed": [entry.to_wire() for entry in done.removed],
        "kept_live": done.kept_live,
    }
    if request.worktrees:
        response.result["worktrees"] = [entry.to_wire() for entry in done.worktrees]
