"""The fleet view: `wb agent list --all` and `wb machines` (docs/cli.md, wb agent list).

Every machine is asked concurrently (at most 32 in flight), each bounded by a deadline
that starts when the command starts, so one dead or slow machine cannot hold the
answer hostage: it becomes a failed row with its reason.
"""

from __future__ import annotations

import asyncio
import shlex
import sys
import time
from dataclasses import dataclass, field

from courier.call.fan_out import Answer, Ask, ask_each
from courier.capabilities import harnesses_of
from courier.channels.registry import direct_channel
from courier.client.asking import raise_failure
from courier.client.transport import connections_shared, transport_for
from courier.config import Config, Problem
from courier.errors import Finding, WbError
from courier.ops.list_ import list_lines
from courier.render import sort_results, to_json
from courier.text import clip_bytes, sanitize
from protocol import limits
from protocol.documents import FleetDocument, FleetMachine, MachineProbe
from protocol.models import NodeFacts, RemoteRequest, RemoteResponse, Result
from protocol.refs import format_reference
from protocol.timestamps import parse_rfc3339

DUPLICATE_HOME = "same WB_HOME as this machine"
_ARGV_SHOWN_MAX_BYTES = 60  # an exec machine's command in the HOST column, clipped
_SANDBOX_SHOWN_MAX_BYTES = 120  # a peer's SANDBOX cell, clipped (its reason is foreign text)


@dataclass
class MachineRow:
    machine: str
    ok: bool = False
    runs: int = 0
    error: str | None = None
    elapsed_ms: int = 0
    skipped: str | None = None
    results: list[Result] = field(default_factory=list)

    def document(self) -> FleetMachine:
        return FleetMachine(
            machine=self.machine,
            ok=self.ok,
            runs=self.runs,
            error=self.error,
            elapsed_ms=self.elapsed_ms,
            skipped=self.skipped or None,
        )


@dataclass
class FleetAnswer:
    """Every machine's rows and runs, and the warnings the CLI prints on stderr (without `warning: `)."""

    rows: list[MachineRow]
    results: list[Result]
    warnings: list[str]

    def document(self) -> FleetDocument:
        return FleetDocument(results=self.results, machines=[row.document() for row in self.rows])

    def failed(self) -> list[MachineRow]:
        return [row for row in self.rows if not row.ok]

    def failure(self) -> Finding:
        return Finding(f"{len(self.failed())} of {len(self.rows)} machine(s) did not answer fully (named above)")


def _request(operation: str) -> RemoteRequest:
    return RemoteRequest.of(operation)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, WbError):
        return sanitize(exc.message)
    return f"internal: {type(exc).__name__}: {exc}"


def _machines(config: Config) -> list[str]:
    return sorted(name for name, entry in config.targets.items() if not isinstance(entry, Problem))


async def _ask_all(config: Config, machines: list[str], operation: str, deadline: float) -> dict[str, Answer]:
    """One call per machine ("" = this one) over its transport, concurrently, each bounded by the shared deadline."""
    request = _request(operation)

    def asker(machine: str) -> Ask:
        async def ask(remaining: float) -> RemoteResponse:
            return await transport_for(config, machine).ask_async(request, timeout_s=remaining)

        return ask

    askers = {machine: asker(machine) for machine in machines}
    if any(machines):
        async with connections_shared():  # one connection per host: aliases of one sshd share it
            # (docs/cli.md, wb agent list)
            return await ask_each(askers, deadline)
    return await ask_each(askers, deadline)


def _list_row(machine: str, answer: Answer, own_home: str | None, warnings: list[str]) -> MachineRow:
    """One machine's row of `list --all` from its answer (this machine's too); unreadable records go to `warnings`."""
    row = MachineRow(machine=machine, elapsed_ms=answer.elapsed_ms)
    response, error = answer.response, answer.error
    if error is not None or response is None:
        row.error = _reason(error) if error else "no answer"
        return row
    if machine and own_home and response.home_id == own_home:
        row.ok, row.skipped = True, DUPLICATE_HOME
        return row
    try:
        raise_failure(machine, response)
        row.results = response.results_of()
    except WbError as exc:
        row.error = exc.message
        return row
    row.runs = len(row.results)
    row.ok = not response.warnings
    if response.warnings:
        row.error = f"{len(response.warnings)} unreadable record(s)"
        warnings.extend(f"{format_reference(machine, w.agent_id)}: {sanitize(w.error)}" for w in response.warnings)
    return row


def _named(machine: str, error: str) -> str:
    """`warning: <machine>: …` (the form scripts split on), the machine not named twice when the
    error already begins with `<machine>: `."""
    if error.startswith(f"{machine}: "):
        return error
    return f"{machine}: {error}"


