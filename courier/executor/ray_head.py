"""The Ray head: every run operation of a machine whose wb.yaml says agents.executor.ray (docs/ray.md).

Dispatch checks the request as this machine would (the profile, its resources), refuses a
run no live node could ever take, records the placement (courier/executor/placements.py) and
has the head node's service submit the run's holder task with the run's resources; Ray starts
it on a node when one has them free, and the task admits the run there. Every other operation is
answered from the nodes' own stores through each node's `NodeService`, merged for `list` and
`prune`, with `node` set on each Result; the head adds what only it knows: runs still queued,
runs that ended before they started, and runs whose node is gone.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from courier.config import Config, Resources, load_config
from courier.errors import Finding, NotStartable, WbError, error_for_failure_kind
from courier.executor.placements import ENDED, PLACED, QUEUED, Placement, Placements, now, wants_text
from courier.executor.ray_keeper import ensure_keeper
from courier.executor.ray_node import NAMESPACE, NodeService
from courier.runs.context import Context, Handler
from courier.runs.watch_op import Cursor, Scanner
from courier.runs.watch_op import answer as answer_watch
from protocol import limits
from protocol.models import NodeFacts, RemoteRequest, RemoteResponse, Result, StopResult, collector_paused, is_terminal
from protocol.refs import check_run_id
from protocol.timestamps import parse_rfc3339

NODE_LABEL = "wb-node"  # a node's name for wb: `ray start --labels wb-node=NAME` (docs/ray.md#set-up)
NODE_ID_LABEL = "ray.io/node-id"  # Ray's own label of every node: its node ID (Ray 2.60)
NODE_CALL_S = 60.0  # the bound of one call to a node's service
AWAIT_POLL_S = 0.5

_STAMPED = ("status", "await", "logs", "continue", "dispatch")  # replies whose `result` is a Result
_connect_lock = threading.Lock()


# What this process joined: the cluster's address and the head's home (for its keeper), and
# whether this process is the keeper (courier/executor/ray_keeper.py).
_joined: dict[str, Any] = {}


def connect(address: str, home: Path, *, keeper: bool = False) -> None:
    """Join the cluster once per process (a serve-mode receiver keeps the connection warm)."""
    with _connect_lock:
        if ray.is_initialized():
            return
        _joined.update(address=address, home=home, keeper=keeper)
        os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "error")
        # Ray's core writes start-up notices straight to fd 2 (before its log level applies):
        # they are kept aside and shown only when joining fails.
        with tempfile.TemporaryFile() as aside:
            saved = os.dup(2)
            os.dup2(aside.fileno(), 2)
            try:
                ray.init(
                    address=address,
                    namespace=NAMESPACE,
                    log_to_driver=False,
                    logging_level=logging.ERROR,
                    include_dashboard=False,
                )
                failure = None
            except (ConnectionError, RuntimeError, ValueError) as exc:
                failure = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            finally:
                os.dup2(saved, 2)
                os.close(saved)
        if failure is not None:
            raise Finding(f"cannot reach the Ray cluster at {address} (agents.executor.ray.address): {failure}")
        if not keeper:
            ensure_keeper(home, address)  # started on the head's first contact, not awaited here


@dataclass(frozen=True)
class Node:
    name: str
    node_id: str
    total: dict[str, float]
    labels: dict[str, str] = field(default_factory=dict)


def cluster_nodes() -> list[dict[str, Any]]:
    """Ray's node table (GCS): alive or not, labels, total resources."""
    return list(ray.nodes())  # type: ignore[no-untyped-call]


def live_nodes() -> list[Node]:
    nodes = []
    for entry in cluster_nodes():
        if entry.get("Alive"):
            labels = entry.get("Labels") or {}
            node_id = str(entry["NodeID"])
            name = str(labels.get(NODE_LABEL) or node_id[:12])
            nodes.append(Node(name, node_id, dict(entry["Resources"]), {str(k): str(v) for k, v in labels.items()}))
    return sorted(nodes, key=lambda n: n.name)


