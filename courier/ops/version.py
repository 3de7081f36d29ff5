"""`version`: this machine's wb and schema versions and its capabilities (`wb machines --check` asks it)."""

from __future__ import annotations

from courier import __version__
from courier.ops.base import Op
from courier.runs.context import Context, Handler
from protocol.models import RemoteRequest, RemoteResponse
from protocol.operations import Operation


def version_op(request: RemoteRequest, response: RemoteResponse, context: Context) -> None:
    from courier.capabilities import capabilities

    response.wb_version = __version__
    response.capabilities = capabilities()


def _handler() -> Handler:
    return version_op


OP = Op(wire=Operation("version", "none"), handler=_handler)
