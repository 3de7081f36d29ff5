"""What runs on each Ray node for wb (docs/ray.md#how-a-run-reaches-a-node): a detached actor and a task.

- `NodeService` (one detached actor per node, no CPU, pinned to its node): answers a request
  from the node's own store exactly as that machine's receiver would (status, list, logs,
  diff, stop, prune…). The head node's also submits and owns every run's holder task.
- `hold_run` (one task per run, with the run's resources): its submission *is* the placement.
  Ray keeps it pending until a node has the resources free, which is the `queued` state; once
  it starts, it admits the run on its node (the node's ordinary dispatch: worktree, record,
  detached owner) and holds the resources until the run is terminal, then returns.

The submitter is the head's long-lived service, not the receiver that dispatched (it exits
as soon as it has answered), and a run's owner is started by the node's own dispatch, as on any
machine. The environment is the node's: Ray starts its workers with the environment of
`ray start`, so WB_HOME, WB_PROJECTS_ROOT and WB_CONFIG are the node's own.

Requests are handled here through the registry's handlers, not `courier.executor.perform.perform`:
that function sends a Ray head's requests to the cluster, and a node must answer from its
own store.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from courier import __version__
from courier.errors import WbError
from courier.executor.local import LocalExecutor
from courier.executor.perform import perform
from courier.runs import process
from courier.runs.context import configured_home, configured_settings
from courier.runs.store import Store, write_private
from courier.runs.worktrees import clone_path
from courier.stage_trace import mark
from protocol import limits
from protocol.models import RemoteRequest, RemoteResponse
from protocol.refs import check_repository
from protocol.timestamps import rfc3339, utc_now
from protocol.validate import RequestRefused, decode_request

NAMESPACE = "wb"
WARM_WORKERS_MAX = 8  # workers started ahead per node, at most
WARM_HOLD_S = 0.5
HOLD_POLL_S = 0.25  # how often a holder looks whether its run is terminal when it cannot watch the owner
OWNER_WATCH_S = 2.0  # the longest a holder watching its run's owner goes without looking at the run


def answer_here(request: RemoteRequest) -> bytes:
    """The encoded reply this node's receiver would give, from this node's own store; every refusal in-band."""
    return perform(request, executor=LocalExecutor()).encode()


def answer_bytes_here(payload: bytes) -> bytes:
    """The reply to a request's bytes (the head's call through its channel to this node)."""
    try:
        request = decode_request(payload)
    except RequestRefused as exc:  # the head validated it: only a head of another wb gets here
        refused = RemoteResponse(schema_version=limits.SCHEMA_VERSION, failure=str(exc), failure_kind="request")
        refused.wb_version, refused.now = __version__, rfc3339(utc_now())
        return refused.encode()
    return answer_here(request)


def holds_clone(repository: str) -> bool:
    """Whether `<projects_root>/OWNER/REPO` is a clone on this node, looked at on every call.

    The head asks it of every node at each dispatch (docs/ray.md#repositories): a clone made
    under the projects root counts from the next dispatch on, with nothing declared to Ray and
    no restart of the node. The projects root is the node's own (its wb.yaml, else
    WB_PROJECTS_ROOT, else ~/projects), as the node's own dispatch resolves it.
    """
    from courier.config_file import read_settings
    from courier.paths import config_path

    settings = configured_settings() or read_settings(config_path())  # no wb.yaml: the built-ins
    return (clone_path(settings.projects_root, check_repository(repository)) / ".git").exists()


def service_name(node_id: str) -> str:
    """The name of a node's NodeService (a detached actor in NAMESPACE)."""
    return f"node-{node_id}"


def refusal_path(agent_id: str) -> str:
    """Where a run that its node refused to admit leaves the reason (the head reads it via NodeService)."""
    directory = configured_home() / "ray-refused"
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    return str(directory / f"{agent_id}.json")