# Each node's service handle, kept for the process's life (a serve-mode head answers many
# requests): looking a named actor up is a call to the GCS, and a dispatch asked for the head's
# twice. A handle whose actor died is forgotten (`forget_service`), and the next call looks again.
_services: dict[str, Any] = {}
_services_lock = threading.Lock()
_keeper_lock = threading.Lock()


def service(node: Node) -> Any:
    """The node's NodeService, created on first use and pinned to that node."""
    return service_on(node.node_id)


def service_on(node_id: str) -> Any:
    if node_id not in _services and node_id == _here() and not _joined.get("keeper") and "home" in _joined:
        # The head's own service submits every holder: its creator must be the keeper
        # (docs/ray.md#the-keeper), started here when none runs.
        with _keeper_lock:
            ensure_keeper(_joined["home"], _joined["address"], lambda: _exists(node_id))
    with _services_lock:
        handle = _services.get(node_id)
        if handle is None:
            handle = _services[node_id] = NodeService.options(  # type: ignore[attr-defined]
                name=service_name(node_id),
                namespace=NAMESPACE,
                lifetime="detached",
                get_if_exists=True,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            ).remote()
        return handle


def service_name(node_id: str) -> str:
    return f"node-{node_id}"


def _here() -> str:
    return str(ray.get_runtime_context().get_node_id())


def _exists(node_id: str) -> bool:
    try:
        ray.get_actor(service_name(node_id), namespace=NAMESPACE)
    except ValueError:
        return False
    return True


def forget_service(node_id: str) -> None:
    with _services_lock:
        _services.pop(node_id, None)


class NodeLost(Finding):
    """The node a run was placed on left the cluster (its runs are `abandoned`, docs/ray.md)."""


# How often a call to a node whose service is unavailable asks the GCS again whether the node lives.
_NODE_RECHECK_S = 0.5


def ask(node: Node, request: RemoteRequest) -> RemoteResponse:
    """One request answered by `node` from its own store, `node` set on every Result in it.

    A node that has just died looks alive in the GCS for a few health checks while its service
    is already unavailable: the call is asked again until either the service answers or the GCS
    says the node is gone (NodeLost), within NODE_CALL_S.
    """
    deadline = time.monotonic() + NODE_CALL_S
    while True:
        try:
            encoded = ray.get(service(node).answer.remote(request), timeout=max(1.0, deadline - time.monotonic()))
            break
        except ray.exceptions.GetTimeoutError:
            raise Finding(f"node {node.name} of the Ray cluster did not answer within {NODE_CALL_S:g}s") from None
        except (
            ray.exceptions.ActorUnavailableError,
            ray.exceptions.ActorDiedError,
            ray.exceptions.ActorUnschedulableError,  # its service re-made on a node that is going
        ) as exc:
            forget_service(node.node_id)  # a service re-made (or gone with its node) is looked up afresh
            if all(live.node_id != node.node_id for live in live_nodes()):
                raise NodeLost(f"node {node.name} lost") from None
            if time.monotonic() >= deadline:
                raise Finding(f"node {node.name} of the Ray cluster failed to answer: {type(exc).__name__}") from None
            time.sleep(_NODE_RECHECK_S)
        except ray.exceptions.RayError as exc:
            raise Finding(f"node {node.name} of the Ray cluster failed to answer: {type(exc).__name__}") from None
    response = RemoteResponse.model_validate_json(encoded)
    if response.operation in ("list",):
        results = response.results_of()
        for result in results:
            result.node = node.name
        response.set_results(results)
    elif response.result is not None and response.operation in _STAMPED:
        response.result = {**response.result, "node": node.name}
    return response


def ask_all(nodes: list[Node], request: RemoteRequest) -> list[tuple[Node, RemoteResponse | WbError]]:
    def one(node: Node) -> RemoteResponse | WbError:
        try:
            return ask(node, request)
        except WbError as exc:
            return exc

    if not nodes:
        return []
    with ThreadPoolExecutor(len(nodes)) as pool:
        return list(zip(nodes, pool.map(one, nodes), strict=True))


