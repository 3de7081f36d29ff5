"""The run operations on this machine, each filling a RemoteResponse (the handlers the operation registry loads)."""

from __future__ import annotations

import os
import signal

from courier.errors import Finding, WbError
from courier.runs import descendants, process
from courier.runs.context import Context, store_for
from courier.runs.store import Record, Store, read_fd, render, within_admission_grace
from protocol import limits
from protocol.models import ListWarning, RemoteRequest, RemoteResponse, Result, StopResult, collector_paused

NO_TRANSCRIPT = "(no worker transcript was captured)"


def dispatch_op(request: RemoteRequest, response: RemoteResponse, context: Context) -> None:
    from courier.runs.admission import dispatch
    from courier.runs.context import configured_config

    response.set_result(dispatch(context.config or configured_config(), request, fresh_login=context.fresh_login))


def status_op(request: RemoteRequest, response: RemoteResponse, context: Context) -> None:
    response.set_result(status(store_for(context), request.agent_id))


def await_op(request: RemoteRequest, response: RemoteResponse, context: Context) -> None:
    from courier.runs.views import await_run, runs_of

    response.set_result(await_run(runs_of(context), request.agent_id, request.wait_timeout_ms, context.client_gone))


def list_op(request: RemoteRequest, response: RemoteResponse, context: Context) -> None:
    results, warnings = list_runs(store_for(context))
    response.set_results(results)
    response.warnings = warnings or None


def logs_op(request: RemoteRequest, response: RemoteResponse, context: Context) -> None:
    if request.follow:
        from courier.runs.loop_ops import follow_op

        follow_op(request, response, context)
        return
    if request.raw and context.in_process:  # the caller is this process: it reads the file itself
        store = store_for(context)
        store.load(request.agent_id)  # an unknown run is a finding, not an empty transcript
        opened = store.open_transcript(request.agent_id)  # no link, FIFO or hard link is followed
        if opened is None:
            response.logs = NO_TRANSCRIPT + "\n"
        else:
            response.attach_transcript((opened[0], opened[1], str(opened[2])))
        return
    tail = request.tail or limits.LOGS_TAIL_DEFAULT
    response.logs = logs_text(store_for(context), request.agent_id, tail, raw=request.raw)


def stop_op(request: RemoteRequest, response: RemoteResponse, context: Context) -> None:
    survivors: list[int] = []
    response.set_result(stop(store_for(context), request.agent_id, f"pid {os.getpid()}", survivors))
    response.warnings = descendants.survivor_warnings(request.agent_id, survivors)


def status(store: Store, agent_id: str) -> Result:
    return render(store.load(agent_id), store)


def list_runs(store: Store) -> tuple[list[Result], list[ListWarning]]:
    with collector_paused():
        records, warnings = store.list()
        results = [render(record, store) for record in records]
    return results, warnings


def logs_text(store: Store, agent_id: str, tail: int, *, raw: bool) -> str:
    record = store.load(agent_id)  # an unknown run is a finding, not an empty transcript
    opened = store.open_transcript(agent_id)
    if opened is None:
        return NO_TRANSCRIPT + "\n"
    fd, size, path = opened
    if raw:
        return raw_text(agent_id, (fd, size, str(path)))
    try:
        from courier.runs.harness import harness_for

        actions = harness_for(record.resolved.harness).worker_actions(fd, tail)
    finally:
        os.close(fd)
    return f"{path}\n" + "".join(f"  {action}\n" for action in actions)


def raw_text(agent_id: str, opened: tuple[int, int, str]) -> str:
    """The transcript's path and text as a reply carries it (over the bound: a finding, not a cut); closes it."""
    fd, size, path = opened
    try:
        data = read_fd(fd, limits.REMOTE_TRANSCRIPT_MAX_BYTES + 1)
    finally:
        os.close(fd)
    if max(size, len(data)) > limits.REMOTE_TRANSCRIPT_MAX_BYTES:
        raise Finding(
            f"transcript for {agent_id} is {max(size, len(data))} bytes; "
            f"fetch it on that machine with wb agent logs {agent_id} --raw"
        )
    return f"{path}\n" + data.decode("utf-8", "replace")


def stop(store: Store, agent_id: str, requester: str, survivors: list[int] | None = None) -> StopResult:
    record = store.load(agent_id)
    if record.state != "running":
        raise Finding(f"agent run {agent_id} is already {record.state}")
    # Under the run's lock the owner is neither deciding the terminal state nor starting the
    # worker: either the stored state is terminal now (refused), or the owner will honour the
    # request; the worker seen here is the one to stop (docs/cli.md, wb agent stop; docs/runs.md#terminal-state).
    with store.run_lock(agent_id, wait_s=limits.RUN_LOCK_WAIT_S):
        record = store.load(agent_id)
        if record.state != "running":
            raise Finding(f"agent run {agent_id} is already {record.state}")
        store.request_stop(agent_id, requester)
    delivered_pid = 0
    pid, token = record.worker_pid, record.worker_token
    # Its processes that left its group (setsid), taken while the worker's tree is intact.
    stragglers = descendants.of_run(record.owner_pid, record.owner_token, pid, token)
    # A worker that was started but has exited (or whose PID another process now has) gets no signal.
    already_gone = bool(pid) and not process.same_process(pid, token)
    if pid and not already_gone:
        if process.signal_group(pid, signal.SIGTERM):
            delivered_pid = pid

        def worker_gone() -> bool:
            return not process.same_process(pid, token) and process.group_empty(pid)

        # While any member lives, the group ID cannot be reused, so signalling it stays safe.
        if not process.wait_until(worker_gone, limits.STOP_GRACE_S):
            process.signal_group(pid, signal.SIGKILL)
            process.wait_until(worker_gone, 2.0)
    left = descendants.end(stragglers, limits.STOP_GRACE_S)
    if survivors is not None:
        survivors += left
    def owner_gone() -> bool:
        return not process.same_process(record.owner_pid, record.owner_token)

    # The owner records the outcome; when it is gone, nobody else will, so stop does.
    if already_gone:  # the owner records the end it has seen (or is about to): give it a moment
        process.wait_until(lambda: owner_gone() or _stored_state(store, record) != "running", limits.STOP_GRACE_S)
    if owner_gone() and (record.owner_pid or not within_admission_grace(record)):
        try:
            current = store.load(agent_id)
        except WbError:
            current = record
        if current.state == "running":
            from courier.runs.owner import finish

            finish(store, current, "failed", f"stopped on request at {store.stop_requested_at(agent_id)}")
    if already_gone:
        # No signal was sent: the reply's state is the one the run is recorded as now (docs/protocol.md).
        state = _stored_state(store, record)
        if state == "running":
            raise Finding(
                f"agent run {agent_id}: its worker is already gone; the stop is requested, but the run is still "
                f"recorded as running: its owner (process {record.owner_pid}) has not recorded its end yet"
            )
        return StopResult(agent_id=agent_id, worker_pid=pid or 0, state=state)
    return StopResult(agent_id=agent_id, worker_pid=delivered_pid or pid or 0, state=record.state)


def _stored_state(store: Store, record: Record) -> str:
    try:
        return store.load(record.agent_id).state
    except WbError:
        return record.state
