"""The `--json` documents of `logs`, `stop` and `prune` (docs/supervisors.md#the-documents), built from the replies the
text output uses.

Text and JSON come from the same reply and the same wording, so the two never disagree.
"""

from __future__ import annotations

from courier.ops.prune import PruneOutcome
from courier.text import sanitize
from protocol.documents import ActionsDocument, PruneDocument, PruneFleetDocument, PruneFleetMachine, StopDocument
from protocol.models import StopResult
from protocol.refs import format_reference

_ACTION_INDENT = "  "


def actions_document(machine: str, agent_id: str, logs: str) -> ActionsDocument:
    """The logs reply's text (the transcript's path, then one indented action a line) as a document."""
    from courier.runs.service import NO_TRANSCRIPT  # what the first line says when there is no transcript

    lines = logs.removesuffix("\n").split("\n") if logs else []  # not splitlines: U+2028 is no line break here
    head = lines[0] if lines else NO_TRANSCRIPT
    actions = [line.removeprefix(_ACTION_INDENT) for line in lines[1:]]
    return ActionsDocument(
        agent_id=agent_id,
        machine=machine or None,
        actions=actions,
        path=None if head == NO_TRANSCRIPT else head,
    )


def stop_message(machine: str, stopped: StopResult) -> str:
    """What `stop` says happened (docs/cli.md); a reply whose state is terminal signalled nothing."""
    ref = format_reference(machine, stopped.agent_id)
    if stopped.state != "running":
        return f"{ref}: its worker is already gone; recorded as {sanitize(stopped.state)}"
    if stopped.worker_pid:
        return f"stopping {ref} worker process {stopped.worker_pid}"
    return f"stopping {ref} before its worker started"


def stop_document(machine: str, stopped: StopResult) -> StopDocument:
    return StopDocument(
        agent_id=stopped.agent_id,
        machine=machine or None,
        message=stop_message(machine, stopped),
        state=stopped.state,
    )


def prune_document(outcome: PruneOutcome) -> PruneDocument:
    """One machine's prune, without --all (a failure was raised before this)."""
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