def raise_in_band(response: RemoteResponse) -> None:
    if response.failure:
        raise error_for_failure_kind(response.failure_kind)(response.failure)


# ----- placement


def ray_options(resources: Resources, holders: list[Node] | None = None) -> dict[str, Any]:
    """The holder task's Ray options: the run's resources, its labels, and with `holders` the nodes it may start on.

    `holders` (the nodes that have the run's canonical clone, asked at this dispatch) becomes a
    selector on Ray's own `ray.io/node-id` label of every node, beside the profile's labels (which
    never name `ray.io/…`): Ray keeps the run pending until one of them has its resources free.
    """
    custom = {name: float(amount) for name, amount in resources.custom.items()}
    options: dict[str, Any] = {"num_cpus": resources.cpus, "num_gpus": resources.gpus, "resources": custom}
    if resources.memory_bytes:
        options["memory"] = resources.memory_bytes
    selector = dict(resources.labels)
    if holders is not None:
        # No space after a comma: Ray 2.60 reads " <id>" as a node ID of the wrong length and aborts the submitter.
        selector[NODE_ID_LABEL] = "in(" + ",".join(sorted(node.node_id for node in holders)) + ")"
    if selector:
        options["label_selector"] = selector
    return options


def clone_holders(nodes: list[Node], repository: str) -> tuple[list[Node], list[str]]:
    """The nodes that have the canonical clone of `repository` now, each node's service asked in
    parallel (docs/ray.md#repositories); and, for the nodes that did not answer, why."""
    deadline = time.monotonic() + NODE_CALL_S
    calls: list[tuple[Node, Any]] = []
    silent: list[str] = []
    for node in nodes:
        try:
            calls.append((node, service(node).has_clone.remote(repository)))
        except (ray.exceptions.RayError, AttributeError) as exc:  # AttributeError: a service of an older wb
            silent.append(f"{node.name}: {type(exc).__name__}")
    holders = []
    for node, call in calls:
        try:
            if ray.get(call, timeout=max(1.0, deadline - time.monotonic())):
                holders.append(node)
        except ray.exceptions.RayError as exc:
            forget_service(node.node_id)  # a service gone with its worker is looked up afresh next time
            silent.append(f"{node.name}: {type(exc).__name__}")
    return holders, silent


def labels_match(labels: dict[str, str], selector: dict[str, str]) -> bool:
    """Whether a node with `labels` satisfies Ray's label_selector `selector` (VALUE, !VALUE, in(…), !in(…))."""
    for key, expression in selector.items():
        negated = expression.startswith("!")
        body = expression.removeprefix("!")
        if body.startswith("in(") and body.endswith(")"):
            hit = labels.get(key) in {part.strip() for part in body[3:-1].split(",")}
        else:
            hit = labels.get(key) == body
        if hit == negated:
            return False
    return True


def wants_of(resources: Resources) -> str:
    """What the status line says a queued run waits for: its amounts, then its labels."""
    wants = wants_text(resources.cpus, resources.gpus, resources.memory, dict(resources.custom))
    return ", ".join([wants, *(f"{key}={value}" for key, value in sorted(resources.labels.items()))])


def _needs(options: dict[str, Any]) -> dict[str, float]:
    needs = {"CPU": float(options["num_cpus"]), "GPU": float(options["num_gpus"]), **options["resources"]}
    if options.get("memory"):
        needs["memory"] = float(options["memory"])
    return {name: amount for name, amount in needs.items() if amount > 0}


_NAMES = {"CPU": "cpus", "GPU": "gpus"}  # Ray's resource names as a profile's `resources` says them


def _amount(name: str, value: float) -> str:
    if name == "memory":
        return f"{_NAMES.get(name, name)}={value / 2**30:.3g}GiB"
    return f"{_NAMES.get(name, name)}={value:g}"


