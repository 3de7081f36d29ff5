"""The run operations on this machine, filling a RemoteResponse (called through operations.perform)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from courier.errors import Finding, WbError
from courier.runs import process
from courier.runs.store import EVENTS, Store, render, within_admission_grace
from protocol import limits
from protocol.models import (
    DiffFile,
    DiffResult,
    ListWarning,
    RemoteRequest,
    RemoteResponse,
    Result,
    StopResult,
    collector_paused,
)

if TYPE_CHECKING:
    from courier.config import Config

NO_TRANSCRIPT = "(no worker transcript was captured)"


def handle(
    request: RemoteRequest, response: RemoteResponse, client_gone: Callable[[], bool], config: Config | None = None
) -> None:
    # Only dispatch needs the whole configuration (and the harness modules); the other
    # operations need the home, which costs no yaml when there is no wb.yaml.
    if request.operation == "dispatch":
        from courier.config import load_config
        from courier.runs.dispatch import dispatch

        response.result = dispatch(config or load_config(), request).to_wire()
        return
    if request.operation == "continue":
        from courier.config import load_config
        from courier.runs.resume import continue_run

        response.result = continue_run(config or load_config(), request).to_wire()
        return
    from courier.paths import configured_home

    store = Store(config.home if config else configured_home()).ensure()
    operation = request.operation
    if operation == "status":
        response.result = status(store, request.agent_id).to_wire()
    elif operation == "await":
        response.result = await_run(store, request.agent_id, request.wait_timeout_ms, client_gone).to_wire()
    elif operation == "list":
        results, warnings = list_runs(store)
        response.set_results(results)
        response.warnings = warnings or None
    elif operation == "logs" and request.follow:
        from courier.runs.follow import follow_once

        wait_ms = min(request.wait_timeout_ms or limits.FOLLOW_WAIT_MAX_MS, limits.FOLLOW_WAIT_MAX_MS)
        actions, next_offset, result = follow_once(store, request.agent_id, request.follow_from, wait_ms, client_gone)
        response.logs = "".join(f"  {action}\n" for action in actions)
        response.next_offset = next_offset
        response.result = result.to_wire()
    elif operation == "logs":
        response.logs = logs_text(store, request.agent_id, request.tail or limits.LOGS_TAIL_DEFAULT, raw=request.raw)
    elif operation == "diff":
        response.result = diff_result(store, request.agent_id, stat=request.stat, wire_cap=True).to_wire()
    elif operation == "prune":
        from courier.runs.prune import prune

        removed = prune(store, request.older_than_ms, dry_run=request.dry_run)
        response.result = {"dry_run": request.dry_run, "removed": [entry.to_wire() for entry in removed]}
    elif operation == "stop":
        response.result = stop(store, request.agent_id, requester=f"pid {os.getpid()}").to_wire()


def diff_result(store: Store, agent_id: str, *, stat: bool, wire_cap: bool) -> DiffResult:
    """The run's diff (contract §15.1); over the wire a patch over 2 MiB is refused, not cut."""
    from courier.runs.diff import compute_diff

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


def status(store: Store, agent_id: str) -> Result:
    return render(store.load(agent_id), store)


def await_run(store: Store, agent_id: str, wait_timeout_ms: int, client_gone: Callable[[], bool]) -> Result:
    """Poll the record cheaply until the run is terminal, the bound passes or the asker is gone."""
    deadline = time.monotonic() + wait_timeout_ms / 1000 if wait_timeout_ms > 0 else None
    while True:
        result = render(store.load(agent_id), store)
        if result.terminal:
            return result
        now = time.monotonic()
        if (deadline is not None and now >= deadline) or client_gone():
            return result
        pause = limits.AWAIT_POLL_S if deadline is None else min(limits.AWAIT_POLL_S, deadline - now)
        time.sleep(max(pause, 0.001))


def list_runs(store: Store) -> tuple[list[Result], list[ListWarning]]:
    with collector_paused():
        records, warnings = store.list()
        results = [render(record, store) for record in records]
    return results, warnings


def logs_text(store: Store, agent_id: str, tail: int, *, raw: bool) -> str:
    store.load(agent_id)  # an unknown run is a finding, not an empty transcript
    path = store.run_dir(agent_id) / EVENTS
    try:
        size = os.lstat(path).st_size
    except FileNotFoundError:
        return NO_TRANSCRIPT + "\n"
    if raw:
        if size > limits.REMOTE_TRANSCRIPT_MAX_BYTES:
            raise Finding(
                f"transcript for {agent_id} is {size} bytes; "
                f"fetch it on that machine with wb agent logs {agent_id} --raw"
            )
        with open(path, "rb") as handle:
            return f"{path}\n" + handle.read().decode("utf-8", "replace")
    from courier.runs.harness.codex import worker_actions

    actions = worker_actions(path, tail)
    return f"{path}\n" + "".join(f"  {action}\n" for action in actions)


def stop(store: Store, agent_id: str, requester: str) -> StopResult:
    record = store.load(agent_id)
    if record.state != "running":
        raise Finding(f"agent run {agent_id} is already {record.state}")
    store.request_stop(agent_id, requester)
    delivered_pid = 0
    pid, token = record.worker_pid, record.worker_token
    if pid and process.same_process(pid, token):
        if process.signal_group(pid, signal.SIGTERM):
            delivered_pid = pid

        def worker_gone() -> bool:
            return not process.same_process(pid, token) and not process.group_members(pid)

        # While any member lives, the group ID cannot be reused, so signalling it stays safe.
        if not process.wait_until(worker_gone, limits.STOP_GRACE_S):
            process.signal_group(pid, signal.SIGKILL)
            process.wait_until(worker_gone, 2.0)
    # The owner records the outcome; when it is gone, nobody else will, so stop does.
    owner_gone = not process.same_process(record.owner_pid, record.owner_token)
    if owner_gone and (record.owner_pid or not within_admission_grace(record)):
        try:
            current = store.load(agent_id)
        except WbError:
            current = record
        if current.state == "running":
            from courier.runs.owner import finish

            finish(store, current, "failed", f"stopped on request at {store.stop_requested_at(agent_id)}")
    return StopResult(agent_id=agent_id, worker_pid=delivered_pid, state=record.state)
