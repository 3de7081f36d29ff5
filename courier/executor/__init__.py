"""Executors: where a machine's runs live, and how an operation reaches them (docs/architecture.md#executor).

This machine's own store is the default (`local.py`). A machine whose wb.yaml names
`agents.executor.<NAME>` answers for runs that live elsewhere (a Ray cluster's nodes:
`ray_executor.py`). Each operation says how an executor over several nodes answers it (`Op.cluster`:
forward, fan_out, place, head); an executor implements those four ways once, for every
operation. Adding an executor is one module and one line in `EXECUTORS` (and its wb.yaml key,
courier/config_file.py). Only the `ray*.py` modules import Ray (the optional extra `wb[ray]`);
this module decides, without Ray, whether they are needed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from courier.ops.op import Op
    from courier.runs.context import Context
    from protocol.models import RemoteRequest, RemoteResponse

# An executor's wb.yaml name → "module:Class" (imported only on a machine that names it), and the
# Python package it needs, when one is optional: (import name, the extra that installs it, what it is).
EXECUTORS: dict[str, tuple[str, tuple[str, str, str] | None]] = {
    "ray": ("courier.executor.ray_executor:RayExecutor", ("ray", "wb[ray]", "Ray 2.60")),
}


class Executor(ABC):
    """Where a machine's runs live: it answers every validated request about them."""

    @abstractmethod
    def answer(self, op: Op, request: RemoteRequest, response: RemoteResponse, context: Context) -> None:
        """Fill `response` for one validated request; a refusal is raised (`perform` puts it in band)."""

    @abstractmethod
    def prepare(self) -> None:
        """What every request needs, done before the request is read (a cluster head joins its cluster while
        the request is on its way); a failure is kept and raised by the request that needs it."""

    @abstractmethod
    def run_ids(self, prefix: str) -> list[str]:
        """The IDs of its runs that begin with `prefix` (short references, docs/cli.md#short-references)."""