def _shortfall(candidates: list[Node], needs: dict[str, float]) -> str:
    """What no candidate has enough of, with the most one has; or that none has all of it at once."""
    short = {name: max(node.total.get(name, 0.0) for node in candidates) for name in needs}
    short = {name: most for name, most in short.items() if most < needs[name]}
    if not short:
        return "no one node has all of it at once"
    names = ", ".join(_NAMES.get(name, name) for name in short)
    return f"short of {names} (the most on one node: {', '.join(_amount(n, most) for n, most in short.items())})"


def check_feasible(
    nodes: list[Node], holders: list[Node], options: dict[str, Any], repository: str, wants: str, silent: list[str]
) -> None:
    """Refuse (exit 1) a run that no live node could take even when idle, naming the shortfall.

    `holders`: the nodes with the run's canonical clone (`nodes` when the run names none);
    `silent`: the nodes that did not say whether they have it.
    """
    needs = _needs(options)
    selector = {key: value for key, value in (options.get("label_selector") or {}).items() if key != NODE_ID_LABEL}
    if not nodes:
        raise NotStartable("the Ray cluster has no live node")
    if selector and not any(labels_match(node.labels, selector) for node in nodes):
        wanted = ", ".join(f"{key}={value}" for key, value in sorted(selector.items()))
        raise NotStartable(
            f"no node of the Ray cluster has the labels {wanted} (a node's labels are its "
            f"`ray start --labels`; see docs/ray.md)"
        )
    if repository and not holders:
        unanswered = f"; no answer from node {', '.join(silent)}" if silent else ""
        raise NotStartable(
            f"no node of the Ray cluster has a canonical clone of {repository} (clone it under a "
            f"node's projects root as <projects_root>/{repository}: the next dispatch finds it; see docs/ray.md)"
            f"{unanswered}"
        )
    candidates = [node for node in holders if labels_match(node.labels, selector)]
    labelled = ", ".join(f"{key}={value}" for key, value in sorted(selector.items()))
    if not candidates:  # some node has the clone, some the labels, none both
        cloned = ", ".join(node.name for node in holders[:8])
        raise NotStartable(
            f"no node of the Ray cluster could ever take this run: none of the nodes with a canonical "
            f"clone of {repository} ({cloned}) has the labels {labelled}"
        )
    scope = f"the nodes with a canonical clone of {repository}" if repository else "the nodes"
    if selector:
        scope += f" and the labels {labelled}" if repository else f" with the labels {labelled}"
    if any(all(node.total.get(name, 0.0) >= amount for name, amount in needs.items()) for node in candidates):
        return
    have = ", ".join(
        f"{node.name} ({', '.join(_amount(name, node.total.get(name, 0.0)) for name in needs)})"
        for node in candidates[:8]
    )
    raise NotStartable(
        f"no node of the Ray cluster could ever take this run: it needs {wants}; "
        f"{_shortfall(candidates, needs)}; {scope}: {have}"
    )


def resources_of(config: Config, profile: str) -> Resources:
    return config.profile(profile).resources or Resources()


def place(config: Config, request: RemoteRequest, placement: Placement, options: dict[str, Any]) -> None:
    """Record the placement, then have its holder task submitted (pending until a node has room)."""
    placements = Placements(config.home)
    placements.save(placement)
    if placement.pinned_node_id:
        options = {**options, "scheduling_strategy": NodeAffinitySchedulingStrategy(placement.pinned_node_id, False)}
    try:  # the node's long-lived service submits and owns the holder: see NodeService.place
        call = head_service().place.remote(placement.agent_id, request, options)
        refused = ray.get(call, timeout=NODE_CALL_S)
    except ray.exceptions.RayError as exc:
        refused = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if refused:
        placements.remove(placement.agent_id)
        raise NotStartable(f"the Ray cluster refused the run: {refused}")


