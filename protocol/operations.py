"""The operation table (docs/protocol.md#the-request; docs/cli.md#the-supervisors-loop): one entry per operation, read
by every side.

An entry holds what the operation takes (`fields`, `check`) and what its reply carries
(`reply`). The validator, the receiver and the caller's reply checks all read `TABLE`.
The entries themselves live with the rest of each operation in the courier's operation
modules (courier/ops/), whose registry installs them here when it is imported; this
package stays a leaf that names no courier module (docs/architecture.md, "The seams").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from protocol.models import RemoteRequest
from protocol.rules import RequestRefused

# What a reply carries besides the envelope: one Result, a list of Results, transcript text
# (with a follow call, also the run's Result), stop's own three-field result, a diff, a prune
# summary, or nothing.
Reply = Literal["result", "results", "logs", "stop", "diff", "prune", "none"]


@dataclass(frozen=True)
class Operation:
    name: str
    reply: Reply
    fields: tuple[str, ...] = ()  # the request fields it reads, besides schema_version and operation
    needs_agent_id: bool = False
    check: Callable[[RemoteRequest], None] | None = None
    # An optional feature of Part two: used with a peer only when its `version` lists it.
    capability: str | None = None


# Filled once by the courier's operation registry (courier/ops/__init__.py), in its order.
TABLE: dict[str, Operation] = {}


def install(entries: Iterable[Operation]) -> None:
    """Take the wire entries of every operation; a name given twice is a programming error."""
    for entry in entries:
        if entry.name in TABLE and TABLE[entry.name] is not entry:
            raise ValueError(f"operation {entry.name} is installed twice")
        TABLE[entry.name] = entry


def operation(name: str) -> Operation:
    """The table entry for `name`; an unknown operation is a refusal naming the known ones."""
    if not TABLE:  # validating before the registry ran would refuse every request: say why instead
        raise RuntimeError("no operation table: the courier's operation registry was not imported")
    entry = TABLE.get(name)
    if entry is None:
        raise RequestRefused(f'unknown operation "{name[:64]}": expected one of {", ".join(TABLE)}')
    return entry
