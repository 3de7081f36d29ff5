"""What runs on each Ray node for wb (docs/ray.md#how-a-run-reaches-a-node): two detached actors.

- `NodeService` (one per node, no CPU, pinned to its node): answers a request from the node's
  own store exactly as that machine's receiver would (status, list, logs, diff, stop, prune…).
- `RunHolder` (one per run, with the run's resources): its creation *is* the placement. Ray
  keeps it pending until a node has the resources free, which is the `queued` state; once
  it is placed, it admits the run on its node (the node's ordinary dispatch: worktree, record,
  detached owner) and holds the resources until the run is terminal, then ends itself.

Both are detached: they outlive the process that created them (the head's receiver exits as
soon as it has answered), and a run's owner is started by the node's own dispatch, as on any
machine. The environment is the node's: Ray starts its workers with the environment of
`ray start`, so WB_HOME, WB_PROJECTS_ROOT and WB_CONFIG are the node's own.

Requests are handled here through the registry's handlers, not `courier.operations.perform`:
that function sends a Ray head's requests to the cluster, and a node must answer from its
own store.
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import ray

from courier import __version__
from courier.errors import WbError
from courier.ops import REGISTRY
from courier.runs.context import Context
from courier.runs.store import write_private
from protocol import limits
from protocol.models import RemoteRequest, RemoteResponse
from protocol.timestamps import rfc3339, utc_now

NAMESPACE = "wb"
HOLD_POLL_S = 1.0  # how often a RunHolder looks whether its run is terminal


def answer_here(request: RemoteRequest) -> bytes:
    """The encoded reply this node's receiver would give; every refusal in-band."""
    response = RemoteResponse(schema_version=limits.SCHEMA_VERSION, operation=request.operation)
    try:
        REGISTRY[request.operation].handler()(request, response, Context())
    except WbError as exc:
        response.clear_results()
        response.failure, response.failure_kind = exc.message, exc.failure_kind
    except Exception as exc:
        response.clear_results()
        response.failure, response.failure_kind = f"internal: {type(exc).__name__}: {exc}", "failed"
    response.now = rfc3339(utc_now())
    response.wb_version = __version__
    return response.encode()


def refusal_path(agent_id: str) -> str:
    """Where a run that its node refused to admit leaves the reason (the head reads it via NodeService)."""
    from courier.runs.context import configured_home

    directory = configured_home() / "ray-refused"
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    return str(directory / f"{agent_id}.json")


@ray.remote(num_cpus=0, max_concurrency=16)  # type: ignore[call-overload]  # (actor options are untyped)
class NodeService:
    def answer(self, request: RemoteRequest) -> bytes:
        return answer_here(request)

    def refusal(self, agent_id: str) -> str | None:
        """Why this node refused to admit `agent_id`, or None."""
        with contextlib.suppress(OSError), open(refusal_path(agent_id), encoding="utf-8") as handle:
            return handle.read()
        return None

    def node_id(self) -> str:
        return str(ray.get_runtime_context().get_node_id())

    def place(self, name: str, request: RemoteRequest, options: dict[str, Any]) -> str:
        """Create the run's RunHolder from here; "" when created, else why Ray refused it.

        The head's receiver exits as soon as it has answered, and what an actor is created with
        belongs to its creator: a task larger than Ray inlines (100 KiB) would be lost with the
        receiver while the run is still queued, and a creation request still in flight when it
        exits never reaches Ray (docs/ray.md#how-a-run-reaches-a-node). This service lives as
        long as its node, so it creates the holder and owns the task.
        """
        try:
            holder = RunHolder.options(  # type: ignore[attr-defined]
                name=name, namespace=NAMESPACE, lifetime="detached", **options
            )
            holder.remote(request)
        except (ValueError, ray.exceptions.RayError) as exc:
            return str(exc) or type(exc).__name__
        return ""


@ray.remote(max_restarts=0, max_concurrency=2)  # type: ignore[call-overload]
class RunHolder:
    def __init__(self, request: RemoteRequest) -> None:
        self.agent_id = request.new_agent_id if request.operation == "continue" else request.agent_id
        reply = RemoteResponse.model_validate_json(answer_here(request))
        if reply.failure:
            # Not admitted here (a worktree in use, a missing credential…): the head reports it.
            write_private(Path(refusal_path(self.agent_id)), reply.model_dump_json().encode())
            self._end()
            return
        threading.Thread(target=self._hold, daemon=True).start()

    def _hold(self) -> None:
        """Keep the resources until the run is terminal on this node, then end this actor."""
        probe = RemoteRequest.of("status", agent_id=self.agent_id)
        while True:
            reply = RemoteResponse.model_validate_json(answer_here(probe))
            if reply.failure or reply.result_of().terminal:
                break
            time.sleep(HOLD_POLL_S)
        self._end()

    def _end(self) -> None:
        # A graceful end queued after the constructor (docs: ray.kill's __ray_terminate__).
        ray.get_runtime_context().current_actor.__ray_terminate__.remote()

    def ping(self) -> str:
        return self.agent_id