def dispatch(request: RemoteRequest, response: RemoteResponse, context: Context) -> None:
    from courier.runs.admission import resolve_profile

    config = _config(context)
    agent_id = check_run_id(request.agent_id) if request.agent_id else ""
    placements = Placements(config.home)
    if agent_id and placements.exists(agent_id):  # a repeated dispatch returns that run
        response.set_result(current(config, placements.load(agent_id)))
        return
    resolved, _network = resolve_profile(config, request.profile)  # refusals name the file and key
    resources = resources_of(config, request.profile)
    wants = wants_of(resources)
    connect(_address(config), config.home)
    nodes = live_nodes()
    holders, silent = clone_holders(nodes, request.repository) if request.repository else (nodes, [])
    options = ray_options(resources, holders if request.repository else None)
    check_feasible(nodes, holders, options, request.repository, wants, silent)
    if not agent_id:
        from protocol.refs import new_run_id

        agent_id = new_run_id()
        request = request.model_copy(update={"agent_id": agent_id})
    placement = Placement(
        agent_id=agent_id,
        created_at=now(),
        profile=request.profile,
        resolved=resolved.to_wire(),
        repository=request.repository,
        worktree_mode=request.mode,
        worktree=request.worktree,
        wants=wants,
        branch=request.branch,
        base=request.base,
    )
    place(config, request, placement, options)
    response.set_result(placement.queued_result())


def continue_(request: RemoteRequest, response: RemoteResponse, context: Context) -> None:
    """A continuation runs on its parent's node, in the same worktree (a holder task pinned to that node)."""
    config = _config(context)
    connect(_address(config), config.home)
    placements = Placements(config.home)
    parent = current(config, placements.load(request.agent_id))
    if not parent.terminal:
        raise Finding(f"agent run {request.agent_id} is still {parent.state}; await it before continuing it")
    parent_placement = placements.load(request.agent_id)
    node = _node_by_id(parent_placement.node_id)
    if node is None:
        raise NotStartable(f"agent run {request.agent_id} ran on node {parent_placement.node}, which is gone")
    new_id = check_run_id(request.new_agent_id) if request.new_agent_id else ""
    if not new_id:
        from protocol.refs import new_run_id

        new_id = new_run_id()
        request = request.model_copy(update={"new_agent_id": new_id})
    if placements.exists(new_id):
        response.result = current(config, placements.load(new_id)).to_wire()
        return
    profile = request.profile or parent.profile
    resources = resources_of(config, profile)
    options = ray_options(resources)  # pinned to the parent's node, which has the worktree (and its clone)
    wants = wants_of(resources)
    check_feasible([node], [node], options, parent.repository, wants, [])
    placement = Placement(
        agent_id=new_id,
        created_at=now(),
        profile=profile,
        resolved=parent.resolved.to_wire(),
        repository=parent.repository,
        worktree_mode="existing",
        worktree=parent.worktree,
        wants=wants,
        parent_id=parent.agent_id,
        pinned_node_id=node.node_id,
    )
    place(config, request, placement, options)
    response.result = placement.queued_result().to_wire()


# ----- where a run is, and its Result


def head_service() -> Any:
    """The service of the node this process runs on (the head's): it submits and owns the holder tasks."""
    return service_on(_here())


def _node_by_id(node_id: str) -> Node | None:
    return next((node for node in live_nodes() if node.node_id == node_id), None)


def locate(config: Config, placement: Placement, nodes: list[Node]) -> Placement:
    """Find a queued run on the nodes: its record (it was placed), or its node's refusal (it ended)."""
    if placement.phase != QUEUED:
        return placement
    status = RemoteRequest.of("status", agent_id=placement.agent_id)
    for node, reply in ask_all(nodes, status):
        if isinstance(reply, RemoteResponse) and not reply.failure:
            placement.phase, placement.node, placement.node_id = PLACED, node.name, node.node_id
            placement.last = reply.result_of().to_wire()
            Placements(config.home).save(placement)
            return placement
    for node in nodes:
        refused = _refusal(node, placement.agent_id)
        if refused:
            placement.phase, placement.failure, placement.finished_at = ENDED, refused, now()
            placement.node, placement.node_id = node.name, node.node_id
            Placements(config.home).save(placement)
            return placement
    return placement


