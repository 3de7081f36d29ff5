"""A directory the sandbox covers that goes away as bubblewrap sets it up (docs/security.md#confined-runs).

The sandbox covers each directory directly in /tmp that holds a socket (an ssh agent's): one listed
for the command line but gone before bubblewrap mounts over it makes bubblewrap fail ("Can't mkdir").
The owner starts the worker once more, reports it among the run's diagnostics, and a worker that
itself exits 1 is never started twice. Real bubblewrap, the owner's own attempt.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests_support import sample_record

from courier.runs import sandbox
from courier.runs.bwrap_probe import probe
from courier.runs.owner import Owner
from courier.runs.store import EVENTS, Store

pytestmark = [
    pytest.mark.skipif(not probe().usable, reason=f"bubblewrap is not usable here: {probe().reason}"),
    pytest.mark.courier_independent(cold=True),  # in-process: the owner's own attempt
]


@pytest.fixture
def owner(tmp_path: Path) -> Owner:
    worktree = tmp_path / "worktree"
    worktree.mkdir()
    store = Store(tmp_path / "home").ensure()
    record = sample_record(worktree_dir=str(worktree))
    store.create(record, "task")
    owner = Owner(store, record)
    run_dir = store.run_dir(record.agent_id)
    bwrap = shutil.which("bwrap")
    assert bwrap is not None
    owner.confinement = sandbox.Plan(
        bwrap=bwrap, worktree=str(worktree), run_dir=run_dir, harness_home=run_dir / "harness-home",
        wb_home=store.home, path_env=os.environ["PATH"],
    )  # fmt: skip
    owner.confinement.prepare()
    return owner


@pytest.fixture
def going_away(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """A socket's directory in /tmp that the first command line lists and that is gone when bubblewrap mounts."""
    gone = tempfile.mkdtemp(prefix="ssh-wb-test-", dir="/tmp")
    os.rmdir(gone)
    listed: list[str] = []
    real = sandbox._tmp_socket_dirs

    def listing() -> list[str]:
        listed.append(gone)
        return [gone] if len(listed) == 1 else real()

    monkeypatch.setattr(sandbox, "_tmp_socket_dirs", listing)
    yield listed


def _events(owner: Owner) -> str:
    return (owner.run_dir / EVENTS).read_text(errors="replace")


def _attempt(owner: Owner, argv: list[str], listed: list[str] | None = None) -> dict[str, Any]:
    """`owner.attempt` in a process of its own, as a run's owner is: an attempt makes its process a subreaper
    and ends every descendant it has when the worker is done, which in the test runner's own process would be
    the suite's fixtures (the Ray cluster's namespace holder, the sshd machines)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the owner; it reports what the parent asserts on, then leaves without pytest's teardown
        code = 1
        try:
            os.close(read)
            started, exit_code = owner.attempt(argv, dict(os.environ), b"")
            facts = {"started": started, "exit_code": exit_code, "diagnostics": owner.diagnostics}
            os.write(write, json.dumps({**facts, "listed": list(listed or [])}).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as reader:
        report = reader.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and report, "the owner's process failed"
    return dict(json.loads(report))


def test_a_covered_directory_gone_before_the_mounts_starts_the_worker_once_more(
    owner: Owner, going_away: list[str]
) -> None:
    done = _attempt(owner, ["sh", "-c", "echo confined-worker-ran"], going_away)
    assert (done["started"], done["exit_code"]) == (True, 0)
    assert len(done["listed"]) == 2  # the second command line was made afresh
    assert "confined-worker-ran" in _events(owner)
    assert [d for d in done["diagnostics"] if d.startswith("the sandbox was set up again: ")] == [
        f"the sandbox was set up again: {done['listed'][0]} went away as it was set up"
    ]


def test_a_worker_that_exits_1_itself_is_not_started_again(owner: Owner, tmp_path: Path) -> None:
    marker = tmp_path / "worktree" / "starts"
    done = _attempt(owner, ["sh", "-c", f"echo x >> {marker}; exit 1"])
    assert (done["started"], done["exit_code"]) == (True, 1)
    assert marker.read_text() == "x\n"
    assert not any(d.startswith("the sandbox was set up again") for d in done["diagnostics"])