@ray.remote(num_cpus=0, max_concurrency=16)  # type: ignore[call-overload]  # (actor options are untyped)
class NodeService:
    def __init__(self) -> None:
        # The head's service owns every queued run's holder task: agent_id → its ObjectRef, and
        # which of them have started (claimed) or were stopped before they did (cancelled).
        self._holders: dict[str, Any] = {}
        self._claimed: set[str] = set()
        self._cancelled: set[str] = set()
        self._placed: set[str] = set()  # every run ever submitted here (IDs are unique: a few bytes each)
        self._lock = threading.Lock()
        self._peers: dict[str, Any] = {}  # the other nodes' services, looked up once (clone_holders)

    def warm(self, nodes: list[tuple[str, int]]) -> None:
        """Have each node start one pooled worker per cpu for the holders this service submits
        (node ID, cpus): the first runs then find them started (docs/ray.md#the-keeper)."""
        for node_id, cpus in nodes:
            for _ in range(min(cpus, WARM_WORKERS_MAX)):
                _warm_worker.options(
                    num_cpus=1, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
                ).remote()

    def answer_bytes(self, payload: bytes) -> bytes:
        """A request's bytes in, the one reply document out: the head's channel to this node."""
        return answer_bytes_here(payload)

    def refusal(self, agent_id: str) -> str | None:
        """Why this node refused to admit `agent_id`, or None."""
        with contextlib.suppress(OSError), open(refusal_path(agent_id), encoding="utf-8") as handle:
            return handle.read()
        return None

    def node_id(self) -> str:
        return str(ray.get_runtime_context().get_node_id())

    def has_clone(self, repository: str) -> bool:
        """Whether this node has the canonical clone of `repository` now (docs/ray.md#repositories)."""
        return holds_clone(repository)

    def clone_holders(
        self, repository: str, node_ids: list[str], bound_s: float
    ) -> tuple[list[str], list[tuple[str, str]]]:
        """Which of `node_ids` have the canonical clone of `repository` now, each node asked in parallel, and
        for the nodes that did not answer within `bound_s`, why (node ID, error).

        The head's receiver asks its own node's service, which lives as long as the node and keeps its
        handles on the others: a new receiver makes one connection to a service instead of one per node.
        """
        here = ray.get_runtime_context().get_node_id()
        others = [node_id for node_id in node_ids if node_id != here]
        holders, silent = ask_for_clone(others, repository, bound_s, self._peer, self._forget_peer)
        if here in node_ids and holds_clone(repository):
            holders.insert(0, here)
        return holders, silent

    def _peer(self, node_id: str) -> Any:
        with self._lock:
            handle = self._peers.get(node_id)
        if handle is None:
            handle = service_handle(node_id)
            with self._lock:
                self._peers[node_id] = handle
        return handle

    def _forget_peer(self, node_id: str) -> None:
        with self._lock:
            self._peers.pop(node_id, None)

    def place(self, agent_id: str, request: RemoteRequest, options: dict[str, Any]) -> str:
        """Submit the run's holder task from here; "" when submitted, else why Ray refused it.

        The head's receiver exits as soon as it has answered, and in Ray a task (and what it
        was submitted with) belongs to its submitter: a task larger than Ray inlines (100 KiB)
        would be lost with the receiver while the run is still queued, and a submission still
        in flight when it exits never reaches Ray (docs/ray.md#how-a-run-reaches-a-node). This
        service lives as long as its node, so it submits the holder and owns it.
        """
        with self._lock:
            if agent_id in self._placed:  # the same dispatch again (a retried call): one holder per run
                return ""
            self._placed.add(agent_id)
        me = ray.get_runtime_context().current_actor
        try:
            ref = hold_run.options(max_retries=0, **options).remote(me, agent_id, request)
        except (ValueError, TypeError, ray.exceptions.RayError) as exc:
            with self._lock:
                self._placed.discard(agent_id)
            return str(exc) or type(exc).__name__
        with self._lock:
            self._holders[agent_id] = ref
        threading.Thread(target=self._forget_when_done, args=(agent_id, ref), daemon=True).start()
        return ""

    def _forget_when_done(self, agent_id: str, ref: Any) -> None:
        with contextlib.suppress(ray.exceptions.RayError):
            ray.wait([ref], fetch_local=False)
        with self._lock:
            self._holders.pop(agent_id, None)
            self._claimed.discard(agent_id)
            self._cancelled.discard(agent_id)

    def claim(self, agent_id: str) -> bool:
        """Asked by a holder task as it starts on a node: True to admit its run, False when it was stopped."""
        with self._lock:
            if agent_id in self._cancelled:
                return False
            self._claimed.add(agent_id)
            return True

    def cancel(self, agent_id: str) -> bool:
        """Stop a run that has not started: True when it had not (it never will), False when it has."""
        with self._lock:
            if agent_id in self._claimed:
                return False
            self._cancelled.add(agent_id)
            ref = self._holders.get(agent_id)
        if ref is not None:
            with contextlib.suppress(ray.exceptions.RayError, ValueError):
                ray.cancel(ref)  # a pending task leaves Ray's queue; one just started asks claim and ends
        return True


def _claimed(owner: Any, agent_id: str) -> bool:
    """Ask the head's service whether this run may start, from a thread of this task.

    A task's main thread blocked in `ray.get` lends its CPUs back to the node, and the node
    then starts another queued holder in a new worker process (an interpreter importing Ray
    and wb, about 1 s of CPU) that lives only until the pool's idle limit ends it: one extra
    worker per run (docs/ray.md#cost). A call from another thread keeps the CPUs held.
    """
    answer: list[bool] = []
    asker = threading.Thread(target=lambda: answer.append(bool(ray.get(owner.claim.remote(agent_id)))))
    asker.start()
    asker.join()
    return bool(answer and answer[0])


