"""What the page asks, through the one client the CLI uses (docs/ui.md, "Same operations as the CLI").

Each function is blocking (courier/client/client.py: the transport of the machine that holds
the run, local, SSH, exec, the courier); app.py runs them off the event loop. Errors are the
CLI's own `WbError`s, so a refusal shows the message the CLI would print.
"""

from __future__ import annotations

from dataclasses import dataclass

from courier.client.client import Client
from courier.client.fleet import MachineRow
from courier.commands import TIMEOUT_DEFAULT, target
from courier.config import Problem
from courier.errors import WbError
from courier.render import sort_results
from protocol.models import DiffResult, Result

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


def fleet(client: Client, scope: Scope) -> FleetView:
    """Every machine's row (ok, or its error) and every run, newest first, as `list --all` gathers them."""
    if scope.everything:
        answer = client.fleet(scope.machine_timeout_s)
        return FleetView(answer.rows, answer.results)
    rows = [_one_machine(client, machine, scope.machine_timeout_s) for machine in scope.machines]
    return FleetView(rows, sort_results([result for row in rows for result in row.results]))


def _one_machine(client: Client, machine: str, timeout_s: float) -> MachineRow:
    entry = client.config.targets.get(machine) if machine else None
    if isinstance(entry, Problem):
        return MachineRow(machine=machine, error=entry.message)
    row = MachineRow(machine=machine)
    try:
        response = client.list_(machine, timeout_s=timeout_s)
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


def status(client: Client, machine: str, run_id: str, timeout_s: float) -> Result:
    result = client.status(machine, run_id, timeout_s=timeout_s)
    if machine:
        result.machine = machine
    return result


def diff(client: Client, machine: str, run_id: str) -> DiffResult:
    return client.diff(machine, run_id)


def stop(client: Client, machine: str, run_id: str, timeout_s: float) -> tuple[str, list[str]]:
    """What `wb agent stop` prints: its message, and its warnings (processes that outlived SIGKILL)."""
    from courier.ops.stop import stop_message

    stopped, warnings = client.stopped(machine, run_id, timeout_s=timeout_s)
    return stop_message(machine, stopped), warnings


def continue_run(client: Client, reference: str, task: str) -> Result:
    """`wb agent continue REF --task TEXT` with the run's own profile and the default timeout."""
    from courier.ops.continue_ import build_continue

    machine, request, new_id = build_continue(
        reference=reference, task=task, task_file=None, profile=None, timeout=TIMEOUT_DEFAULT, to=None
    )
    result = client.start(machine, request, new_id)
    if machine:
        result.machine = machine
    return result


def actions(client: Client, machine: str, run_id: str, timeout_s: float) -> str:
    """The worker actions `wb agent logs` prints (the page's first view; the live stream follows)."""
    from courier.ops.logs import logs_request
    from courier.text import sanitize

    _, call = logs_request(run_id, machine or None, tail=ACTIONS_SHOWN, raw=False)
    text = client.logs(machine, call, timeout_s=timeout_s).logs or ""
    lines = sanitize(text, keep_newlines=True).split("\n")[1:]  # the first line is the transcript's path
    return "\n".join(line.removeprefix("  ") for line in lines if line)


def raw_log(client: Client, machine: str, run_id: str, timeout_s: float) -> str:
    """The run's raw transcript as `wb agent logs --raw` reads it (bounded as a reply is), without its path line."""
    from courier.ops.logs import logs_request, reply_text
    from protocol import limits

    _, call = logs_request(run_id, machine or None, tail=limits.LOGS_TAIL_DEFAULT, raw=True)
    text = reply_text(call, client.logs(machine, call, timeout_s=timeout_s))
    return text.split("\n", 1)[1] if "\n" in text else ""
