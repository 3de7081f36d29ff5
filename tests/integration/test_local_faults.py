"""Faults and races on one machine: concurrency, lost saves, corrupt records, closed pipes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Machine, wait_for

from courier.executor.perform import perform
from courier.runs import store as store_mod
from courier.runs.store import Store
from protocol.models import RemoteRequest


def _records(machine: Machine) -> list[Path]:
    return sorted((machine.home / "agents").glob("agt-*"))


def test_twenty_concurrent_dispatches_make_twenty_intact_runs(machine: Machine) -> None:
    machine.clone()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "courier.main",
                "agent",
                "dispatch",
                "--new-worktree",
                f"c{i}",
                "--profile",
                "fake",
                "--repo",
                "acme/widget",
                "--task",
                "scenario:complete",
            ],
            env=machine.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(20)
    ]
    refs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        refs.append(out.split()[0])
    assert len(set(refs)) == 20
    for ref in refs:
        done = machine.wb("agent", "await", ref, "--json", "--wait-timeout", "120s")
        assert done.returncode == 0 and json.loads(done.stdout)["state"] == "completed", done.stderr
    assert len(_records(machine)) == 20
    listed = machine.wb_json("agent", "list")
    assert sorted(r["agent_id"] for r in listed) == sorted(refs)  # type: ignore[union-attr, index]


def test_a_second_dispatch_into_a_busy_worktree_is_refused_naming_the_run(machine: Machine) -> None:
    machine.clone()
    ref = machine.dispatch(task="scenario:hang")
    done = machine.wb("agent", "dispatch", "--use-worktree", "w1", "--profile", "fake", "--task", "x")
    assert done.returncode == 1 and f"in use by run {ref}" in done.stderr
    assert len(_records(machine)) == 1
    machine.wb("agent", "stop", ref)
    assert machine.wb("agent", "await", ref).returncode == 0
    again = machine.wb("agent", "dispatch", "--use-worktree", "w1", "--profile", "fake", "--task", "scenario:complete")
    assert again.returncode == 0, again.stderr


def test_the_same_agent_id_dispatched_twice_is_one_run(machine: Machine, monkeypatch: pytest.MonkeyPatch) -> None:
    machine.clone()
    for key, value in machine.env.items():
        monkeypatch.setenv(key, value)
    request = RemoteRequest(
        schema_version=1,
        operation="dispatch",
        mode="new",
        worktree="w1",
        profile="fake",
        task="scenario:complete",
        repository="acme/widget",
        timeout_ms=60_000,
        agent_id="agt-" + "ab" * 16,
    )
    first = perform(request)
    second = perform(request)
    assert not first.failure and not second.failure, (first.failure, second.failure)
    assert first.result_of().agent_id == second.result_of().agent_id == request.agent_id
    assert len(_records(machine)) == 1


def test_a_save_that_fails_halfway_leaves_the_previous_record_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests_support import sample_record

    store = Store(tmp_path / "home").ensure()
    record = sample_record()
    store.create(record, "task")
    path = store.run_dir(record.agent_id) / "run.json"
    before = path.read_bytes()

    def failing_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store_mod.os, "fsync", failing_fsync)
    record.state = "completed"
    with pytest.raises(OSError):
        store.save(record)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []


def test_a_corrupt_record_is_named_and_the_good_ones_still_listed(machine: Machine) -> None:
    machine.clone()
    good = machine.dispatch()
    machine.wb("agent", "await", good)
    bad = "agt-" + "f" * 32
    (machine.home / "agents" / bad).mkdir(mode=0o700)
    (machine.home / "agents" / bad / "run.json").write_text("{not json")
    linked = "agt-" + "e" * 32
    (machine.home / "agents" / linked).symlink_to(machine.home / "agents" / good)
    done = machine.wb("agent", "list")
    assert done.returncode == 1
    assert done.stdout.startswith(good)
    assert f"warning: {bad}: " in done.stderr and "corrupt" in done.stderr
    assert f"warning: {linked}: symlinked run directory skipped" in done.stderr
    as_json = machine.wb("agent", "list", "--json")
    assert as_json.returncode == 1 and [r["agent_id"] for r in json.loads(as_json.stdout)] == [good]


def test_list_into_a_closed_pipe_exits_141_without_a_traceback(machine: Machine) -> None:
    machine.clone()
    ref = machine.dispatch()
    machine.wb("agent", "await", ref)
    source = machine.home / "agents" / ref
    for i in range(3000):  # enough rows that the reader closes before we finish writing
        clone_id = f"agt-{i:032x}"
        shutil.copytree(source, machine.home / "agents" / clone_id, symlinks=True)
        record = json.loads((source / "run.json").read_text())
        record["agent_id"] = clone_id
        (machine.home / "agents" / clone_id / "run.json").write_text(json.dumps(record))
    done = subprocess.run(
        ["bash", "-c", f'{sys.executable} -m courier.main agent list | head -1; echo "rc=${{PIPESTATUS[0]}}" >&2'],
        env=machine.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "rc=141" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and len(done.stdout.splitlines()) == 1


def test_owner_started_after_the_grace_records_failed(machine: Machine) -> None:
    from tests_support import sample_record

    store = Store(machine.home).ensure()
    record = sample_record()
    record.started_at = "2020-01-01T00:00:00.000Z"
    run_dir = store.create(record, "task")
    done = subprocess.run(
        [sys.executable, "-m", "courier.main", "--wb-internal-agent-run", "--run-dir", str(run_dir)],
        env=machine.env,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0
    saved = store.load(record.agent_id)
    assert saved.state == "failed" and "owner started too late" in str(saved.failure)


def test_a_run_never_owned_is_running_within_the_grace_then_abandoned(machine: Machine) -> None:
    from tests_support import sample_record

    store = Store(machine.home).ensure()
    record = sample_record()
    store.create(record, "task")
    assert machine.wb_json("agent", "status", record.agent_id)["state"] == "running"  # type: ignore[index]
    record.started_at = "2020-01-01T00:00:00.000Z"
    store.save(record)
    assert machine.wb_json("agent", "status", record.agent_id)["state"] == "abandoned"  # type: ignore[index]


def test_stop_before_the_worker_starts_is_recorded_by_the_owner(machine: Machine) -> None:
    from tests_support import sample_record

    store = Store(machine.home).ensure()
    record = sample_record()
    run_dir = store.create(record, "task")
    stopped = machine.wb("agent", "stop", record.agent_id)
    assert stopped.returncode == 0 and stopped.stdout == f"stopping {record.agent_id} before its worker started\n"
    subprocess.run(
        [sys.executable, "-m", "courier.main", "--wb-internal-agent-run", "--run-dir", str(run_dir)],
        env=machine.env,
        timeout=60,
        check=True,
    )
    assert wait_for(lambda: store.load(record.agent_id).state == "failed", 5)
    assert "stopped on request" in str(store.load(record.agent_id).failure)
    assert os.path.exists(run_dir / "stop-requested")