def ask_for_clone(
    node_ids: list[str],
    repository: str,
    bound_s: float,
    service_of: Callable[[str], Any],
    forget: Callable[[str], None],
) -> tuple[list[str], list[tuple[str, str]]]:
    """Which of `node_ids` have the canonical clone of `repository`, each node's service (`service_of`) asked in
    parallel within `bound_s`; and, for the nodes that did not answer, why (node ID, error). A service whose call
    failed is forgotten (`forget`): one gone with its worker is looked up afresh next time."""
    deadline = time.monotonic() + bound_s
    calls: list[tuple[str, Any]] = []
    silent: list[tuple[str, str]] = []
    for node_id in node_ids:
        try:
            calls.append((node_id, service_of(node_id).has_clone.remote(repository)))
        except (ValueError, ray.exceptions.RayError, AttributeError) as exc:  # no service there, or an older wb's
            silent.append((node_id, type(exc).__name__))
    holders = []
    for node_id, call in calls:
        try:
            if ray.get(call, timeout=max(1.0, deadline - time.monotonic())):
                holders.append(node_id)
        except ray.exceptions.RayError as exc:
            forget(node_id)
            silent.append((node_id, type(exc).__name__))
    return holders, silent


def service_handle(node_id: str) -> Any:
    """The NodeService of `node_id`: made on first use (detached, pinned to that node), else the one there."""
    return NodeService.options(  # type: ignore[attr-defined]
        name=service_name(node_id),
        namespace=NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
    ).remote()


@ray.remote(max_retries=0)
def _warm_worker() -> None:
    """Holds a cpu briefly, so that a node starts as many workers as it has cpus, side by side."""
    time.sleep(WARM_HOLD_S)


@ray.remote(max_retries=0)
def hold_run(owner: Any, agent_id: str, request: RemoteRequest) -> None:
    """The run's holder: it runs with the run's resources, admits the run on this node, and
    holds those resources until the run is terminal here.

    A Ray task, not an actor: Ray runs tasks in pooled worker processes that it reuses from
    run to run, where an actor costs a new worker process (an interpreter importing Ray and
    wb) per run (docs/ray.md#cost). Never retried: a run is admitted once.
    """
    mark("ray.holder")  # the holder task started on its node (docs/benchmarks.md#dispatch-latency)
    if not _claimed(owner, agent_id):
        return
    mark("ray.claimed")
    reply = RemoteResponse.model_validate_json(answer_here(request))
    if reply.failure:
        # Not admitted here (a worktree in use, a missing credential…): the head reports it.
        write_private(Path(refusal_path(agent_id)), reply.model_dump_json().encode())
        return
    _hold_until_terminal(agent_id)


def _hold_until_terminal(agent_id: str) -> None:
    """Return once the run is terminal on this node, promptly: the slot is idle from then on.

    The holder watches the run's owner process (a pidfd, readable when it exits: the owner writes
    the terminal record just before) and looks at the run only then, or every OWNER_WATCH_S in
    case the run ended otherwise. Polling alone left a slot idle for half a poll on average after
    every run, and cost a status read per poll (docs/ray.md#cost).
    """
    probe = RemoteRequest.of("status", agent_id=agent_id)
    owner: int | None = None  # a pidfd of the run's current owner, while it is alive
    try:
        while True:
            reply = RemoteResponse.model_validate_json(answer_here(probe))
            if reply.failure or reply.result_of().terminal:
                return
            if owner is None:
                owner = _owner_pidfd(agent_id)  # none yet, or gone (a run resumed under a new one is watched again)
            if owner is None:
                time.sleep(HOLD_POLL_S)
            elif select.select([owner], [], [], OWNER_WATCH_S)[0]:
                os.close(owner)
                owner = None
    finally:
        if owner is not None:
            os.close(owner)


def _owner_pidfd(agent_id: str) -> int | None:
    """A pidfd of the run's owner (Linux 5.3+), or None: not started yet, gone, or no pidfd here."""
    try:
        record = Store(configured_home()).load(agent_id)
    except WbError:
        return None
    if not record.owner_pid or not hasattr(os, "pidfd_open"):
        return None
    try:
        handle = os.pidfd_open(record.owner_pid)
    except OSError:
        return None
    # Opened after the pid was read: the pid must still be that owner (not a reused pid).
    if not process.same_process(record.owner_pid, record.owner_token):
        os.close(handle)
        return None
    return handle
