"""The run operations of one machine: request in, response out, and the registry of their handlers.

The CLI (for this machine) and the remote receiver (for a caller on another machine)
both call `perform`, so a run behaves the same whoever asks.

`HANDLERS` maps every operation of the wire table (protocol/operations.py, which names no
courier module) to the function that answers it here. Each entry is a small loader that
imports its handler's module when that operation is first asked for: the receiver answering
`status` loads the run service, never the supervisor's loop, the configuration or a
harness. No handler module imports this one (their `Context` is in courier/runs/context.py),
so every arrow from here points down.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from courier import __version__
from courier.errors import WbError
from courier.runs.context import Context, Handler, never_gone
from protocol import limits
from protocol.models import RemoteRequest, RemoteResponse
from protocol.operations import operation
from protocol.timestamps import rfc3339, utc_now

if TYPE_CHECKING:  # the receiver does not import the configuration unless it dispatches
    from courier.config import Config


def now_rfc3339() -> str:
    return rfc3339(utc_now())


def version_op(request: RemoteRequest, response: RemoteResponse, context: Context) -> None:
    from courier.capabilities import capabilities

    response.wb_version = __version__
    response.capabilities = capabilities()
    if request.placement:
        from courier.runs.dispatch import placement_facts

        response.placement = placement_facts(context.config, request.repository)


# One loader per operation: a real reference (mypy checks its signature), imported on first use.


def _dispatch() -> Handler:
    from courier.runs.service import dispatch_op

    return dispatch_op


def _status() -> Handler:
    from courier.runs.service import status_op

    return status_op


def _await() -> Handler:
    from courier.runs.service import await_op

    return await_op


def _list() -> Handler:
    from courier.runs.service import list_op

    return list_op


def _logs() -> Handler:
    from courier.runs.service import logs_op

    return logs_op


def _stop() -> Handler:
    from courier.runs.service import stop_op

    return stop_op


def _version() -> Handler:
    return version_op


def _diff() -> Handler:
    from courier.runs.loop_ops import diff_op

    return diff_op


def _continue() -> Handler:
    from courier.runs.loop_ops import continue_op

    return continue_op


def _prune() -> Handler:
    from courier.runs.loop_ops import prune_op

    return prune_op


def _watch() -> Handler:
    from courier.runs.watch_op import watch_op

    return watch_op


HANDLERS: dict[str, Callable[[], Handler]] = {
    "dispatch": _dispatch,
    "status": _status,
    "await": _await,
    "list": _list,
    "logs": _logs,
    "stop": _stop,
    "version": _version,
    "diff": _diff,
    "continue": _continue,
    "prune": _prune,
    "watch": _watch,
}


def handler_of(name: str) -> Handler:
    """The handler of a known operation; an unknown one is the table's refusal naming the known ones."""
    return HANDLERS[operation(name).name]()


def perform(
    request: RemoteRequest,
    *,
    client_gone: Callable[[], bool] = never_gone,
    config: Config | None = None,
) -> RemoteResponse:
    """Run one validated request on this machine; every refusal is in-band, never raised.

    `config` is the caller's already-loaded configuration (the CLI); the receiver passes none
    and only dispatch then reads wb.yaml.
    """
    response = RemoteResponse(schema_version=limits.SCHEMA_VERSION, operation=request.operation)
    try:
        handler_of(request.operation)(request, response, Context(client_gone, config))
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
