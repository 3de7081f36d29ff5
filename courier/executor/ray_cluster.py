"""The Ray cluster as the head sees it (docs/ray.md): joining it, its live nodes, each node's service, and the
channel a request travels to a node's service.

A node answers a request exactly as its own receiver would, from its own store (`NodeService.answer_bytes`,
courier/executor/ray_node.py); the head reaches it through `RayNodeChannel`, a channel like ssh's or
exec's (courier/channels/channel.py), so the head's calls go through the one caller (courier/call/caller.py):
the same validation, bounds, decoding and checks as every other machine's replies.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from courier.channels.channel import DEFAULT_BOUNDS, Bounds, Channel, Outcome
from courier.errors import Finding
from courier.executor.ray_keeper import ensure_keeper
from courier.executor.ray_node import NAMESPACE, service_handle, service_name
from protocol.models import NodeFacts

NODE_LABEL = "wb-node"  # a node's name for wb: `ray start --labels wb-node=NAME` (docs/ray.md#set-up)
NODE_ID_LABEL = "ray.io/node-id"  # Ray's own label of every node: its node ID (Ray 2.60)
NODE_CALL_S = 60.0  # the bound of one call to a node's service
# How often a call to a node whose service is unavailable asks the GCS again whether the node lives.
_NODE_RECHECK_S = 0.5

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


def node_by_id(node_id: str) -> Node | None:
    return next((node for node in live_nodes() if node.node_id == node_id), None)


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
            handle = _services[node_id] = service_handle(node_id)
        return handle


def head_service() -> Any:
    """The service of the node this process runs on (the head's): it submits and owns the holder tasks."""
    return service_on(_here())


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


class RayNodeChannel(Channel):
    """A node's service as a channel: the request's bytes in, the node's one reply document out."""

    kind = "ray-node"

    def __init__(self, node: Node) -> None:
        super().__init__(node.name, None)
        self.node = node

    @property
    def where(self) -> str:
        return f"node {self.node.name} of the Ray cluster"

    def classify_exit(self, outcome: Outcome) -> None:
        del outcome  # a node's service answers in-band or raises: there is no exit to classify

    async def run(self, tail: list[str], stdin: bytes, bounds: Bounds = DEFAULT_BOUNDS) -> Outcome:
        del tail  # the service is the receiver: nothing is started by name
        reply = await asyncio.to_thread(self._answer, stdin)
        if len(reply) > bounds.stdout_max:
            return Outcome(reply[: bounds.stdout_max], b"", None, None, overflow="stdout")
        return Outcome(stdout=reply, stderr=b"", exit_status=0, exit_signal=None)

    def _answer(self, payload: bytes) -> bytes:
        """The node's reply. A node that has just died looks alive in the GCS for a few health checks while
        its service is already unavailable: the call is asked again until either the service answers or the
        GCS says the node is gone (NodeLost), within NODE_CALL_S."""
        node = self.node
        deadline = time.monotonic() + NODE_CALL_S
        while True:
            try:
                call = service(node).answer_bytes.remote(payload)
                return bytes(ray.get(call, timeout=max(1.0, deadline - time.monotonic())))
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
                    raise Finding(
                        f"node {node.name} of the Ray cluster failed to answer: {type(exc).__name__}"
                    ) from None
                time.sleep(_NODE_RECHECK_S)
            except ray.exceptions.RayError as exc:
                raise Finding(f"node {node.name} of the Ray cluster failed to answer: {type(exc).__name__}") from None


def node_facts() -> list[NodeFacts]:
    """Each node's free and total cpus and gpus (`wb machines --check`, docs/ray.md#machines---check)."""
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
