"""The Ray executor (docs/ray.md): a machine whose wb.yaml says `agents.executor.ray` answers for the runs
of a Ray cluster's nodes.

Each operation says how (`Op.cluster`, courier/ops/op.py), and this module implements the four ways
once, for every operation:

- **forward**: the node holding the run answers, found from the head's placement record
  (courier/executor/placements.py); a run no node holds (queued, ended before it started, its node
  gone) is answered by the operation's own `before_start`.
- **fan_out**: every live node answers; the replies merge by their kind (`results`, `prune`), with
  what only the head knows: runs still queued, ended before they started, or whose node is gone.
- **place**: the run is checked as this machine would check it, refused when no live node could
  ever take it, recorded, and its holder task submitted by the head node's service; Ray starts it
  on a node when one has its resources free (courier/executor/ray_node.py).
- **head**: the operation's own handler answers here and looks at runs through this executor
  (`Runs`, courier/runs/context.py): `await` polls the run's status, `watch` scans the merged
  list, `version` adds the nodes.

Nodes are asked through `RayNodeChannel` (courier/executor/ray_cluster.py) and the one caller
(courier/call/caller.py), several at once through the fleet's fan-out (courier/call/fan_out.py).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Literal, assert_never

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from courier.call.caller import ask_over
from courier.call.fan_out import ask_each
from courier.call.peer_text import configured_secrets
from courier.config import Config
from courier.errors import Finding, NotStartable, error_for_failure_kind
from courier.executor import Executor
from courier.executor.placements import ENDED, PLACED, QUEUED, Placement, Placements, now
from courier.executor.ray_cluster import (
    NODE_CALL_S,
    Node,
    NodeLost,
    RayNodeChannel,
    connect,
    head_service,
    live_nodes,
    node_by_id,
    node_facts,
)
from courier.executor.ray_placement import check_feasible, clone_holders, ray_options, resources_of, wants_of
from courier.ops import REGISTRY
from courier.ops.op import Op
from courier.runs.context import Context
from courier.stage_trace import mark
from protocol import limits
from protocol.models import RemoteRequest, RemoteResponse, Result, collector_paused, is_terminal
from protocol.refs import check_run_id, new_run_id
from protocol.timestamps import parse_rfc3339

# What a node's reply carries besides its envelope, taken over as the head's reply.
_BODY = ("logs", "next_offset", "action_times", "warnings")


class RayExecutor(Executor):
    """A Ray head: the runs of every node of its cluster."""

    await_poll_s = 0.5  # each look asks the run's node
    watch_poll_s = 1.0  # each look is a `list` of every node: once a second, not the local 250 ms

    def __init__(self, config: Config) -> None:
        self.config = config
        self.placements = Placements(config.home)
        self._refused: Finding | None = None  # the cluster could not be joined before the request came

    def prepare(self) -> None:
        """Join the cluster before the request is read: every request to a head needs it, and a one-shot
        receiver's join (half a second, docs/ray.md#cost) then overlaps its caller's own start."""
        try:
            self._join()
        except Finding as exc:
            self._refused = exc  # the request reports it; joining again would only wait as long again

    # ----- the executor seam

    def answer(self, op: Op, request: RemoteRequest, response: RemoteResponse, context: Context) -> None:
        if op.cluster != "place":  # a new run's own refusals come first, without a cluster (`_new_run`)
            self._join()
        match op.cluster:
            case "forward":
                self._forward(op, request, response)
            case "fan_out":
                self._fan_out(op, request, response)
            case "place":
                self._place(op, request, response)
            case "head":
                context.runs = self
                op.handle()(request, response, context)
            case _:
                assert_never(op.cluster)

    def _join(self) -> None:
        if self._refused is not None:
            raise self._refused
        assert self.config.ray_address is not None
        connect(self.config.ray_address, self.config.home)

    def run_ids(self, prefix: str) -> list[str]:
        from courier.runs.prefixes import run_ids_under

        return run_ids_under(self.placements.root, prefix, ".json")  # the runs this head placed

    # ----- Runs: how `await`, `watch` and `version` look at the cluster's runs

    def status(self, agent_id: str) -> Result:
        response = _empty("status")
        self._forward(REGISTRY["status"], RemoteRequest.of("status", agent_id=agent_id), response)
        return response.result_of()

    def scan(self) -> dict[str, tuple[Result, float]]:
        listing = _empty("list")
        self._fan_out(REGISTRY["list"], RemoteRequest.of("list"), listing)
        return {result.agent_id: (result, _started(result)) for result in listing.results_of()}

    def describe(self, response: RemoteResponse) -> None:
        from courier.capabilities import DISPATCH_IN_SERVE

        response.capabilities = [*(response.capabilities or []), DISPATCH_IN_SERVE]
        response.executor = "ray"
        response.nodes = node_facts()

    # ----- forward

    def _forward(self, op: Op, request: RemoteRequest, response: RemoteResponse) -> None:
        """Ask the run's node; a run no node holds is the operation's `before_start`'s to answer."""
        placement, node = self._placed(request.agent_id)
        if node is not None:
            try:
                self._adopt(response, self._ask(node, request), placement)
                return
            except NodeLost:  # died since it was listed alive
                node = None
        if op.before_start is None:
            raise AssertionError(f"{op.name} is forwarded but says nothing for a run no node holds")
        if op.before_start(request, response, _Unplaced(self, placement)):
            return
        # A queued run that has just started on a node: ask that node once it holds the run.
        placement, node = self._wait_until_placed(request.agent_id)
        if node is None:
            if op.before_start(request, response, _Unplaced(self, placement, can_cancel=False)):
                return
            raise Finding(f"agent run {request.agent_id} did not reach a node within {NODE_CALL_S:g}s")
        self._adopt(response, self._ask(node, request), placement)

    def _placed(self, agent_id: str) -> tuple[Placement, Node | None]:
        nodes = live_nodes()
        placement = self._located(self.placements.load(agent_id), nodes)
        if placement.phase != PLACED:
            return placement, None
        return placement, next((node for node in nodes if node.node_id == placement.node_id), None)

    def _wait_until_placed(self, agent_id: str) -> tuple[Placement, Node | None]:
        deadline = time.monotonic() + NODE_CALL_S
        placement, node = self._placed(agent_id)
        while placement.phase == QUEUED and time.monotonic() < deadline:
            time.sleep(self.await_poll_s)
            placement, node = self._placed(agent_id)
        return placement, node

    def _located(self, placement: Placement, nodes: list[Node]) -> Placement:
        """Find a queued run on the nodes: its record (it was placed), or its node's refusal (it ended)."""
        if placement.phase != QUEUED:
            return placement
        answers = self._ask_nodes(nodes, RemoteRequest.of("status", agent_id=placement.agent_id))
        for node in nodes:
            reply = answers[node.node_id].response
            if reply is not None and not reply.failure:
                placement.phase, placement.node, placement.node_id = PLACED, node.name, node.node_id
                placement.last = reply.result_of().to_wire()
                self.placements.save(placement)
                return placement
        for node in nodes:
            refused = _refusal(node, placement.agent_id)
            if refused:
                placement.phase, placement.failure, placement.finished_at = ENDED, refused, now()
                placement.node, placement.node_id = node.name, node.node_id
                self.placements.save(placement)
                return placement
        return placement

    def _adopt(self, response: RemoteResponse, reply: RemoteResponse, placement: Placement) -> None:
        """The node's reply as the head's (an in-band refusal raised as its class); the placement keeps
        the last Result seen, so a run whose node goes can still be reported."""
        if reply.failure:
            raise error_for_failure_kind(reply.failure_kind)(reply.failure)
        for key in _BODY:
            setattr(response, key, getattr(reply, key))
        kind = REGISTRY[reply.operation].wire.reply
        if kind == "stop":
            response.set_result(reply.stop_result_of())
        elif kind == "diff":
            response.result = reply.result
        elif reply.has_result():
            result = reply.result_of()
            response.set_result(result)
            if placement.last is None or not is_terminal(str(placement.last.get("state"))):
                placement.last = result.to_wire()
                self.placements.save(placement)

    # ----- fan out

    def _fan_out(self, op: Op, request: RemoteRequest, response: RemoteResponse) -> None:
        nodes = live_nodes()
        with collector_paused():  # every node's reply decoded at once: acyclic, freed by reference counting
            answers = self._ask_nodes(nodes, request)
        kind = op.wire.reply
        if kind == "results":
            self._merge_runs(nodes, answers, response)
        elif kind == "prune":
            self._merge_prune(request, answers, response)
        else:
            raise AssertionError(f"{op.name}: replies of kind {kind} do not merge")

    def _merge_runs(self, nodes: list[Node], answers: dict[str, Any], response: RemoteResponse) -> None:
        """Every run of every live node, then the head's own: queued, ended before start, node lost."""
        results: list[Result] = []
        warnings = []
        with collector_paused():
            lost: set[str] = set()
            for node in nodes:
                reply = _reply_of(answers[node.node_id])
                if reply is None:
                    lost.add(node.node_id)  # died since live_nodes(): its placed runs are lost below
                    continue
                results += reply.results_of()
                warnings += reply.warnings or []
            seen = {result.agent_id for result in results}
            admitting: set[str] = set()
            for placement in self.placements.all():
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

    def _merge_prune(self, request: RemoteRequest, answers: dict[str, Any], response: RemoteResponse) -> None:
        """Every node prunes its own store; the head forgets the placements of runs pruned there."""
        removed: list[Any] = []
        kept = 0
        worktrees: list[Any] = []
        for answer in answers.values():
            reply = _reply_of(answer, lost_is_silent=False)
            assert reply is not None
            body = reply.result or {}
            removed += body.get("removed", [])
            kept += int(body.get("kept_live", 0))
            worktrees += body.get("worktrees", [])
        if not request.dry_run:
            for entry in removed:
                self.placements.remove(str(entry.get("agent_id", "")))
        response.result = {"dry_run": request.dry_run, "removed": removed, "kept_live": kept}
        if request.worktrees:
            response.result["worktrees"] = worktrees

    # ----- place

    def _place(self, op: Op, request: RemoteRequest, response: RemoteResponse) -> None:
        """A new run: on a node Ray chooses (dispatch), or on the node of the run it continues (continue).
        The reply is the run queued; a request repeated with the same new run's ID gets that run now."""
        mark("ray.place")  # docs/benchmarks.md#dispatch-latency
        if op.wire.needs_agent_id:
            new_id = check_run_id(request.new_agent_id) if request.new_agent_id else new_run_id()
            planned = self._continuation(request, new_id)
            request = request.model_copy(update={"new_agent_id": new_id})
        else:
            new_id = check_run_id(request.agent_id) if request.agent_id else new_run_id()
            planned = None if self.placements.exists(new_id) else self._new_run(request, new_id)
            request = request.model_copy(update={"agent_id": new_id})
        if planned is None:  # the same request again (a retried call): that run as it is now
            response.set_result(self.status(new_id))
            return
        placement, options = planned
        mark("ray.checked")  # the profile checked, the nodes with the clone found
        self._submit(request, placement, options)
        mark("ray.submitted")
        response.set_result(placement.queued_result())

    def _new_run(self, request: RemoteRequest, agent_id: str) -> tuple[Placement, dict[str, Any]]:
        from courier.runs.admission import resolve_profile

        resolved, _network = resolve_profile(self.config, request.profile)  # refusals name the file and key
        resources = resources_of(self.config, request.profile)
        wants = wants_of(resources)
        self._join()
        nodes = live_nodes()
        holders, silent = clone_holders(nodes, request.repository) if request.repository else (nodes, [])
        options = ray_options(resources, holders if request.repository else None)
        check_feasible(nodes, holders, options, request.repository, wants, silent)
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
        return placement, options

    def _continuation(self, request: RemoteRequest, new_id: str) -> tuple[Placement, dict[str, Any]] | None:
        """A continuation runs on its parent's node, in the same worktree (a holder task pinned to that node);
        None when `new_id` was placed already."""
        self._join()
        parent = self.status(request.agent_id)
        if not parent.terminal:
            raise Finding(f"agent run {request.agent_id} is still {parent.state}; await it before continuing it")
        parent_placement = self.placements.load(request.agent_id)
        node = node_by_id(parent_placement.node_id)
        if node is None:
            raise NotStartable(f"agent run {request.agent_id} ran on node {parent_placement.node}, which is gone")
        if self.placements.exists(new_id):
            return None
        profile = request.profile or parent.profile
        resources = resources_of(self.config, profile)
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
        return placement, options

    def _submit(self, request: RemoteRequest, placement: Placement, options: dict[str, Any]) -> None:
        """Record the placement, then have its holder task submitted (pending until a node has room)."""
        self.placements.save(placement)
        if placement.pinned_node_id:
            pinned = NodeAffinitySchedulingStrategy(placement.pinned_node_id, False)
            options = {**options, "scheduling_strategy": pinned}
        try:  # the node's long-lived service submits and owns the holder: see NodeService.place
            call = head_service().place.remote(placement.agent_id, request, options)
            refused = ray.get(call, timeout=NODE_CALL_S)
        except ray.exceptions.RayError as exc:
            refused = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if refused:
            self.placements.remove(placement.agent_id)
            raise NotStartable(f"the Ray cluster refused the run: {refused}")

    # ----- asking nodes

    def _ask(self, node: Node, request: RemoteRequest) -> RemoteResponse:
        return asyncio.run(self._ask_async(node, request, NODE_CALL_S))

    async def _ask_async(self, node: Node, request: RemoteRequest, timeout_s: float) -> RemoteResponse:
        """One node's reply through the one caller, its Results named by the node (never `machine`: the
        caller that asked the head names the head)."""
        channel = RayNodeChannel(node)
        secrets = configured_secrets(self.config)
        reply = await ask_over(channel, [], request, request.encode(), timeout_s=timeout_s, secrets=secrets)
        return _named_by(reply, node)

    def _ask_nodes(self, nodes: list[Node], request: RemoteRequest) -> dict[str, Any]:
        """Every node's answer (courier/call/fan_out.py), concurrently, within one call's bound."""

        def asker(node: Node) -> Any:
            return lambda remaining: self._ask_async(node, request, remaining)

        deadline = time.monotonic() + NODE_CALL_S
        return asyncio.run(ask_each({node.node_id: asker(node) for node in nodes}, deadline))


