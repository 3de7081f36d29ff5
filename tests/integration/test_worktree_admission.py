"""Admission into a worktree (docs/runs.md#dispatch): one live run per worktree, found from the worktree's
own holder file; only `git worktree add` waits on the clone; nothing is left by a dispatch that loses."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Machine, git

from courier.executor.perform import perform
from courier.runs.store import Store
from protocol.models import RemoteRequest


def _dispatch_argv(worktree: str, task: str) -> list[str]:
    return [sys.executable, "-m", "courier.main", "agent", "dispatch", "--new-worktree", worktree,
            "--profile", "fake", "--repo", "acme/widget", "--task", task]  # fmt: skip


_PIPES = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}


def _records(machine: Machine) -> list[Path]:
    return sorted((machine.home / "agents").glob("agt-*"))


def test_six_dispatches_into_one_new_worktree_at_once_admit_one_run(machine: Machine) -> None:
    machine.clone()
    procs = [
        subprocess.Popen(_dispatch_argv("same", "scenario:hang"), env=machine.env, **_PIPES)  # type: ignore[call-overload]
        for _ in range(6)
    ]
    outcomes = [(proc.wait(timeout=120), *proc.communicate()) for proc in procs]
    admitted = [out.split()[0] for code, out, _ in outcomes if code == 0]
    assert len(admitted) == 1, outcomes
    refused = [err.strip() for code, _, err in outcomes if code != 0]
    assert all(code in (0, 1) for code, _, _ in outcomes), outcomes
    for message in refused:  # each names why: the run that holds it, or the worktree it made
        assert f"is in use by run {admitted[0]}" in message or "already exists" in message, message
    assert len(_records(machine)) == 1
    machine.wb("agent", "stop", admitted[0])
    assert machine.wb("agent", "await", admitted[0]).returncode == 0


def test_a_home_without_holder_files_still_refuses_a_live_runs_worktree(machine: Machine) -> None:
    """A home a wb before holder files made: its live runs are found by one scan of the records."""
    machine.clone()
    ref = machine.dispatch(task="scenario:hang")
    shutil.rmtree(machine.home / "holders")
    done = machine.wb("agent", "dispatch", "--use-worktree", "w1", "--profile", "fake", "--task", "x")
    assert done.returncode == 1 and f"in use by run {ref}" in done.stderr, done.stderr
    assert len(_records(machine)) == 1
    assert len(os.listdir(machine.home / "holders")) == 1  # made again, naming the live run
    machine.wb("agent", "stop", ref)
    assert machine.wb("agent", "await", ref).returncode == 0


def test_a_continue_does_not_wait_while_another_worktree_of_the_clone_is_added(machine: Machine) -> None:
    machine.clone()
    parent = machine.dispatch(task="scenario:complete")
    assert machine.wb("agent", "await", parent).returncode == 0
    (machine.home / "locks").mkdir(mode=0o700, exist_ok=True)
    clone_lock = os.open(machine.home / "locks" / "acme__widget.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(clone_lock, fcntl.LOCK_EX)  # as a `git worktree add` of another dispatch holds it
    adding = subprocess.Popen(_dispatch_argv("w2", "scenario:complete"), env=machine.env, **_PIPES)  # type: ignore[call-overload]
    try:
        done = machine.wb("agent", "continue", parent, "--task", "scenario:complete file:again.txt", timeout=60)
        assert done.returncode == 0, done.stderr
        assert adding.poll() is None  # the new worktree's dispatch still waits for the clone
    finally:
        os.close(clone_lock)
    out, err = adding.communicate(timeout=120)
    assert adding.returncode == 0, err
    for ref in (done.stdout.split()[0], out.split()[0]):
        assert machine.wb("agent", "await", ref).returncode == 0


def test_a_pruned_run_leaves_no_holder_file(machine: Machine) -> None:
    machine.clone()
    ref = machine.dispatch(task="scenario:complete")
    assert machine.wb("agent", "await", ref).returncode == 0
    assert len(os.listdir(machine.home / "holders")) == 1
    assert machine.wb("agent", "prune", "--older-than", "0s").returncode == 0
    assert os.listdir(machine.home / "holders") == []


def test_an_agent_id_admitted_meanwhile_into_another_worktree_leaves_no_second_worktree(
    machine: Machine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same agent id dispatched into two worktrees at once (two locks): one run, and the loser's
    worktree and branch are gone. The other admission is made to land just before this one's record."""
    clone = machine.clone()
    for key, value in machine.env.items():
        monkeypatch.setenv(key, value)
    agent_id = "agt-" + "cd" * 16
    create = Store.create

    def admitted_meanwhile(store: Store, record, task: str):  # type: ignore[no-untyped-def]
        elsewhere = str(Path(record.worktree_dir).parent / "w1")
        other = record.model_copy(update={"worktree": "w1", "worktree_dir": elsewhere})
        create(store, other, task)
        return create(store, record, task)

    monkeypatch.setattr(Store, "create", admitted_meanwhile)
    request = RemoteRequest(
        schema_version=1, operation="dispatch", mode="new", worktree="w2", profile="fake",
        task="scenario:complete", repository="acme/widget", timeout_ms=60_000, agent_id=agent_id,
    )  # fmt: skip
    response = perform(request)
    assert not response.failure, response.failure
    assert response.result_of().agent_id == agent_id
    assert response.result_of().worktree == "w1"
    assert len(_records(machine)) == 1
    assert not (machine.projects / ".wb-worktrees" / "acme" / "widget" / "w2").exists()
    branches = git(clone, "branch", "--list", "wb/w2")
    assert branches.strip() == "", branches


def test_a_holder_file_that_is_a_link_refuses_the_dispatch_and_is_not_followed(machine: Machine) -> None:
    machine.clone()
    ref = machine.dispatch(task="scenario:complete")
    assert machine.wb("agent", "await", ref).returncode == 0
    (holder,) = (machine.home / "holders").iterdir()
    holder.unlink()
    holder.symlink_to(machine.home / "agents" / ref / "run.json")
    done = machine.wb("agent", "dispatch", "--use-worktree", "w1", "--profile", "fake", "--task", "x")
    assert done.returncode == 1, done.stderr
    assert f"cannot read or note the worktree's run under {machine.home / 'holders'}: " in done.stderr, done.stderr
    assert "internal" not in done.stderr
    assert len(_records(machine)) == 1
