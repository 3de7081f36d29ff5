"""A run's owner is a copy of the process that dispatched it (docs/runs.md#the-owner): what it must not take along."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.conftest import Machine, wait_for

PROGRAM = "#!/bin/sh\nexit 0\n"  # never reads its task: the owner's write of it meets a closed pipe


def _command_machine(machine: Machine) -> None:
    program = machine.root / "quick.sh"
    program.write_text(PROGRAM)
    program.chmod(0o700)
    machine.write_config(
        "agents:\n  profiles:\n"
        f'    quick: {{harness: command, command: [{program}], sandbox: "off"}}\n'
    )
    machine.clone()


def _run(machine: Machine, worktree: str, task: Path) -> dict[str, object]:
    done = machine.wb(
        "agent", "dispatch", "--new-worktree", worktree, "--profile", "quick", "--repo", "acme/widget",
        "--task-file", str(task), "--wait", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_a_program_that_leaves_its_task_unread_ends_completed_not_abandoned(machine: Machine) -> None:
    """The owner writes the task to the worker's stdin; a worker that exits first closes that pipe. The owner
    must meet it as an error (SIGPIPE ignored, as in any interpreter), not be ended by it."""
    _command_machine(machine)
    task = machine.root / "task.txt"
    task.write_text("x" * (512 * 1024))  # far more than a pipe holds: the write is still going when the program exits
    for number in range(3):
        result = _run(machine, f"q{number}", task)
        assert (result["state"], result["exit_code"]) == ("completed", 0), result


def test_an_owner_holds_none_of_the_dispatchers_descriptors(machine: Machine) -> None:
    """Copied from the dispatching process (the courier's child, or a cold command), the owner keeps none of its
    descriptors: not the courier's lock, socket or the caller's stdio (a held lock would keep a new courier from
    starting; a held pipe would keep the caller's terminal or an SSH session open)."""
    program = machine.root / "slow.sh"
    marker = machine.root / "owner-fds"
    program.write_text(f"#!/bin/sh\nls -l /proc/$PPID/fd > {marker}\nsleep 30\n")
    program.chmod(0o700)
    machine.write_config(
        f'agents:\n  profiles:\n    slow: {{harness: command, command: [{program}], sandbox: "off"}}\n'
        f"sandbox:\n  writable: [{machine.root}]\n"
    )
    machine.clone()
    done = machine.wb(
        "agent", "dispatch", "--new-worktree", "s1", "--profile", "slow", "--repo", "acme/widget", "--task", "t"
    )
    assert done.returncode == 0, done.stderr
    ref = done.stdout.split()[0]
    try:
        assert wait_for(lambda: marker.exists(), 30)  # the worker runs: its owner has recorded itself
        status = json.loads(machine.wb("agent", "status", ref, "--json").stdout)
        owner = int(str(status["owner_pid"]))
        opened = {os.readlink(f"/proc/{owner}/fd/{fd}") for fd in os.listdir(f"/proc/{owner}/fd")}
        socket_dir = str(machine.home / "run")
        assert not [path for path in opened if path.startswith(socket_dir)], opened  # the courier's lock or socket
        stopped = machine.wb("courier", "stop")
        assert stopped.returncode == 0, stopped.stderr
        again = machine.wb("agent", "status", ref, "--json")  # a new courier starts while the run goes on
        assert again.returncode == 0 and json.loads(again.stdout)["state"] == "running", again.stderr
    finally:
        machine.wb("agent", "stop", ref)