@dataclass
class _Unplaced:
    """A run this head knows that no node holds now (`NotOnANode`, courier/ops/op.py)."""

    executor: RayExecutor
    placement: Placement
    can_cancel: bool = True

    @property
    def phase(self) -> Literal["queued", "ended", "lost"]:
        if self.placement.phase == QUEUED:
            return "queued"
        return "ended" if self.placement.phase == ENDED else "lost"

    @property
    def result(self) -> Result:
        match self.phase:
            case "queued":
                return self.placement.queued_result()
            case "ended":
                return self.placement.ended_result()
            case "lost":
                return self.placement.lost_result()

    @property
    def node(self) -> str:
        return self.placement.node

    def cancel(self) -> bool:
        """Stop it before it starts; it is then recorded `failed` (docs/ray.md#stop-of-a-queued-run)."""
        if not self.can_cancel:
            return False
        try:
            never_started = bool(ray.get(head_service().cancel.remote(self.placement.agent_id), timeout=NODE_CALL_S))
        except ray.exceptions.RayError as exc:
            raise Finding(f"the Ray cluster failed to stop the queued run: {type(exc).__name__}") from None
        if never_started:
            placement = self.placement
            placement.phase, placement.finished_at = ENDED, now()
            placement.failure = "stopped on request before it started"
            self.executor.placements.save(placement)
        return never_started


