"""Short references (docs/cli.md#short-references): a unique prefix of at least 6 hex digits names a run.

The machine holding the run resolves the prefix among its records; every output carries the
whole ID; an ambiguous prefix is a usage error naming the candidates.
"""

from __future__ import annotations

import json

from conftest import Machine
from tests_support import sample_record

from courier.runs.store import Store

SHARED = "agt-5eed5e"  # the prefix the planted twins share


def _plant(machine: Machine, *suffixes: str) -> list[str]:
    store = Store(machine.home).ensure()
    ids = []
    for suffix in suffixes:
        record = sample_record(agent_id=SHARED + suffix, state="completed", finished_at="2026-12-04T10:00:00.000Z")
        store.create(record, "task")
        ids.append(record.agent_id)
    return ids


def test_a_short_reference_names_its_run_everywhere_and_outputs_print_the_whole_id(machine: Machine) -> None:
    machine.clone()
    ref = machine.dispatch()
    short = ref[: len("agt-") + 6]

    awaited = machine.wb("agent", "await", short, "--json")
    assert awaited.returncode == 0, awaited.stderr
    assert json.loads(awaited.stdout)["agent_id"] == ref and json.loads(awaited.stdout)["state"] == "completed"

    status = machine.wb("agent", "status", short)
    assert status.returncode == 0, status.stderr
    assert f"agent:    {ref}\n" in status.stdout

    logs = machine.wb("agent", "logs", ref[:14])
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout.splitlines()[0].endswith(f"{ref}/events.jsonl")

    actions = machine.wb("agent", "logs", short, "--json")
    assert actions.returncode == 0, actions.stderr
    assert json.loads(actions.stdout)["agent_id"] == ref

    diff = machine.wb("agent", "diff", short, "--json")
    assert diff.returncode == 0, diff.stderr
    assert json.loads(diff.stdout)["agent_id"] == ref


def test_an_ambiguous_prefix_is_refused_naming_the_candidates(machine: Machine) -> None:
    first, second = _plant(machine, "01" + "0" * 24, "7e" + "0" * 24)
    done = machine.wb("agent", "status", SHARED)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert f'ambiguous run ID prefix "{SHARED}": {first[:12]}…, {second[:12]}… (give more digits)' in done.stderr
    assert "Traceback" not in done.stderr
    # One more digit is unique again.
    one = machine.wb("agent", "status", first[:11], "--json")
    assert one.returncode == 0, one.stderr
    assert json.loads(one.stdout)["agent_id"] == first


def test_an_ambiguous_prefix_names_at_most_five_and_cuts_each_where_they_differ(machine: Machine) -> None:
    planted = _plant(machine, *(f"{n:02x}" + "a" * 24 for n in range(7)))
    done = machine.wb("agent", "stop", SHARED)
    assert done.returncode == 2
    named = ", ".join(f"{run_id[:12]}…" for run_id in planted[:5])
    assert f'"{SHARED}": {named} and 2 more (give more digits)' in done.stderr


def test_a_prefix_no_run_has_is_an_unknown_run_and_a_too_short_one_a_usage_error(machine: Machine) -> None:
    _plant(machine, "0" * 26)
    unknown_whole = machine.wb("agent", "status", "agt-" + "f" * 32)
    unknown = machine.wb("agent", "status", "agt-ffffff")
    assert unknown.returncode == unknown_whole.returncode != 0
    assert "unknown agent run agt-ffffff" in unknown.stderr

    short = machine.wb("agent", "status", "agt-5eed5")
    assert short.returncode == 2
    assert 'invalid agent run ID "agt-5eed5"' in short.stderr and "at least the first 6" in short.stderr
