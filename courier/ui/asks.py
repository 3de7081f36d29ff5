"""What the page asks, through the same operations as the CLI (docs/ui.md, "Same operations as the CLI").

Each function is blocking (it goes through `route.ask`, the transport of the machine that
holds the run: local, SSH, exec, the courier); app.py runs them off the event loop. Errors
are the CLI's own `WbError`s, so a refusal shows the message the CLI would print.
"""

from __future__ import annotations

from dataclasses import dataclass

from courier.commands import TIMEOUT_DEFAULT, target
from courier.config import Config, Problem
from courier.errors import WbError
from courier.fleet import MachineRow
from courier.render import sort_results
from courier.route import ask
from protocol.models import DiffResult, RemoteRequest, Result

ACTIONS_SHOWN = 500  # worker actions on a run's first view (the live stream then replays them all)


@dataclass(frozen=True)
class Scope:
    """The machines the page shows: this machine, `--to MACHINE`, or `--all` (this one and every configured one)."""

    machines: tuple[str, ...]
    everything: bool
    machine_timeout_s: float


@dataclass
class FleetView:
    rows: list[MachineRow]
    results: list[Result]


def fleet(config: Config, scope: Scope) -> FleetView:
    """Every machine's row (ok, or its error) and every run, newest first, as `list --all` gathers them."""
    if scope.everything:
        from courier.fleet import gather_all

        answer = gather_all(config, scope.machine_timeout_s)
        return FleetView(answer.rows, answer.results)
    rows = [_one_machine(config, machine, scope.machine_timeout_s) for machine in scope.machines]
    return FleetView(rows, sort_results([result for row in rows for result in row.results]))


def _one_machine(config: Config, machine: str, timeout_s: float) -> MachineRow:
    entry = config.targets.get(machine) if machine else None
    if isinstance(entry, Problem):
        return MachineRow(machine=machine, error=entry.message)
    row = MachineRow(machine=machine)
    try:
        response = ask(config, machine, RemoteRequest.of("list"), timeout_s=timeout_s)
        row.results = response.results_of()
    except WbError as exc:
        row.error = exc.message
        return row
    for result in row.results:
        if machine:
            result.machine = machine
    row.runs, row.ok = len(row.results), not response.warnings
    if response.warnings:
        row.error = f"{len(response.warnings)} unreadable record(s)"
    return row


def parse_ref(reference: str) -> tuple[str, str]:
    """(machine, run ID) of `agt-…` or `MACHINE:agt-…`; a bad one is the CLI's UsageError."""
    return target(reference, None)


def status(config: Config, machine: str, run_id: str, timeout_s: float) -> Result:
    result = ask(config, machine, RemoteRequest.of("status", agent_id=run_id), timeout_s=timeout_s).result_of()
    if machine:
        result.machine = machine
    return result


def diff(config: Config, machine: str, run_id: str) -> DiffResult:
    from courier.ops.diff import diff_of

    return diff_of(ask(config, machine, RemoteRequest.of("diff", agent_id=run_id, stat=False)))


def stop(config: Config, machine: str, run_id: str, timeout_s: float) -> tuple[str, list[str]]:
    """What `wb agent stop` prints: its message, and its warnings (processes that outlived SIGKILL)."""
    from courier.ops.stop import stop_message
    from protocol.refs import format_reference

    response = ask(config, machine, RemoteRequest.of("stop", agent_id=run_id), timeout_s=timeout_s)
    stopped = response.stop_result_of()
    ref = format_reference(machine, run_id)
    return stop_message(machine, stopped), [f"{ref}: {warning.error}" for warning in response.warnings or []]


def continue_run(config: Config, reference: str, task: str) -> Result:
    """`wb agent continue REF --task TEXT` with the run's own profile and the default timeout."""
    from courier.ops.continue_ import build_continue
    from courier.starting import send_starting

    machine, request, new_id = build_continue(
        reference=reference, task=task, task_file=None, profile=None, timeout=TIMEOUT_DEFAULT, to=None
    )
    result = send_starting(config, machine, request, new_id)
    if machine:
        result.machine = machine
    return result


def actions(config: Config, machine: str, run_id: str, timeout_s: float) -> str:
    """The worker actions `wb agent logs` prints (the page's first view; the live stream follows)."""
    from courier.text import sanitize
    call = RemoteRequest.of("logs", agent_id=run_id, tail=ACTIONS_SHOWN, raw=False)
    text = ask(config, machine, call, timeout_s=timeout_s).logs or ""
    lines = sanitize(text, keep_newlines=True).split("\n")[1:]  # the first line is the transcript's path
    return "\n".join(line.removeprefix("  ") for line in lines if line)


def raw_log(config: Config, machine: str, run_id: str, timeout_s: float) -> str:
    """The run's raw transcript as `wb agent logs --raw` reads it (bounded as a reply is), without its path line."""
    from courier.ops.logs import reply_text

    call = RemoteRequest.of("logs", agent_id=run_id, raw=True)
    text = reply_text(call, ask(config, machine, call, timeout_s=timeout_s))
    return text.split("\n", 1)[1] if "\n" in text else ""
