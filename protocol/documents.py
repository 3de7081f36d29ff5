"""The JSON documents wb prints beyond the wire ones: fleet rows, machine probes, errors (docs/cli.md, wb agent list;
docs/supervisors.md#the-documents)."""

from __future__ import annotations

from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, RootModel, StringConstraints

from protocol import limits
from protocol.models import NodeFacts, PrunedRun, PrunedWorktree, Result

Item = TypeVar("Item")
ErrorClass = Literal["usage", "finding", "transport"]


# Built when first used, not when this module is imported: a command prints one kind of document, and
# building all of them cost every typer command about 20 ms (docs/benchmarks.md, "Deferred documents").
_DEFERRED = ConfigDict(defer_build=True)


class Document(BaseModel):
    """A document wb prints: every field without a default is always present (null when unknown)."""

    model_config = _DEFERRED

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


class OneValue(RootModel[Item], Generic[Item]):
    """A document that is one JSON value (a list, or one of several events), built when first used: a plain
    `RootModel[X]` builds its parametrized class at once."""

    model_config = _DEFERRED


class FleetMachine(Document):
    """One machine's row of `wb agent list --all --json`; the local row has machine ""."""

    machine: str = Field(description='The configured machine name; "" for this machine.')
    ok: bool = Field(description="The machine answered fully.")
    runs: int = Field(ge=0, description="How many of `results` came from this machine (0 when it failed).")
    error: str | None = Field(description="Why the machine did not answer fully, else null.")
    elapsed_ms: int = Field(ge=0, description="How long the machine took to answer.")
    skipped: str | None = Field(
        default=None,
        exclude_if=lambda value: value is None,
        description="Present when the machine was not listed: it shares this machine's WB_HOME.",
    )


class FleetDocument(Document):
    """`wb agent list --all --json`: every run, newest first, and one row per machine."""

    results: list[Result]
    machines: list[FleetMachine]

    def to_json(self) -> dict[str, Any]:
        # A result omits its absent fields, as everywhere; a row keeps its nulls.
        return {"results": [r.to_wire() for r in self.results], "machines": [m.to_json() for m in self.machines]}


# The form of a channel's name, not the list of them: the names are the keys of the channel registry
# on the courier side (docs/protocol.md#channel-names), so a new channel needs no schema change.
CHANNEL_NAME = r"^[a-z][a-z0-9-]{0,31}$"
ChannelName = Annotated[str, StringConstraints(pattern=CHANNEL_NAME)]


class MachineProbe(Document):
    """One row of `wb machines --json`; the probe fields are null without --check."""

    machine: str
    channel: ChannelName | None = Field(
        description=(
            "How the machine is reached: the channel its wb.yaml target names (its key under "
            "session_move.targets.NAME), one of wb's channel registry (docs/protocol.md#channel-names); "
            "a reader must accept a name it does not know. Null when its entry names no channel usably."
        )
    )
    argv: list[str] | None = Field(default=None, description="An exec machine's command (exec rows only).")
    host: str | None = Field(default=None, description="ssh rows only.")
    user: str | None = Field(default=None, description="ssh rows only.")
    port: int | None = Field(default=None, description="ssh rows only.")
    wb_path: str | None
    ok: bool
    error: str | None
    wb_version: str | None
    schema_version: int | None
    rtt_ms: int | None
    clock_offset_ms: int | None = Field(description="The peer's clock minus this machine's.")
    harnesses: list[str] | None = Field(
        description="With --check: the harnesses the peer can run ([] when it lists none)."
    )
    executor: Literal["ray"] | None = Field(
        default=None, description="With --check: ray when the machine heads a Ray cluster (docs/ray.md)."
    )
    nodes: list[NodeFacts] | None = Field(
        default=None, description="With --check on a Ray head: each node's free/total cpus and gpus."
    )
    sandbox: str | None = Field(
        default=None,
        description=(
            "With --check: whether bubblewrap can confine a run there, `bwrap VERSION` or `none: <why>` "
            "(docs/security.md#confined-runs); null without --check, for a machine that did not answer, "
            "or for an older peer that does not say."
        ),
    )

    def to_json(self) -> dict[str, Any]:
        # A row whose channel reaches the machine by a command (its argv) carries argv instead of
        # host, user and port, whatever that channel's name; an exec row always does (argv null
        # when its entry is misconfigured). Any other row has no argv.
        by_command = self.argv is not None or self.channel == "exec"
        dropped = ("host", "user", "port") if by_command else ("argv",)
        return {key: value for key, value in super().to_json().items() if key not in dropped}


class MachinesDocument(OneValue[list[MachineProbe]]):
    """`wb machines --json`: every configured machine, sorted by name."""


class ListDocument(OneValue[list[Result]]):
    """`wb agent list --json`: the runs of one machine, newest first."""

    model_config = _DEFERRED


class LogsDocument(Document):
    """The MCP `logs` tool's answer: the transcript path, then the worker actions (or the raw transcript)."""

    agent_id: str
    machine: str | None = Field(default=None, exclude_if=lambda value: value is None)
    logs: str


def _absent_when_none(value: object) -> bool:
    return value is None


class ActionsDocument(Document):
    """`wb agent logs --json`: the run's last worker actions, oldest first."""

    agent_id: str
    machine: str | None = Field(
        default=None, exclude_if=_absent_when_none, description="The machine holding the run; absent for this machine."
    )
    actions: list[str] = Field(
        description="One worker action each (`ran: …`, `changed 2 files`, `diagnostic: …`) as text output prints it."
    )
    path: str | None = Field(
        default=None,
        exclude_if=_absent_when_none,
        description="The transcript's path on the machine holding it; absent when no transcript was captured.",
    )