def _refusal(node: Node, agent_id: str) -> str:
    try:
        text = ray.get(service(node).refusal.remote(agent_id), timeout=NODE_CALL_S)
    except ray.exceptions.RayError:
        return ""
    if not text:
        return ""
    reply = RemoteResponse.model_validate_json(text)
    return f"node {node.name} did not start it: {reply.failure}"


def current(config: Config, placement: Placement, nodes: list[Node] | None = None) -> Result:
    """The run's Result now: from its node, or what the head knows (queued, ended, its node lost)."""
    nodes = live_nodes() if nodes is None else nodes
    placement = locate(config, placement, nodes)
    if placement.phase == ENDED:
        return placement.ended_result()
    if placement.phase == QUEUED:
        return placement.queued_result()
    node = next((n for n in nodes if n.node_id == placement.node_id), None)
    if node is None:
        return placement.lost_result()
    try:
        reply = ask(node, RemoteRequest.of("status", agent_id=placement.agent_id))
    except NodeLost:
        return placement.lost_result()
    raise_in_band(reply)
    result = reply.result_of()
    if placement.last is None or not is_terminal(str(placement.last.get("state"))):
        placement.last = result.to_wire()
        Placements(config.home).save(placement)
    return result


def _placed_node(config: Config, agent_id: str) -> tuple[Placement, Node | None]:
    placements = Placements(config.home)
    placement = locate(config, placements.load(agent_id), live_nodes())
    node = _node_by_id(placement.node_id) if placement.phase == PLACED else None
    return placement, node


# ----- the operations


def status(request: RemoteRequest, response: RemoteResponse, context: Context) -> None:
    config = _connected(context)
    response.set_result(current(config, Placements(config.home).load(request.agent_id)))


def await_(request: RemoteRequest, response: RemoteResponse, context: Context) -> None:
    """Poll the head's view until terminal: through `queued`, then the node's own states."""
    config = _connected(context)
    placements = Placements(config.home)
    deadline = time.monotonic() + request.wait_timeout_ms / 1000 if request.wait_timeout_ms > 0 else None
    while True:
        result = current(config, placements.load(request.agent_id))
        remaining = None if deadline is None else deadline - time.monotonic()
        if result.terminal or (remaining is not None and remaining <= 0) or context.client_gone():
            response.set_result(result)
            return
        time.sleep(AWAIT_POLL_S if remaining is None else max(min(AWAIT_POLL_S, remaining), 0.001))


def list_(request: RemoteRequest, response: RemoteResponse, context: Context) -> None:
    """Every run of every live node, then the head's own: queued, ended before start, node lost."""
    config = _connected(context)
    nodes = live_nodes()
    results: list[Result] = []
    warnings = []
    with collector_paused():
        lost: set[str] = set()
        for node, reply in ask_all(nodes, RemoteRequest.of("list")):
            if isinstance(reply, NodeLost):
                lost.add(node.node_id)  # died since live_nodes(): its placed runs are lost below
                continue
            if isinstance(reply, WbError):
                raise reply
            raise_in_band(reply)
            results += reply.results_of()
            warnings += reply.warnings or []
        seen = {result.agent_id for result in results}
        placements = Placements(config.home)
        admitting: set[str] = set()
        for placement in placements.all():
            if placement.agent_id in seen:
                continue
            if placement.phase == QUEUED:
                results.append(placement.queued_result())
                admitting.add(placement.agent_id)
            elif placement.phase == ENDED:
                results.append(placement.ended_result())
            elif placement.node_id in lost or not any(n.node_id == placement.node_id for n in nodes):
                results.append(placement.lost_result())
        # A node being admitted a run has its directory before its record: its list warns that it
        # cannot read it. The head's queued entry stands for that run (a reply names a run once).
        warnings = [warning for warning in warnings if warning.agent_id not in admitting]
    results.sort(key=lambda r: r.started_at, reverse=True)
    response.set_results(results)
    response.warnings = warnings or None


