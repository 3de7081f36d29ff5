"""Answer one validated request on this machine: the executor wb.yaml names (this machine's store, or a
cluster's nodes) fills the reply; every refusal is in-band.

The CLI (for this machine, through the local transport) and the receiver (for a caller on
another machine) both call `perform`, so a run behaves the same whoever asks. The operation's
handler module is imported when it is first asked for: the receiver answering `status` loads
the run service, never the supervisor's loop, the configuration or a harness.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import TYPE_CHECKING

from courier import __version__
from courier.errors import UsageError, WbError
from courier.executor import EXECUTORS, Executor
from courier.executor.local import LocalExecutor
from courier.ops import REGISTRY
from courier.runs.context import Context, never_gone
from courier.stage_trace import mark
from protocol import limits
from protocol.models import RemoteRequest, RemoteResponse
from protocol.operations import operation
from protocol.refs import is_run_prefix
from protocol.timestamps import rfc3339, utc_now

if TYPE_CHECKING:  # the receiver does not import the configuration unless it dispatches
    from courier.config import Config


def now_rfc3339() -> str:
    return rfc3339(utc_now())


def named_executor(context: Context) -> str | None:
    """The executor wb.yaml names (`agents.executor.<NAME>`), or None: this machine's own store.

    The receiver reads wb.yaml's settings alone, once per file version (`configured_settings`,
    which the store's home needs anyway): a machine that is not a head pays no lookup of its own.
    """
    if context.config is not None:
        return context.config.executor
    from courier.runs.context import configured_settings

    settings = configured_settings()
    return settings.executor if settings is not None else None


def executor_for(context: Context, *, operation: str = "") -> Executor:
    """The executor that answers on this machine; a named one whose extra is missing is refused (exit 2)."""
    try:
        name = named_executor(context)
    except UsageError:
        if operation == "version":  # `machines --check` still reaches a machine whose wb.yaml is broken
            return LocalExecutor(context)
        raise
    if name is None:
        return LocalExecutor(context)
    target, needs = EXECUTORS[name]
    if context.config is None:
        from courier.config import load_config

        context.config = load_config()  # an executor over other nodes reads the whole configuration
    if needs is not None and importlib.util.find_spec(needs[0]) is None:
        raise UsageError(
            f"{context.config.path}: agents.executor.{name} needs the optional extra {needs[1]} ({needs[2]}): "
            f"install it with pip install '{needs[1]}' in wb's environment"
        )
    from courier.ops.op import load

    executor: Executor = load(target)(context.config)
    return executor


def perform(
    request: RemoteRequest,
    *,
    client_gone: Callable[[], bool] = never_gone,
    config: Config | None = None,
    in_process: bool = False,
    executor: Executor | None = None,
    fresh_login: bool = True,
) -> RemoteResponse:
    """Run one validated request on this machine; every refusal is in-band, never raised.

    `config` is the caller's already-loaded configuration (the CLI); the receiver passes none
    and only dispatch then reads wb.yaml. `in_process`: the asker is this process (see `Context`).
    `executor`: answer with this one, not the one wb.yaml names (a Ray node answers from its own store).
    `fresh_login`: false in a serve session (see `Context`).
    """
    mark("perform.start")  # docs/benchmarks.md#dispatch-latency
    response = RemoteResponse(schema_version=limits.SCHEMA_VERSION, operation=request.operation)
    try:
        context = Context(client_gone, config, in_process, fresh_login=fresh_login)
        op = REGISTRY[operation(request.operation).name]
        executor = executor or executor_for(context, operation=op.name)
        if op.wire.needs_agent_id and is_run_prefix(request.agent_id):
            from courier.runs.prefixes import resolve

            agent_id = resolve(request.agent_id, executor.run_ids(request.agent_id))
            request = request.model_copy(update={"agent_id": agent_id})
        executor.answer(op, request, response, context)
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
