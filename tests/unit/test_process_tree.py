"""A worker's tree and group as the owner reads them at a run's end (courier/runs/descendants.py,
courier/runs/process.py; docs/runs.md#the-owner): the short reads agree with the full /proc scans."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator

import pytest

from courier.runs import descendants, process

# A parent with two children, one of which leaves the group and session (setsid), as a harness's child may.
TREE = "sleep 60 & setsid sleep 60 & echo ready; wait"


@pytest.fixture
def worker() -> Iterator[subprocess.Popen[bytes]]:
    started = subprocess.Popen(["sh", "-c", TREE], stdout=subprocess.PIPE, start_new_session=True)
    assert started.stdout is not None
    with started.stdout:
        assert started.stdout.readline() == b"ready\n"
    everything = descendants.of(started.pid)
    yield started
    process.signal_group(started.pid, signal.SIGKILL)
    for pid in everything:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    started.wait()


def test_the_childrens_lists_and_the_parent_scan_find_the_same_descendants(
    worker: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert descendants._kernel_lists_children()
    listed = descendants.of(worker.pid)
    assert len(listed) == 2  # both sleeps, the one in a session of its own too
    monkeypatch.setattr(descendants, "_children_listed", False)
    assert descendants.of(worker.pid) == listed
    assert descendants.of(os.getpid()).keys() >= {worker.pid, *listed}


def test_a_group_is_empty_only_once_no_live_process_is_in_it(worker: subprocess.Popen[bytes]) -> None:
    assert not process.group_empty(worker.pid)
    lone = subprocess.Popen(["true"], start_new_session=True)
    assert process.wait_until(lambda: process.start_token(lone.pid) is None, 10)  # exited, not reaped: a zombie
    assert process.group_empty(lone.pid)  # the signal reaches the zombie; the scan finds nobody alive
    lone.wait()
    assert process.group_empty(lone.pid)  # reaped: nobody at all
    assert process.terminate_group(lone.pid, 0.1) == 0