def _forward(request: RemoteRequest, response: RemoteResponse, context: Context, queued: Callable[..., None]) -> None:
    """Ask the run's node; a run not on a node yet is answered by `queued(placement)`."""
    config = _connected(context)
    placement, node = _placed_node(config, request.agent_id)
    if placement.phase == PLACED and node is None:
        raise Finding(f"agent run {request.agent_id}: node {placement.node} lost; its records are on that node")
    if node is None:
        queued(placement)
        return
    reply = ask(node, request)
    for key in ("logs", "failure", "failure_kind", "next_offset", "warnings"):
        setattr(response, key, getattr(reply, key))
    response.result = reply.result


def logs(request: RemoteRequest, response: RemoteResponse, context: Context) -> None:
    def queued(placement: Placement) -> None:
        if placement.phase == ENDED:
            response.logs = f"(it never started: {placement.failure})\n"
        else:
            response.logs = "" if request.follow else f"(queued: waiting for {placement.wants})\n"
        if request.follow:
            time.sleep(min(request.wait_timeout_ms or 1000, 1000) / 1000)  # a follower polls; not a busy loop
            response.next_offset = request.follow_from
            result = placement.ended_result() if placement.phase == ENDED else placement.queued_result()
            response.result = result.to_wire()

    _forward(request, response, context, queued)


def diff(request: RemoteRequest, response: RemoteResponse, context: Context) -> None:
    def queued(placement: Placement) -> None:
        raise Finding(f"agent run {request.agent_id} has not started on a node yet ({placement.phase}): no diff")

    _forward(request, response, context, queued)


def stop(request: RemoteRequest, response: RemoteResponse, context: Context) -> None:
    config = _connected(context)
    placements = Placements(config.home)
    placement, node = _placed_node(config, request.agent_id)
    if placement.phase == QUEUED:
        try:
            never_started = bool(ray.get(head_service().cancel.remote(request.agent_id), timeout=NODE_CALL_S))
        except ray.exceptions.RayError as exc:
            raise Finding(f"the Ray cluster failed to stop the queued run: {type(exc).__name__}") from None
        if never_started:
            placement.phase, placement.finished_at = ENDED, now()
            placement.failure = "stopped on request before it started"
            placements.save(placement)
            # `state` is the run's state when the stop was asked, as for a running run: `queued`
            # tells the caller it never started (`<ref>: stopped before it started`).
            response.set_result(StopResult(agent_id=request.agent_id, worker_pid=0, state="queued"))
            return
        # It had just started on a node: stop it there once that node has its record.
        deadline = time.monotonic() + NODE_CALL_S
        while placement.phase == QUEUED and time.monotonic() < deadline:
            time.sleep(AWAIT_POLL_S)
            placement, node = _placed_node(config, request.agent_id)
    if placement.phase == ENDED:
        raise Finding(f"agent run {request.agent_id} is already failed ({placement.failure})")
    if node is None:
        raise Finding(f"agent run {request.agent_id}: node {placement.node} lost; nothing to stop")
    reply = ask(node, request)
    raise_in_band(reply)
    response.result, response.warnings = reply.result, reply.warnings


def prune(request: RemoteRequest, response: RemoteResponse, context: Context) -> None:
    """Every node prunes its own store; the head forgets the placements of runs pruned there."""
    config = _connected(context)
    removed: list[Any] = []
    kept = 0
    worktrees: list[Any] = []
    for _node, reply in ask_all(live_nodes(), request):
        if isinstance(reply, WbError):
            raise reply
        raise_in_band(reply)
        body = reply.result or {}
        removed += body.get("removed", [])
        kept += int(body.get("kept_live", 0))
        worktrees += body.get("worktrees", [])
    if not request.dry_run:
        placements = Placements(config.home)
        for entry in removed:
            placements.remove(str(entry.get("agent_id", "")))
    response.result = {"dry_run": request.dry_run, "removed": removed, "kept_live": kept}
    if request.worktrees:
        response.result["worktrees"] = worktrees


CLUSTER_WATCH_POLL_S = 1.0  # each look is a `list` of every node: once a second, not the local 250 ms


