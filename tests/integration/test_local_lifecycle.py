"""Whole runs on this machine: real git worktrees, a detached owner, the fake Codex on PATH."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import Machine, command_process, pid_alive, wait_for

# The fake reports PIDs from inside the worker, and a killed owner keeps its worker alive: both only for an
# unconfined worker (a confined one has PIDs of its own namespace and dies with its owner; tests/integration/
# test_confined_runs.py covers its stop and timeout). These tests run their machine unconfined (docs/config.md#sandbox).
UNCONFINED = "sandbox:\n  default: \"off\"\n"


def _await(machine: Machine, ref: str, bound: str = "60s") -> dict[str, object]:
    done = machine.wb("agent", "await", ref, "--wait-timeout", bound, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def _status(machine: Machine, ref: str) -> dict[str, object]:
    return machine.wb_json("agent", "status", ref)  # type: ignore[return-value]


def test_a_completed_run_reports_its_facts_after_the_cli_has_exited(machine: Machine) -> None:
    """Dispatch returns while the owner runs on; await, status, logs and list report the outcome."""
    machine.clone()
    done = machine.wb(
        "agent",
        "dispatch",
        "--new-worktree",
        "w1",
        "--profile",
        "fake",
        "--repo",
        "acme/widget",
        "--task",
        "scenario:complete",
    )
    assert done.returncode == 0, done.stderr
    ref, state, location, model = done.stdout.split()
    assert state == "running" and model == "(mock/gpt-5.5)"
    assert location == "w1"  # the worktree name (docs/cli.md#wb-agent-dispatch); the path is in status

    result = _await(machine, ref)
    assert result["state"] == "completed" and result["terminal"] is True and result["exit_code"] == 0
    assert result["result"] == "Created hello.txt."
    assert result["usage"]["input_tokens"] > 0  # type: ignore[index]
    assert result["changes"]["files_changed"] == 1 and result["changes"]["files"] == ["hello.txt"]  # type: ignore[index]
    assert result["branch"] == "wb/w1" and len(str(result["base_sha"])) == 40
    assert (machine.projects / ".wb-worktrees/acme/widget" / location / "hello.txt").read_text()
    assert "task" not in result

    logs = machine.wb("agent", "logs", ref)
    assert logs.returncode == 0
    lines = logs.stdout.splitlines()
    assert lines[0].endswith(f"{ref}/events.jsonl")
    assert "  changed 1 file" in lines and "  ran: /bin/bash -lc ls" in lines

    listed = machine.wb("agent", "list")
    assert listed.returncode == 0
    row = listed.stdout.splitlines()[0].split("\t")
    assert row[:5] == [ref, "completed", "fake", "gpt-5.5", "w1"]

    text = machine.wb("agent", "status", ref)
    assert "state:    completed\n" in text.stdout and "usage:    input" in text.stdout


def test_the_owner_runs_on_after_the_dispatching_cli_exits(machine: Machine) -> None:
    machine.clone()
    ref = machine.dispatch(task="scenario:slow sleep:2")
    status = _status(machine, ref)
    assert status["state"] == "running"
    assert wait_for(lambda: _status(machine, ref).get("owner_alive") is True, 20)
    result = _await(machine, ref)
    assert result["state"] == "completed" and result["result"] == "Finished slowly."


def test_raw_logs_are_the_transcript_bytes(machine: Machine) -> None:
    machine.clone()
    ref = machine.dispatch()
    _await(machine, ref)
    raw = subprocess.run(
        [sys.executable, "-m", "courier.main", "agent", "logs", ref, "--raw"],
        capture_output=True,
        env=machine.env,
        check=True,
    )
    first, rest = raw.stdout.split(b"\n", 1)
    assert rest == Path(first.decode()).read_bytes()
    assert b'"type":"turn.completed"' in rest


def test_a_failed_turn_is_recorded_as_failed_with_the_harness_message(machine: Machine) -> None:
    machine.clone()
    result = _await(machine, machine.dispatch(task="scenario:fail"))
    assert result["state"] == "failed" and result["exit_code"] == 1
    assert "harness reported a failed turn" in str(result["failure"])
    assert "401" in str(result["failure"])


def test_a_run_without_a_terminal_event_fails(machine: Machine) -> None:
    machine.clone()
    result = _await(machine, machine.dispatch(task="scenario:no-terminal"))
    assert result["state"] == "failed" and result["failure"] == "no terminal turn event"


def test_garbage_lines_are_diagnostics_and_do_not_fail_a_completed_turn(machine: Machine) -> None:
    machine.clone()
    result = _await(machine, machine.dispatch(task="scenario:garbage"))
    assert result["state"] == "completed"
    assert any("malformed" in d for d in result["harness_diagnostics"])  # type: ignore[union-attr]


def test_a_very_long_final_message_is_bounded_with_a_note(machine: Machine) -> None:
    machine.clone()
    result = _await(machine, machine.dispatch(task="scenario:long-message"))
    message = str(result["result"])
    assert result["state"] == "completed"
    assert len(message.encode()) < 4096 + 200 and "truncated" in message


def test_the_timeout_ends_a_hanging_harness(machine: Machine) -> None:
    machine.clone()
    result = _await(machine, machine.dispatch("--timeout", "1s", task="scenario:hang"))
    assert result["state"] == "timeout" and "timed out after 1s" in str(result["failure"])
    assert not pid_alive(int(result["worker_pid"]))  # type: ignore[call-overload]


def test_timeout_kills_a_worker_and_grandchild_that_ignore_sigterm(machine: Machine) -> None:
    machine.write_config(machine.config_path.read_text() + UNCONFINED)  # see UNCONFINED
    machine.clone()
    ref = machine.dispatch("--timeout", "1s", task="scenario:ignore-term")
    result = _await(machine, ref)
    assert result["state"] == "timeout"
    grandchild = int((machine.home / "agents" / ref / "harness-home" / "grandchild.pid").read_text())
    assert wait_for(lambda: not pid_alive(grandchild), 3)
    assert not pid_alive(int(result["worker_pid"]))  # type: ignore[call-overload]


def test_stop_ends_a_worker_that_ignores_sigterm_and_records_stopped(machine: Machine) -> None:
    machine.write_config(machine.config_path.read_text() + UNCONFINED)  # see UNCONFINED
    machine.clone()
    ref = machine.dispatch(task="scenario:ignore-term")
    pid_file = machine.home / "agents" / ref / "harness-home" / "grandchild.pid"
    assert wait_for(pid_file.exists, 20)
    grandchild = int(pid_file.read_text())
    worker = int(_status(machine, ref)["worker_pid"])  # type: ignore[call-overload]
    started = time.monotonic()
    stopped = machine.wb("agent", "stop", ref)
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout == f"stopping {ref} worker process {worker}\n"
    assert time.monotonic() - started < 8
    assert not pid_alive(worker) and wait_for(lambda: not pid_alive(grandchild), 2)
    result = _await(machine, ref)
    assert result["state"] == "failed" and str(result["failure"]).startswith("stopped on request at ")
    again = machine.wb("agent", "stop", ref)
    assert again.returncode == 1 and f"agent run {ref} is already failed" in again.stderr


def test_stop_before_the_deadline_wins_over_the_timeout(machine: Machine) -> None:
    machine.clone()
    ref = machine.dispatch("--timeout", "2s", task="scenario:hang")
    assert wait_for(lambda: _status(machine, ref).get("worker_pid"), 20)
    assert machine.wb("agent", "stop", ref).returncode == 0
    result = _await(machine, ref)
    assert result["state"] == "failed" and "stopped on request" in str(result["failure"])


def test_a_killed_owner_is_abandoned_and_stop_still_stops_its_worker(machine: Machine) -> None:
    machine.write_config(machine.config_path.read_text() + UNCONFINED)  # see UNCONFINED
    machine.clone()
    ref = machine.dispatch(task="scenario:hang")
    assert wait_for(lambda: _status(machine, ref).get("worker_pid"), 20)
    status = _status(machine, ref)
    os.kill(int(status["owner_pid"]), signal.SIGKILL)  # type: ignore[call-overload]
    assert wait_for(lambda: _status(machine, ref)["state"] == "abandoned", 10)
    status = _status(machine, ref)
    assert status["worker_alive"] is True and status["owner_alive"] is False
    awaited = machine.wb("agent", "await", ref)
    assert awaited.returncode == 0 and "wb agent stop " + ref in awaited.stdout
    stopped = machine.wb("agent", "stop", ref)
    assert stopped.returncode == 0 and "worker process" in stopped.stdout
    assert wait_for(lambda: not pid_alive(int(status["worker_pid"])), 5)  # type: ignore[call-overload]
    final = _status(machine, ref)
    assert final["state"] == "failed" and "stopped on request" in str(final["failure"])


def test_a_background_child_is_killed_after_the_harness_exits(machine: Machine) -> None:
    machine.write_config(machine.config_path.read_text() + UNCONFINED)  # see UNCONFINED
    machine.clone()
    ref = machine.dispatch(task="scenario:background-child")
    result = _await(machine, ref)
    assert result["state"] == "completed"
    child = int((machine.home / "agents" / ref / "harness-home" / "background.pid").read_text())
    assert not pid_alive(child)
    assert any("leftover" in d for d in result["harness_diagnostics"])  # type: ignore[union-attr]


def test_a_huge_transcript_is_capped_and_the_run_still_completes(machine: Machine) -> None:
    machine.clone()
    ref = machine.dispatch(task="scenario:huge-output")
    result = _await(machine, ref, "120s")
    assert result["state"] == "completed"
    stored = (machine.home / "agents" / ref / "events.jsonl").stat().st_size
    assert 100 * 2**20 < stored <= 128 * 2**20


def test_an_event_line_over_8_mib_is_skipped_with_a_diagnostic(machine: Machine) -> None:
    machine.clone()
    ref = machine.dispatch(task="scenario:giant-line")
    result = _await(machine, ref)
    assert result["state"] == "completed" and result["result"] == "Said too much once."
    diagnostics = result["harness_diagnostics"]
    assert any("over the 8388608-byte line limit" in d for d in diagnostics)  # type: ignore[union-attr]
    stored = (machine.home / "agents" / ref / "events.jsonl").read_bytes()
    assert len(stored) < 1024 * 1024 and b'"type":"turn.completed"' in stored


def test_escape_sequences_are_sanitised_in_text_and_intact_in_json(machine: Machine) -> None:
    machine.clone()
    ref = machine.dispatch(task="scenario:escape")
    result = _await(machine, ref)
    assert "\x1b[31m" in str(result["result"]) and "\u202e" in str(result["result"])
    text = machine.wb("agent", "status", ref).stdout + machine.wb("agent", "await", ref).stdout
    assert "\x1b" not in text and "\u202e" not in text and "\x07" not in text


def test_json_output_escapes_what_text_output_sanitises(machine: Machine) -> None:
    machine.clone()
    message = "a\u202eb\u2028c\u200bd\u00ade\u0085f"  # bidi, line separator, zero-width, soft hyphen, C1
    ref = machine.dispatch(task=f"scenario:complete message:{message}")
    _await(machine, ref)
    for args in (("status", ref), ("await", ref), ("list",)):
        out = machine.wb("agent", *args, "--json").stdout
        raw = [f"U+{ord(ch):04X}" for ch in out if ch in message and not ch.isalpha()]
        assert raw == [], args
        assert "a\\u202eb\\u2028c\\u200bd\\u00ade\\u0085f" in out, args
        document = json.loads(out)
        result = document[0] if isinstance(document, list) else document
        assert result["result"] == message  # the same text to a JSON parser


def test_run_directories_are_private(machine: Machine) -> None:
    machine.clone()
    ref = machine.dispatch()
    _await(machine, ref)
    run_dir = machine.home / "agents" / ref
    for path in (machine.home, machine.home / "agents", run_dir, run_dir / "harness-home"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    for name in ("run.json", "task", "events.jsonl"):
        assert stat.S_IMODE((run_dir / name).stat().st_mode) == 0o600, name


def test_dispatch_into_an_existing_worktree_records_its_base_and_dirty_files(machine: Machine) -> None:
    machine.clone()
    _await(machine, machine.dispatch())
    worktree = machine.projects / ".wb-worktrees/acme/widget/w1"
    (worktree / "notes.txt").write_text("dirty\n")
    done = machine.wb(
        "agent",
        "dispatch",
        "--use-worktree",
        "w1",
        "--profile",
        "fake",
        "--task",
        "scenario:complete file:second.txt",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    first = json.loads(done.stdout)
    assert first["worktree_mode"] == "existing" and first["repository"] == "acme/widget"
    result = _await(machine, first["agent_id"])
    assert result["state"] == "completed" and len(str(result["base_sha"])) == 40
    assert result["changes"]["files_changed"] == 3  # type: ignore[index]


def test_await_with_a_bound_prints_the_last_observation_and_exits_1(machine: Machine) -> None:
    machine.clone()
    ref = machine.dispatch(task="scenario:hang")
    done = machine.wb("agent", "await", ref, "--wait-timeout", "300ms")
    assert done.returncode == 1
    assert "state:    running" in done.stdout
    assert f"error: agent run {ref} is still running after the wait bound; it has not finished" in done.stderr
    machine.wb("agent", "stop", ref)


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _settled(pid: int) -> bool:
    pid = command_process(pid) or 0
    if not pid or "pydantic_core" not in Path(f"/proc/{pid}/maps").read_text():
        return False
    before = _cpu_ticks(pid)
    time.sleep(0.3)
    return _cpu_ticks(pid) == before


def test_ctrl_c_during_await_exits_130_and_says_the_run_continues(machine: Machine) -> None:
    machine.clone()
    ref = machine.dispatch(task="scenario:hang")
    waiter = subprocess.Popen(
        [sys.executable, "-m", "courier.main", "agent", "await", ref],
        env=machine.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Signal once the CLI is inside its wait: imports done and the process idle between polls.
    assert wait_for(lambda: _settled(waiter.pid), 20)
    waiter.send_signal(signal.SIGINT)
    _, err = waiter.communicate(timeout=20)
    assert waiter.returncode == 130, err
    assert err == f"interrupted; the run continues; resume with wb agent await {ref}\n"  # exactly, no "error: "
    assert _status(machine, ref)["state"] == "running"
    machine.wb("agent", "stop", ref)


def test_raw_logs_on_a_terminal_escape_control_characters(machine: Machine) -> None:
    import pty

    machine.clone()
    ref = machine.dispatch(task="scenario:garbage")
    _await(machine, ref)
    assert b"\x1b" in (machine.home / "agents" / ref / "events.jsonl").read_bytes()
    leader, follower = pty.openpty()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "courier.main", "agent", "logs", ref, "--raw"],
            env=machine.env,
            stdin=subprocess.DEVNULL,
            stdout=follower,
            stderr=subprocess.PIPE,
            timeout=60,
        )
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO once the writer is gone
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(leader)
    assert done.returncode == 0, done.stderr
    shown = b"".join(chunks)
    assert b"\x1b" not in shown and b"\\x1b" in shown


def _exited_pid() -> int:
    """The PID of a process that has exited and been reaped."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    return gone.pid


@pytest.mark.parametrize("worker", ["reused by another process", "exited"])
def test_stop_of_a_run_whose_worker_is_gone_signals_nothing_and_says_so(machine: Machine, worker: str) -> None:
    from tests_support import sample_record

    from courier.runs.store import Store

    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)  # a group of its own, like a worker
    try:
        worker_pid = bystander.pid if worker == "reused by another process" else _exited_pid()
        # The record's start tokens are not those of the processes now holding the PIDs.
        record = sample_record(
            owner_pid=_exited_pid(),
            owner_token="linux:another-boot:1",
            worker_pid=worker_pid,
            worker_token="linux:another-boot:2",
        )
        Store(machine.home).ensure().create(record, "task")
        done = machine.wb("agent", "stop", record.agent_id)
        assert done.returncode == 0, done.stderr
        assert done.stdout == f"{record.agent_id}: its worker is already gone; recorded as failed\n"
        assert done.stderr == ""
        assert bystander.poll() is None  # nothing was signalled
        status = _status(machine, record.agent_id)
        assert status["state"] == "failed" and str(status["failure"]).startswith("stopped on request at ")
    finally:
        bystander.kill()
        bystander.wait()
