"""`dispatch --wait` and `--follow`, and `continue --wait` (docs/cli.md#wb-agent-dispatch): start,
then wait as `await` does, with its output and exit codes; a bad combination is refused before anything starts."""

from __future__ import annotations

import json

import pytest
from conftest import Machine


def _facts(lines: list[str]) -> list[str]:
    """await's lines but the process line: the owner may still be exiting when the first await prints."""
    return [line for line in lines if not line.startswith("process:")]


START = ("agent", "dispatch", "--new-worktree", "w1", "--profile", "fake", "--repo", "acme/widget")


def test_dispatch_wait_prints_the_reference_then_the_facts_await_prints(machine: Machine) -> None:
    machine.clone()
    done = machine.wb(*START, "--task", "scenario:complete", "--wait", "--wait-timeout", "60s")
    assert done.returncode == 0, done.stderr
    first, *rest = done.stdout.splitlines()
    ref = first.split()[0]
    assert first.split()[1:3] == ["running", "w1"]
    awaited = machine.wb("agent", "await", ref).stdout.splitlines()
    assert _facts(rest) == _facts(awaited)  # the same facts, line for line

    cont = machine.wb("agent", "continue", ref, "--task", "scenario:complete file:second.txt", "--wait", "--json")
    assert cont.returncode == 0, cont.stderr
    result = json.loads(cont.stdout)  # one document: the awaited run (checked against result.json)
    assert result["state"] == "completed" and result["parent_id"] == ref


def test_dispatch_follow_prints_the_actions_then_the_end_then_the_facts(machine: Machine) -> None:
    machine.clone()
    done = machine.wb(*START, "--task", "scenario:steps steps:2 every:0.2", "--follow")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    ref = lines[0].split()[0]
    ran = [line for line in lines if line.startswith("  ran: ")]
    assert ran == ["  ran: /bin/bash -lc 'echo step 1'", "  ran: /bin/bash -lc 'echo step 2'"]
    end = lines.index(f"{ref} completed")
    assert lines.index(ran[-1]) < end
    facts = machine.wb("agent", "await", ref).stdout.splitlines()
    assert _facts(lines[end + 1 :]) == _facts(facts)


@pytest.mark.parametrize("how", ["--wait", "--follow"])
def test_past_the_wait_bound_it_is_awaits_still_running_exit_1_and_the_run_goes_on(machine: Machine, how: str) -> None:
    machine.clone()
    done = machine.wb(*START, "--task", "scenario:hang", how, "--wait-timeout", "1s")
    assert done.returncode == 1, done.stderr
    ref = done.stdout.split()[0]
    assert done.stderr == f"error: agent run {ref} is still running after the wait bound; it has not finished\n"
    assert json.loads(machine.wb("agent", "status", ref, "--json").stdout)["state"] == "running"
    assert machine.wb("agent", "stop", ref).returncode == 0


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--wait", "--follow"), "error: --wait and --follow: give one (--follow waits too)\n"),
        (("--follow", "--json"), "error: --follow prints worker actions as text; with --json use --wait\n"),
        (("--wait-timeout", "5s"), "error: --wait-timeout bounds --wait or --follow; give one of them\n"),
        (("--wait", "--wait-timeout", "-1s"), None),
    ],
)
def test_a_bad_combination_is_refused_before_anything_starts(
    machine: Machine, flags: tuple[str, ...], message: str | None
) -> None:
    machine.clone()
    done = machine.wb(*START, "--task", "scenario:complete", *flags)
    assert done.returncode == 2 and done.stdout == ""
    if message is None:
        assert done.stderr.startswith("error: ") and "--wait-timeout" in done.stderr, done.stderr
    else:
        assert done.stderr == message
    assert not list((machine.home / "agents").glob("agt-*"))  # no run was started
