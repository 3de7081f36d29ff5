"""The stage marks of the dispatch-latency benchmark (courier/stage_trace.py, docs/benchmarks.md#dispatch-latency).

Off (no WB_STAGE_TRACE): a mark opens nothing and costs a comparison. On: one line per mark,
`<name> <pid> <CLOCK_MONOTONIC ns>`. The module imports only what the interpreter has loaded
already, and the variable reaches a run's owner but never its worker.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from courier import stage_trace
from courier.runs.environment import ALLOWLISTED_ENV, worker_environment

CALLS = 100_000
# Off, a mark is a global lookup and a comparison (about 0.05 µs); on, it is an open, a write and a close
# (several µs). 1 µs per call tells them apart with room for a loaded machine.
OFF_BOUND_S = CALLS * 1e-6


@pytest.fixture
def restored(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The module's state as the test found it, whatever the test set."""
    monkeypatch.setattr(stage_trace, "_path", stage_trace._path)
    return monkeypatch


def test_off_writes_nothing_and_opens_nothing(restored: pytest.MonkeyPatch, tmp_path: Path) -> None:
    restored.delenv(stage_trace.ENV, raising=False)
    stage_trace.from_environment()

    def refuse(*args: object, **kwargs: object) -> int:
        raise AssertionError("a mark that is off opened a file")

    restored.setattr(stage_trace.os, "open", refuse)
    stage_trace.mark("nothing")
    assert list(tmp_path.iterdir()) == []


def test_off_costs_nothing_measurable(restored: pytest.MonkeyPatch) -> None:
    restored.delenv(stage_trace.ENV, raising=False)
    stage_trace.from_environment()
    mark = stage_trace.mark
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(CALLS):
            mark("x")
        best = min(best, time.perf_counter() - started)
    assert best < OFF_BOUND_S, f"{CALLS} marks that are off took {best * 1e3:.1f} ms"


def test_on_writes_one_line_per_mark(restored: pytest.MonkeyPatch, tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    restored.setenv(stage_trace.ENV, str(trace))
    stage_trace.from_environment()
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    stage_trace.mark("first.one")
    stage_trace.mark("second")
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    lines = [line.split(" ") for line in trace.read_text().splitlines()]
    assert [line[0] for line in lines] == ["first.one", "second"]
    assert {line[1] for line in lines} == {str(os.getpid())}
    stamps = [int(line[2]) for line in lines]
    assert before <= stamps[0] <= stamps[1] <= after
    assert trace.stat().st_mode & 0o777 == 0o600


def test_an_unwritable_trace_never_raises(restored: pytest.MonkeyPatch, tmp_path: Path) -> None:
    restored.setattr(stage_trace, "_path", str(tmp_path / "missing-dir" / "trace"))
    stage_trace.mark("lost")  # nothing to assert but that it returned


def test_the_variable_is_read_at_import(tmp_path: Path) -> None:
    """A new process (a receiver, an owner) marks from its first line, with nothing called first."""
    trace = tmp_path / "trace"
    env = {**os.environ, stage_trace.ENV: str(trace)}
    program = "from courier.stage_trace import mark; mark('started')"
    subprocess.run([sys.executable, "-c", program], env=env, check=True, timeout=60)
    name, pid, stamp = trace.read_text().split()
    assert name == "started" and int(pid) > 0 and int(stamp) > 0


def test_the_module_imports_only_what_the_interpreter_loaded() -> None:
    """The thin client, the receiver and the CLI's start import it (tests/integration/test_*_is_light.py)."""
    tree = ast.parse(Path(stage_trace.__file__).read_text())
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    names |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert names == {"__future__", "os", "time"}


def test_the_worker_never_gets_the_variable() -> None:
    """The owner inherits the whole environment (courier/runs/admission.py start_owner); the worker an allowlist."""
    assert stage_trace.ENV not in ALLOWLISTED_ENV
    assert stage_trace.ENV not in worker_environment(None, {stage_trace.ENV: "/tmp/trace", "PATH": "/usr/bin"})