def list_all(config: Config, machine_timeout_s: float, *, as_json: bool, stalled_only: bool = False) -> None:
    """This machine's runs and every configured machine's; partial answers exit 1 with reasons."""
    answer = gather_all(config, machine_timeout_s, stalled_only=stalled_only)
    if as_json:
        sys.stdout.write(to_json(answer.document().to_json()))
    else:
        sys.stdout.write(list_lines(answer.results))
    sys.stdout.flush()
    for text in answer.warnings:
        sys.stderr.write(f"warning: {text}\n")
    if answer.failed():
        raise answer.failure()


def gather_all(config: Config, machine_timeout_s: float, *, stalled_only: bool = False) -> FleetAnswer:
    """Ask this machine and every configured one; prints nothing (the MCP server calls it too)."""
    from courier.runs.store import Store, home_id

    deadline = time.monotonic() + machine_timeout_s
    machines = ["", *_machines(config)]
    answers = asyncio.run(_ask_all(config, machines, "list", deadline))
    own_home = home_id(Store(config.home))
    warnings: list[str] = []
    rows: list[MachineRow] = []
    for machine in ["", *sorted(config.targets)]:
        entry = config.targets.get(machine)
        if isinstance(entry, Problem):
            rows.append(MachineRow(machine=machine, error=entry.message))
        else:
            rows.append(_list_row(machine, answers[machine], own_home, warnings))

    results = sort_results([result for row in rows for result in row.results])
    if stalled_only:
        from courier.render import is_stalled

        results = [result for result in results if is_stalled(result)]
    warnings.extend(_named(row.machine, row.error or "") for row in rows if not row.ok and row.machine)
    return FleetAnswer(rows, results, warnings)


@dataclass
class ProbeRow:
    machine: str
    channel: str | None = None  # "ssh" or "exec" (docs/cli.md, machines)
    argv: list[str] | None = None  # an exec machine's command, in place of host, user and port
    host: str | None = None
    user: str | None = None
    port: int | None = None
    wb_path: str | None = None
    ok: bool = False
    error: str | None = None
    wb_version: str | None = None
    schema_version: int | None = None
    rtt_ms: int | None = None
    clock_offset_ms: int | None = None
    harnesses: list[str] | None = None  # from the peer's capabilities; [] when it lists none
    executor: str | None = None  # "ray" on a Ray head (docs/ray.md#machines---check)
    nodes: list[NodeFacts] | None = None
    # Text only (`--check`): the user and port the connection uses, as the ssh config resolves them.
    # JSON keeps wb.yaml's values (docs/cli.md, machines).
    resolved: tuple[str, int] | None = field(default=None, repr=False)
    sandbox: str | None = None  # `bwrap 0.8.0` or `none: <why>`, from the peer's version reply

    def document(self) -> MachineProbe:
        return MachineProbe(**{key: value for key, value in self.__dict__.items() if key != "resolved"})

    def address(self) -> list[str]:
        """The HOST, USER and PORT cells; an exec machine shows its command under HOST."""
        if self.argv is not None:
            return [clip_bytes(shlex.join(self.argv), _ARGV_SHOWN_MAX_BYTES), "-", "-"]
        if self.resolved is not None:
            return [self.host or "-", self.resolved[0], str(self.resolved[1])]
        return [self.host or "-", self.user or "-", str(self.port or "-")]


def _offset_ms(now: str | None, sent: float, received: float) -> int | None:
    if not now:
        return None
    try:
        peer = parse_rfc3339(now).timestamp()
    except ValueError:
        return None
    return int((peer - (sent + received) / 2) * limits.MS_PER_SECOND)


def show_machines(config: Config, *, check: bool, as_json: bool, machine_timeout_s: float) -> None:
    rows = probe_machines(config, check=check, machine_timeout_s=machine_timeout_s)
    if as_json:
        sys.stdout.write(to_json([row.document().to_json() for row in rows]))
    else:
        sys.stdout.write(_machines_table(rows, check))
    sys.stdout.flush()
    if not all(row.ok for row in rows):
        raise machines_failure(rows)


def machines_failure(rows: list[ProbeRow]) -> Finding:
    return Finding(f"{sum(not row.ok for row in rows)} machine(s) not healthy (see the table)")


