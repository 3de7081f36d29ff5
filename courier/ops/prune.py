"""`prune` (docs/cli.md, wb agent prune): remove old run records (and with worktrees, their worktrees)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from courier.errors import WbError
from courier.ops.op import Op
from protocol.models import PruneResult, RemoteRequest
from protocol.operations import Operation
from protocol.rules import RequestRefused

if TYPE_CHECKING:
    from protocol.documents import PruneDocument, PruneFleetDocument


def _check(request: RemoteRequest) -> None:
    if request.older_than_ms < 0:
        raise RequestRefused("older_than_ms must be >= 0")


@dataclass
class PruneOutcome:
    machine: str
    result: PruneResult | None
    error: WbError | None = None


def prune_text(outcomes: list[PruneOutcome], dry_run: bool, worktrees: bool = False) -> tuple[str, list[str]]:
    """(stdout, warnings): one line per removed record (and worktree) and a total."""
    from courier.text import sanitize
    from protocol.refs import format_reference

    verb = "would remove" if dry_run else "removed"
    lines = []
    total = removed_trees = 0
    warnings = []
    for outcome in outcomes:
        if outcome.result is None:
            assert outcome.error is not None
            warnings.append(outcome.error.message)  # a remote error already names its machine
            continue
        for entry in outcome.result.removed:
            ref = format_reference(outcome.machine, entry.agent_id)
            lines.append(f"{verb} {ref} ({sanitize(entry.state)}, finished {sanitize(entry.finished_at)})\n")
            total += 1
        for tree in outcome.result.worktrees or []:
            where = f"{outcome.machine}:" if outcome.machine else ""
            if tree.error:
                warnings.append(f"{where}{sanitize(tree.path)}: {tree.error}")
                continue
            branch = f" and branch {sanitize(tree.branch)}" if tree.branch else ""
            lines.append(f"{verb} worktree {where}{sanitize(tree.path)}{branch}\n")
            removed_trees += 1
    summary = f"{verb} {total} record{'s' if total != 1 else ''}"
    if worktrees:
        summary += f" and {removed_trees} worktree{'s' if removed_trees != 1 else ''}"
    lines.append(summary + "\n")
    return "".join(lines), warnings


def prune_document(outcome: PruneOutcome) -> PruneDocument:
    """`prune --json`: one machine's prune, without --all (a failure was raised before this)."""
    from protocol.documents import PruneDocument

    assert outcome.result is not None
    return PruneDocument(
        machine=outcome.machine or None,
        dry_run=outcome.result.dry_run,
        removed=outcome.result.removed,
        kept_live=outcome.result.kept_live,
        worktrees=outcome.result.worktrees,
    )


def prune_fleet_document(outcomes: list[PruneOutcome], dry_run: bool) -> PruneFleetDocument:
    """`prune --all --json`: a row per machine, in the order asked (this machine first)."""
    from protocol.documents import PruneFleetDocument, PruneFleetMachine

    rows = []
    for outcome in outcomes:
        result = outcome.result
        rows.append(
            PruneFleetMachine(
                machine=outcome.machine,
                ok=result is not None,
                error=outcome.error.message if outcome.error is not None else None,
                dry_run=result.dry_run if result is not None else dry_run,
                removed=result.removed if result is not None else [],
                kept_live=result.kept_live if result is not None else None,
                worktrees=result.worktrees if result is not None else None,
            )
        )
    return PruneFleetDocument(machines=rows)



OP = Op(
    wire=Operation("prune", "prune", ("older_than_ms", "dry_run"), check=_check, capability="prune"),
    handler="courier.runs.loop_ops:prune_op",
    cluster="fan_out",
    printed="prune",
    printed_all="prune-fleet",
)