class FollowLine(Document):
    """Each line of `wb agent logs --follow --json`: one worker action as it happens; the last line, the run's end."""

    agent_id: str
    machine: str | None = Field(
        default=None, exclude_if=_absent_when_none, description="The machine holding the run; absent for this machine."
    )
    action: str | None = Field(description="One worker action as `logs --json` lists it; null on the last line.")
    state: str | None = Field(description="Null while the run goes on; on the last line, its terminal state.")
    failure: str | None = Field(description="On the last line, why the run failed (null when it did not).")


class StopDocument(Document):
    """`wb agent stop --json`: the stop that was asked."""

    agent_id: str
    machine: str | None = Field(
        default=None, exclude_if=_absent_when_none, description="The machine holding the run; absent for this machine."
    )
    message: str = Field(description="The line the text output prints (`stopping <ref> worker process <pid>`, …).")
    state: str = Field(description="The run's state as the machine recorded it when the stop was asked.")


class PruneDocument(Document):
    """`wb agent prune --json` (one machine): the records removed (or, with --dry-run, that would be)."""

    machine: str | None = Field(
        default=None, exclude_if=_absent_when_none, description="The machine pruned; absent for this machine."
    )
    dry_run: bool
    removed: list[PrunedRun] = Field(description="Oldest first.")
    kept_live: int | None = Field(
        ge=0, description="Records kept because their run is live; null from a machine whose wb does not count them."
    )
    worktrees: list[PrunedWorktree] | None = Field(
        default=None,
        exclude_if=_absent_when_none,
        description="With --worktrees: the worktrees removed, each with its wb/<name> branch (null: branch kept).",
    )


class PruneFleetMachine(PruneDocument):
    """One machine's row of `wb agent prune --all --json`; the local row has machine ""."""

    machine: str = Field(description='The configured machine name; "" for this machine.')
    ok: bool = Field(description="The machine was pruned.")
    error: str | None = Field(description="Why the machine could not be pruned (removed is then []), else null.")


class PruneFleetDocument(Document):
    """`wb agent prune --all --json`: one row per machine, this machine first, then by name."""

    machines: list[PruneFleetMachine]


class ErrorDocument(Document):
    """A refusal: the message wb prints after `error: ` and its class, from the exit code.

    The CLI prints it as text on stderr; the MCP server returns it as a tool error's structured content.
    """

    message: str
    error_class: ErrorClass = Field(
        alias="class", description="usage (exit 2), finding (exit 1) or transport (exit 255)."
    )
    exit_code: int = Field(description="The exit code the CLI gives for the same refusal.")

    model_config = ConfigDict(populate_by_name=True, defer_build=True)


def error_class(exit_code: int) -> ErrorClass:
    if exit_code == limits.EXIT_USAGE:
        return "usage"
    if exit_code == limits.EXIT_TRANSPORT:
        return "transport"
    return "finding"


RunEventName = Literal["running", "queued", "waiting", "dispatched", "started", "stalled", "finished"]


class RunEvent(Document):
    """One run's line of `wb agent watch --json` (docs/cli.md, wb agent watch)."""

    event: RunEventName = Field(
        description="running, queued or waiting (first, per run not terminal); then dispatched, started, stalled, "
        "running (a stalled run wrote again), waiting, finished."
    )
    ref: str = Field(description="The run's reference: its bare ID on this machine, MACHINE:ID elsewhere.")
    state: str = Field(description="The run's state (running until finished, then its terminal state).")
    at: str = Field(description="When watch saw the change (RFC 3339, this machine's clock).")
    result: Result | None = Field(
        default=None, exclude_if=_absent_when_none, description="The run's Result; only on finished."
    )

    def to_json(self) -> dict[str, Any]:
        body = super().to_json()
        if self.result is not None:
            body["result"] = self.result.to_wire()
        return body


class MachineErrorEvent(Document):
    """A machine watch could not ask (it is asked again with backoff; docs/cli.md, wb agent watch)."""

    event: Literal["machine_error"]
    machine: str = Field(description='The configured machine name; "" for this machine.')
    error: str = Field(description="Why it did not answer (the message the CLI would print after error:).")
    at: str = Field(description="When the call failed (RFC 3339, this machine's clock).")


class EventDocument(OneValue[RunEvent | MachineErrorEvent]):
    """One line of `wb agent watch --json`: a run's transition, or a machine that did not answer."""

    model_config = _DEFERRED


class WatchDocument(Document):
    """The MCP `watch` tool's answer: the events seen within its wait, and the cursor to call it again with."""

    events: list[RunEvent | MachineErrorEvent]
    cursor: str = Field(description="Pass it as cursor to the next watch call to get the events after these.")
    idle: bool = Field(description="No watched run is non-terminal (every machine has answered at least once).")

    def to_json(self) -> dict[str, Any]:
        return {"events": [event.to_json() for event in self.events], "cursor": self.cursor, "idle": self.idle}


class ConfigProblem(Document):
    """One problem `wb config check` found."""

    key: str | None = Field(
        description="The dotted key the problem is in (`agents.profiles.fast`, `profiels`); null for the file itself."
    )
    message: str = Field(description="The line the text output prints, naming the key.")


class ConfigCheckDocument(Document):
    """`wb config check --json`: every problem of the wb.yaml wb would use, in file order by section."""

    path: str = Field(description="The file checked (it may be absent: then the built-ins are in use).")
    exists: bool
    ok: bool = Field(description="No problem: the exit code is 0 (else 2).")
    problems: list[ConfigProblem]