def probe_machines(config: Config, *, check: bool, machine_timeout_s: float) -> list[ProbeRow]:
    """Every configured machine's row, probed with `version` when asked; prints only clock warnings (stderr)."""
    rows: list[ProbeRow] = []
    for machine in sorted(config.targets):
        entry = config.targets[machine]
        if isinstance(entry, Problem):
            rows.append(ProbeRow(machine=machine, channel=entry.channel, error=entry.message))
        else:
            channel = direct_channel(machine, entry)
            row = ProbeRow(machine=machine, ok=True, **channel.machines_row())
            if check:
                row.resolved = channel.resolved_address()
            rows.append(row)
    if check and rows:
        deadline = time.monotonic() + machine_timeout_s
        answers = asyncio.run(_ask_all(config, _machines(config), "version", deadline))
        for row in rows:
            if row.machine in answers:
                _apply_probe(row, answers[row.machine])
    return rows


def _apply_probe(row: ProbeRow, answer: Answer) -> None:
    row.rtt_ms = answer.elapsed_ms
    response, error = answer.response, answer.error
    if error is not None or response is None:
        row.ok = False
        cause = getattr(error, "cause", "") or "error"
        row.error = f"{cause}: {_reason(error)}" if error else "no answer"
        return
    if response.failure:
        row.ok = False
        row.error = f"too old: the peer refuses the version operation ({sanitize(response.failure)[:200]})"
        return
    row.wb_version = response.wb_version
    row.schema_version = response.schema_version
    row.harnesses = harnesses_of(response.capabilities)
    row.executor, row.nodes = response.executor, response.nodes
    row.sandbox = response.sandbox
    row.clock_offset_ms = _offset_ms(response.now, answer.sent_at, answer.received_at)
    if row.clock_offset_ms is not None and abs(row.clock_offset_ms) > limits.CLOCK_OFFSET_WARN_MS:
        sys.stderr.write(
            f"warning: {row.machine}: clock differs from this machine's by "
            f"{row.clock_offset_ms / limits.MS_PER_SECOND:.1f}s\n"
        )


def _machines_table(rows: list[ProbeRow], check: bool) -> str:
    if not rows:
        return "no machines configured (add them under session_move.targets in wb.yaml)\n"
    header = ["MACHINE", "CHANNEL", "HOST", "USER", "PORT", "WB_PATH", "OK"]
    if check:
        header += ["WB", "SCHEMA", "RTT", "CLOCK", "HARNESSES", "SANDBOX"]
    header.append("ERROR")
    table = [header]
    for r in rows:
        line = [r.machine, r.channel or "-", *r.address(), r.wb_path or "wb", "yes" if r.ok else "no"]
        if check:
            line += [
                r.wb_version or "-",
                str(r.schema_version or "-"),
                f"{r.rtt_ms}ms" if r.rtt_ms is not None else "-",
                clock_cell(r.clock_offset_ms, r.rtt_ms),
                ",".join(r.harnesses) if r.harnesses else "-",
                _sandbox_cell(r),
            ]
        line.append(sanitize(r.error or ""))
        table.append(line)
    widths = [max(len(row[i]) for row in table) for i in range(len(header) - 1)]
    return "".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)).rstrip()
        + ("  " + row[-1] if row[-1] else "")
        + "\n"
        for row in table
    ) + "".join(executor_lines(r) for r in rows)


def clock_cell(offset_ms: int | None, rtt_ms: int | None) -> str:
    """The CLOCK cell: `ok` when the offset is within what one call can measure (|offset| ≤ RTT + 1 s:
    the peer stamps its clock somewhere inside the round trip), else the signed offset."""
    if offset_ms is None:
        return "-"
    if abs(offset_ms) <= (rtt_ms or 0) + limits.CLOCK_OFFSET_RESOLUTION_S * limits.MS_PER_SECOND:
        return "ok"
    return f"{offset_ms:+d}ms"


def _sandbox_cell(row: ProbeRow) -> str:
    """`bwrap 0.8.0`, `none: <why>`; `unknown` for a peer that answered without saying (older wb)."""
    if row.sandbox is not None:
        return clip_bytes(sanitize(row.sandbox), _SANDBOX_SHOWN_MAX_BYTES)
    return "unknown" if row.wb_version is not None else "-"


def executor_lines(row: ProbeRow) -> str:
    """Below the table, for a machine that heads a Ray cluster: its executor and nodes (docs/ray.md)."""
    if row.executor is None:
        return ""
    nodes = row.nodes or []
    lines = [f"{row.machine}: executor: {row.executor}, {len(nodes)} node{'' if len(nodes) == 1 else 's'}\n"]
    for n in nodes:
        state = "" if n.alive else " (lost)"
        lines.append(
            f"  {sanitize(n.node)}{state}: cpus {n.cpus_free:g}/{n.cpus_total:g} free, "
            f"gpus {n.gpus_free:g}/{n.gpus_total:g} free\n"
        )
    return "".join(lines)
