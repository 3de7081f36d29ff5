"""This machine's own runs: every operation answered by its handler, from this machine's store."""

from __future__ import annotations

from typing import TYPE_CHECKING

from courier.executor import Executor

if TYPE_CHECKING:
    from courier.ops.op import Op
    from courier.runs.context import Context
    from protocol.models import RemoteRequest, RemoteResponse


class LocalExecutor(Executor):
    """The default: runs start and live here (docs/runs.md)."""

    def __init__(self, context: Context | None = None) -> None:
        self.context = context

    def prepare(self) -> None:
        """Nothing: this machine's store needs nothing before the request."""

    def answer(self, op: Op, request: RemoteRequest, response: RemoteResponse, context: Context) -> None:
        op.handle()(request, response, context)

    def run_ids(self, prefix: str) -> list[str]:
        from courier.runs.context import Context, store_for
        from courier.runs.prefixes import run_ids_under

        return run_ids_under(store_for(self.context or Context()).root, prefix)
