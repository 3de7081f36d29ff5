"""The run operations of one machine: request in, response out, and the registry of their handlers.

The CLI (for this machine) and the remote receiver (for a caller on another machine)
both call `perform`, so a run behaves the same whoever asks.

Every operation module of the registry (courier/ops/) holds the loader of the function that
answers it here. A loader imports its handler's module when that operation is first
asked for: the receiver answering `status` loads the run service, never the supervisor's
loop, the configuration or a harness. No handler module imports this one (their `Context`
is in courier/runs/context.py), so every arrow from here points down.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from courier import __version__
from courier.errors import WbError
from courier.executor import cluster_handler
from courier.ops import REGISTRY
from courier.runs.context import Context, Handler, never_gone
from protocol import limits
from protocol.models import RemoteRequest, RemoteResponse
from protocol.operations import operation
from protocol.refs import is_run_prefix
from protocol.timestamps import rfc3339, utc_now

if TYPE_CHECKING:  # the receiver does not import the configuration unless it dispatches
    from courier.config import Config


def now_rfc3339() -> str:
    return rfc3339(utc_now())


def handler_of(name: str) -> Handler:
    """The handler of a known operation; an unknown one is the table's refusal naming the known ones."""
    return REGISTRY[operation(name).name].handler()


def _prefix_resolved(request: RemoteRequest, context: Context, *, on_cluster: bool) -> RemoteRequest:
    """The request with its short reference resolved among this machine's runs (a Ray head: those it placed)."""
    from courier.runs.prefixes import resolve, run_ids_under

    if on_cluster:
        from courier.executor.placements import Placements

        assert context.config is not None  # cluster_handler loaded it
        root, suffix = Placements(context.config.home).root, ".json"
    else:
        from courier.runs.context import store_for

        root, suffix = store_for(context).root, ""
    agent_id = resolve(request.agent_id, run_ids_under(root, request.agent_id, suffix))
    return request.model_copy(update={"agent_id": agent_id})


def perform(
    request: RemoteRequest,
    *,
    client_gone: Callable[[], bool] = never_gone,
    config: Config | None = None,
    in_process: bool = False,
) -> RemoteResponse:
    """Run one validated request on this machine; every refusal is in-band, never raised.

    `config` is the caller's already-loaded configuration (the CLI); the receiver passes none
    and only dispatch then reads wb.yaml. `in_process`: the asker is this process (see `Context`).
    """
    response = RemoteResponse(schema_version=limits.SCHEMA_VERSION, operation=request.operation)
    try:
        context = Context(client_gone, config, in_process)
        # On a Ray head (agents.executor.ray) the cluster answers for all its nodes (docs/ray.md).
        cluster = cluster_handler(request.operation, context)
        if operation(request.operation).needs_agent_id and is_run_prefix(request.agent_id):
            request = _prefix_resolved(request, context, on_cluster=cluster is not None)
        handler = cluster or handler_of(request.operation)
        handler(request, response, context)
    except WbError as exc:
        response.clear_results()
        response.failure = exc.message
        response.failure_kind = exc.failure_kind
    except Exception as exc:
        response.clear_results()
        response.failure = f"internal: {type(exc).__name__}: {exc}"
        response.failure_kind = "failed"
    response.now = now_rfc3339()
    response.wb_version = __version__  # on every reply, not only `version` (docs/protocol.md#the-receivers-rules)
    return response
