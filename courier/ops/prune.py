"""`prune` (contract §15, §22): remove old run records (and with worktrees, their worktrees)."""

from __future__ import annotations

from courier.ops.base import Op
from courier.runs.context import Handler
from protocol.models import RemoteRequest
from protocol.operations import Operation
from protocol.rules import RequestRefused


def _check(request: RemoteRequest) -> None:
    if request.older_than_ms < 0:
        raise RequestRefused("older_than_ms must be >= 0")


def _handler() -> Handler:
    from courier.runs.loop_ops import prune_op

    return prune_op


OP = Op(
    wire=Operation("prune", "prune", ("older_than_ms", "dry_run"), check=_check, capability="prune"),
    handler=_handler,
    printed="prune",
    printed_all="prune-fleet",
)
