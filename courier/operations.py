"""The run operations of one machine: request in, response out.

The CLI (for this machine) and the remote receiver (for a caller on another machine)
both call `perform`, so a run behaves the same whoever asks.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from courier import __version__
from courier.errors import WbError
from protocol import limits
from protocol.models import RemoteRequest, RemoteResponse

if TYPE_CHECKING:  # the receiver does not import the configuration unless it dispatches
    from courier.config import Config


def now_rfc3339() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def never_gone() -> bool:
    return False


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
        _perform(request, response, client_gone, config)
    except WbError as exc:
        response.result = None
        response.results = None
        response.failure = exc.message
        response.failure_kind = exc.failure_kind
    except Exception as exc:
        response.result = None
        response.results = None
        response.failure = f"internal: {type(exc).__name__}: {exc}"
        response.failure_kind = "failed"
    response.now = now_rfc3339()
    return response


def _perform(
    request: RemoteRequest, response: RemoteResponse, client_gone: Callable[[], bool], config: Config | None
) -> None:
    operation = request.operation
    if operation == "version":
        from protocol.models import CAPABILITIES

        response.wb_version = __version__
        response.capabilities = list(CAPABILITIES)
        return
    from courier.runs import service

    service.handle(request, response, client_gone, config)
