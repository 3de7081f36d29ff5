"""Continue a finished run's harness session with a follow-up task (docs/cli.md, wb agent continue).

The new run works in the parent's worktree, against the parent's base (so its `changes`
and `diff` show the whole work), starts with a copy of the parent's harness home (where
the harness keeps its session files) and resumes the parent's session ID. Everything else
is a normal run: its own record, owner, timeout and stop.
"""

from __future__ import annotations

import os
import shutil

from courier.config import Config
from courier.errors import Finding, NotStartable, UsageError
from courier.runs import holders, process
from courier.runs.admission import (
    busy_run,
    deferred_signals,
    resolve_profile,
    settle_terms,
    start_owner,
)
from courier.runs.admission_locks import worktree_lock
from courier.runs.changes import count_dirty
from courier.runs.private_tree import copy_private_tree
from courier.runs.store import HARNESS_HOME, Record, Store, render
from protocol.models import RemoteRequest, Result
from protocol.refs import format_reference, new_run_id


def _can_resume(harness: str) -> bool:
    from courier.runs.harness import UnknownHarness, spec_for

    try:
        return spec_for(harness).can_resume
    except UnknownHarness:
        return False


def check_continuable(store: Store, parent: Record) -> None:
    """Refuse (exit 1) a parent that is still running, has no session, or whose harness cannot resume."""
    ref = format_reference("", parent.agent_id)
    if parent.state == "running":
        result = render(parent, store)
        if not result.terminal or process.same_process(parent.worker_pid, parent.worker_token):
            raise Finding(f"agent run {ref} is still running; await or stop it before continuing it")
    if not _can_resume(parent.resolved.harness):
        raise Finding(
            f"agent run {ref} ran the {parent.resolved.harness} harness, which has no session to continue; "
            "dispatch a new run with --use-worktree instead"
        )
    if not parent.session_id:
        raise Finding(
            f"agent run {ref} recorded no session ID (its harness never started a session); "
            "dispatch a new run with --use-worktree instead"
        )
    if not parent.worktree_dir or not os.path.isdir(parent.worktree_dir):
        raise Finding(f"the worktree of agent run {ref}, {parent.worktree_dir}, is gone; it cannot be continued")


def continue_run(config: Config, request: RemoteRequest, *, fresh_login: bool = True) -> Result:
    store = Store(config.home).ensure()
    agent_id = request.new_agent_id or new_run_id()
    if store.exists(agent_id):
        return render(store.load(agent_id), store)
    parent = store.load(request.agent_id)
    check_continuable(store, parent)
    profile_name = request.profile or parent.profile
    harness = resolve_profile(config, profile_name)[0].harness
    if harness != parent.resolved.harness:
        raise UsageError(
            f"profile {profile_name} runs the {harness} harness, but {request.agent_id} holds a "
            f"{parent.resolved.harness} session; pick a {parent.resolved.harness} profile"
        )
    resolved, terms = settle_terms(config, profile_name, request, fresh_login)
    assert parent.worktree_dir is not None
    with deferred_signals():  # from the record to its owner: a Ctrl-C waits, nothing is left half-made
        with worktree_lock(store, parent.repository, parent.worktree):
            if store.exists(agent_id):
                return render(store.load(agent_id), store)
            check_continuable(store, store.load(parent.agent_id))
            holder = busy_run(store, parent.repository, parent.worktree)
            if holder:
                raise NotStartable(
                    f"worktree {parent.worktree} of {parent.repository} is in use by run {holder}; "
                    "await or stop it first"
                )
            holders.hold(store, parent.repository, parent.worktree, agent_id)
            record = Record(
                agent_id=agent_id,
                state="running",
                profile=profile_name,
                resolved=resolved,
                repository=parent.repository,
                worktree_mode="existing",
                worktree=parent.worktree,
                worktree_dir=parent.worktree_dir,
                branch=parent.branch,
                base=parent.base,
                base_sha=parent.base_sha,
                preexisting_changes=count_dirty(parent.worktree_dir),
                timeout_ms=request.timeout_ms,
                parent_id=parent.agent_id,
                resume_session_id=parent.session_id,
                **terms,
            )
            try:
                run_dir = store.create(record, request.task)
            except FileExistsError:
                return render(store.load(agent_id), store)
            try:
                copy_private_tree(store.run_dir(parent.agent_id) / HARNESS_HOME, run_dir / HARNESS_HOME)
            except (OSError, shutil.Error) as exc:
                from courier.runs.owner import finish

                reason = f"could not copy the harness home of {parent.agent_id}: {exc}"
                finish(store, record, "failed", reason)
                raise NotStartable(f"agent run {agent_id} {reason}") from None
        # Out of the worktree's lock: the record holds the worktree from here (other dispatches see it).
        start_owner(run_dir, request.task)
    return render(record, store)