def _named_by(reply: RemoteResponse, node: Node) -> RemoteResponse:
    """The node's Results with `node` set; `machine`, which the caller set to the node's name, cleared."""
    kind = REGISTRY[reply.operation].wire.reply if reply.operation in REGISTRY else "none"
    if reply.failure:
        return reply
    if kind == "results":
        results = reply.results_of()
        for result in results:
            result.node, result.machine = node.name, None
        reply.set_results(results)
    elif kind == "stop":
        stopped = reply.stop_result_of()
        stopped.machine = None
        reply.set_result(stopped)
    elif kind == "diff" and reply.result is not None:
        reply.result = {key: value for key, value in reply.result.items() if key != "machine"}
    elif kind in ("result", "logs") and reply.has_result():
        result = reply.result_of()
        result.node, result.machine = node.name, None
        reply.set_result(result)
    return reply


def _reply_of(answer: Any, *, lost_is_silent: bool = True) -> RemoteResponse | None:
    """A node's reply from its fan-out answer; None for a node lost meanwhile; any other failure raised."""
    if answer.error is not None:
        if lost_is_silent and isinstance(answer.error, NodeLost):
            return None
        raise answer.error
    reply: RemoteResponse = answer.response
    if reply.failure:
        raise error_for_failure_kind(reply.failure_kind)(reply.failure)
    return reply


def _refusal(node: Node, agent_id: str) -> str:
    from courier.executor.ray_cluster import service

    try:
        text = ray.get(service(node).refusal.remote(agent_id), timeout=NODE_CALL_S)
    except ray.exceptions.RayError:
        return ""
    if not text:
        return ""
    reply = RemoteResponse.model_validate_json(text)
    return f"node {node.name} did not start it: {reply.failure}"


def _empty(operation: str) -> RemoteResponse:
    return RemoteResponse(schema_version=limits.SCHEMA_VERSION, operation=operation)


def _started(result: Result) -> float:
    try:
        return parse_rfc3339(result.started_at).timestamp()
    except ValueError:
        return 0.0