def _cluster_scanner(context: Context) -> Scanner:
    """The watch operation's scanner over the merged cluster list (the nodes' runs and the head's own)."""

    class ClusterScanner(Scanner):
        def __init__(self) -> None:  # no store of its own: every look asks the nodes
            pass

        def scan(self) -> dict[str, tuple[Result, float]]:
            listing = RemoteResponse(schema_version=limits.SCHEMA_VERSION, operation="list")
            list_(RemoteRequest.of("list"), listing, context)
            return {result.agent_id: (result, _started(result)) for result in listing.results_of()}

    return ClusterScanner()


def _started(result: Result) -> float:
    try:
        return parse_rfc3339(result.started_at).timestamp()
    except ValueError:
        return 0.0


def watch(request: RemoteRequest, response: RemoteResponse, context: Context) -> None:
    """The watch long-poll (docs/protocol.md#watch) over the whole cluster: its runs on every node,
    queued ones included, with the cursor and the answer rules of one machine's watch."""
    cursor = Cursor.decode(request.watch_cursor) if request.watch_cursor else None
    wait_ms = min(request.wait_timeout_ms or limits.WATCH_WAIT_DEFAULT_MS, limits.FOLLOW_WAIT_MAX_MS)
    _connected(context)
    scanner = _cluster_scanner(context)
    deadline = time.monotonic() + wait_ms / limits.MS_PER_SECOND
    while True:
        results, fresh, changed = answer_watch(scanner, cursor, time.time())
        remaining = deadline - time.monotonic()
        if changed or remaining <= 0 or context.client_gone():
            break
        time.sleep(max(0.001, min(CLUSTER_WATCH_POLL_S, remaining)))
    response.set_results(results)
    response.watch_cursor = fresh.encode()


def version(request: RemoteRequest, response: RemoteResponse, context: Context) -> None:
    """This machine's own answer, plus `executor: ray` and each node's free/total cpus and gpus."""
    from courier.capabilities import DISPATCH_IN_SERVE
    from courier.ops.version import version_op

    version_op(request, response, context)
    response.capabilities = [*(response.capabilities or []), DISPATCH_IN_SERVE]
    config = _connected(context)
    response.executor = "ray"
    response.nodes = node_facts(config)


def node_facts(config: Config) -> list[NodeFacts]:
    free = _available_per_node()
    facts = []
    for entry in cluster_nodes():
        labels = entry.get("Labels") or {}
        node_id = str(entry["NodeID"])
        total = entry.get("Resources") or {}
        available = free.get(node_id, {}) if entry.get("Alive") else {}
        facts.append(
            NodeFacts(
                node=str(labels.get(NODE_LABEL) or node_id[:12]),
                alive=bool(entry.get("Alive")),
                cpus_free=float(available.get("CPU", 0.0)),
                cpus_total=float(total.get("CPU", 0.0)),
                gpus_free=float(available.get("GPU", 0.0)),
                gpus_total=float(total.get("GPU", 0.0)),
            )
        )
    return sorted(facts, key=lambda n: (not n.alive, n.node))


def _available_per_node() -> dict[str, dict[str, float]]:
    """Free resources per node ID, from the GCS (Ray's state API needs the dashboard, which a head may not run)."""
    try:
        from ray._private.state import state

        return dict(state.available_resources_per_node())  # type: ignore[no-untyped-call]
    except Exception:
        return {}


# ----- helpers


def _config(context: Context) -> Config:
    return context.config or load_config()


def _address(config: Config) -> str:
    assert config.ray_address is not None
    return config.ray_address


def _connected(context: Context) -> Config:
    config = _config(context)
    connect(_address(config), config.home)
    return config


HANDLERS: dict[str, Handler] = {
    "dispatch": dispatch,
    "status": status,
    "await": await_,
    "list": list_,
    "logs": logs,
    "stop": stop,
    "continue": continue_,
    "diff": diff,
    "prune": prune,
    "version": version,
    "watch": watch,
}
