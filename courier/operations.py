"""The run operations of one machine: request in, response out.

The CLI (for this machine) and the remote receiver (for a caller on another machine)
both call `perform`, so a run behaves the same whoever asks.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from courier import __version__
from courier.errors import WbError
from protocol import limits
from protocol.models import RemoteRequest, RemoteResponse
from protocol.operations import operation
from protocol.timestamps import rfc3339

if TYPE_CHECKING:  # the receiver does not import the configuration unless it dispatches
    from courier.config import Config


def now_rfc3339() -> str:
    return rfc3339(datetime.now(UTC))


def never_gone() -> bool:
    return False


@dataclass
class Context:
    """What a handler may use besides its request: the caller's configuration (the CLI) and a gone-check."""

    client_gone: Callable[[], bool] = never_gone
    config: Config | None = None


Handler = Callable[[RemoteRequest, RemoteResponse, Context], None]


def handler_of(name: str) -> Handler:
    module_name, function = operation(name).handler.split(":")
    found: Handler = getattr(importlib.import_module(module_name), function)
    return found


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
    response.wb_version = __version__  # on every reply, not only `version` (§5.4)
    return response


def version_op(request: RemoteRequest, response: RemoteResponse, context: Context) -> None:
    from courier.capabilities import capabilities

    response.wb_version = __version__
    response.capabilities = capabilities()
