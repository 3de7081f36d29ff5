"""The fake `codex` behaves like Codex 0.169.0 where the owner can tell: argv surface, events, -o, exit codes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from courier.config import Provider
from courier.runs.harness.codex import EventSummary, codex_argv, worker_actions

FAKE = Path(__file__).resolve().parents[1] / "fakes" / "codex"
KEY_ENV = "FAKE_PROVIDER_KEY"
KEY = "sk-fake-0123456789"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "README.md").write_text("# repo\n")
    (tmp_path / "codex-home").mkdir()
    return tmp_path


def _env(workspace: Path, **extra: str) -> dict[str, str]:
    return {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": str(workspace),
        "LANG": "C.UTF-8",
        "CODEX_HOME": str(workspace / "codex-home"),
        KEY_ENV: KEY,
        **extra,
    }


def _argv(workspace: Path, cwd: Path | None = None) -> list[str]:
    argv = codex_argv(
        worktree=str(cwd or workspace / "repo"),
        model="gpt-5.5",
        provider_name="mock",
        provider=Provider(base_url="http://127.0.0.1:9/v1", credential_env=KEY_ENV, request_max_retries=0),
        reasoning="high",
        network=False,
        last_message_path=str(workspace / "last-message.txt"),
        env_key=KEY_ENV,
    )
    return [str(FAKE), *argv[1:]]


def run_fake(
    workspace: Path, task: str, *, env: dict[str, str] | None = None, argv: list[str] | None = None
) -> tuple[subprocess.CompletedProcess[bytes], EventSummary]:
    done = subprocess.run(
        argv or _argv(workspace),
        input=task.encode(),
        capture_output=True,
        env=env or _env(workspace),
        timeout=30,
    )
    summary = EventSummary()
    for raw in done.stdout.splitlines(keepends=True):
        summary.feed(raw)
    return done, summary


def test_complete_writes_the_file_and_the_last_message(workspace: Path) -> None:
    done, summary = run_fake(workspace, "please scenario:complete")
    assert done.returncode == 0, done.stderr
    assert (workspace / "repo" / "hello.txt").is_file()
    assert summary.turn_completed and not summary.turn_failed
    assert summary.tool_calls == 2
    assert summary.last_agent_message == "Created hello.txt."
    assert summary.usage is not None and summary.usage.input_tokens == 4900
    assert summary.usage.reasoning_output_tokens == 16
    assert summary.diagnostics == []
    assert (workspace / "last-message.txt").read_text() == "Created hello.txt."
    first, second, *_ = (json.loads(raw) for raw in done.stdout.splitlines())
    assert first["type"] == "thread.started" and len(first["thread_id"]) == 36
    assert second == {"type": "turn.started"}
    assert b", " not in done.stdout.splitlines()[0]  # compact JSON
    started = [json.loads(raw) for raw in done.stdout.splitlines() if b'"item.started"' in raw]
    command = next(event["item"] for event in started if event["item"]["type"] == "command_execution")
    assert command == {
        "id": command["id"], "type": "command_execution", "command": "/bin/bash -lc ls",
        "aggregated_output": "", "exit_code": None, "status": "in_progress",
    }  # fmt: skip
    change = next(event["item"] for event in started if event["item"]["type"] == "file_change")
    assert change["changes"] == [{"path": os.path.realpath(workspace / "repo" / "hello.txt"), "kind": "add"}]


def test_default_scenario_file_and_message_keywords(workspace: Path) -> None:
    done, summary = run_fake(workspace, "do the thing file:src/new.py\nmessage:All done here.\n")
    assert done.returncode == 0, done.stderr
    assert (workspace / "repo" / "src" / "new.py").is_file()
    assert summary.last_agent_message == "All done here."


def test_failed_turn_exits_1_without_the_output_file(workspace: Path) -> None:
    done, summary = run_fake(workspace, "scenario:fail")
    assert done.returncode == 1
    assert summary.turn_failed and not summary.turn_completed
    assert summary.failure_message is not None and "401 Unauthorized" in summary.failure_message
    assert "http://127.0.0.1:9/v1/responses" in summary.failure_message
    assert not (workspace / "last-message.txt").exists()


def test_retry_fail_matches_the_real_retry_transcript_shape(workspace: Path) -> None:
    done, summary = run_fake(workspace, "scenario:retry-fail")
    assert done.returncode == 1
    assert summary.failure_message == "stream disconnected before completion: mock upstream exploded"
    assert [d.split(" (")[0] for d in summary.diagnostics] == ["Reconnecting... 1/2", "Reconnecting... 2/2"]


def test_missing_credential_is_a_failed_turn(workspace: Path) -> None:
    env = _env(workspace)
    del env[KEY_ENV]
    done, summary = run_fake(workspace, "scenario:complete", env=env)
    assert done.returncode == 1
    assert summary.failure_message == f"Missing environment variable: `{KEY_ENV}`."
    assert not (workspace / "repo" / "hello.txt").exists()


def test_garbage_is_diagnosed_but_the_turn_completes(workspace: Path) -> None:
    done, summary = run_fake(workspace, "scenario:garbage")
    assert done.returncode == 0
    assert summary.turn_completed
    assert len(summary.diagnostics) == 4
    assert all(text.startswith("malformed event line ") for text in summary.diagnostics)


def test_no_terminal_and_long_message(workspace: Path) -> None:
    done, summary = run_fake(workspace, "scenario:no-terminal")
    assert done.returncode == 0
    assert not summary.turn_completed and not summary.turn_failed
    assert not (workspace / "last-message.txt").exists()
    done, summary = run_fake(workspace, "scenario:long-message")
    assert done.returncode == 0
    assert summary.last_agent_message is not None and len(summary.last_agent_message.encode()) == 10_000
    assert (workspace / "last-message.txt").stat().st_size == 10_000


def test_escape_and_echo_credential(workspace: Path) -> None:
    done, summary = run_fake(workspace, "scenario:escape")
    assert summary.last_agent_message is not None
    assert "\x1b[31m" in summary.last_agent_message and "\u202e" in summary.last_agent_message
    done, summary = run_fake(workspace, "scenario:echo-credential")
    assert done.returncode == 0
    assert KEY in (summary.last_agent_message or "")
    assert done.stdout.count(KEY.encode()) >= 3


def test_env_dump_and_the_task_stays_off_argv(workspace: Path) -> None:
    done, _ = run_fake(workspace, "secret task words scenario:env-dump")
    assert done.returncode == 0
    environment = json.loads((workspace / "codex-home" / "env.json").read_text())
    assert environment[KEY_ENV] == KEY
    argv = json.loads((workspace / "codex-home" / "argv.json").read_text())
    assert not any("secret task words" in arg for arg in argv)


def test_slow_sleeps_then_completes(workspace: Path) -> None:
    started = time.monotonic()
    done, summary = run_fake(workspace, "scenario:slow sleep:0.3")
    assert 0.3 <= time.monotonic() - started < 10
    assert done.returncode == 0 and summary.turn_completed


def test_background_child_is_left_running(workspace: Path) -> None:
    done, summary = run_fake(workspace, "scenario:background-child")
    assert done.returncode == 0 and summary.turn_completed
    pid = int((workspace / "codex-home" / "background.pid").read_text())
    try:
        os.kill(pid, 0)  # still alive after the harness exited
    finally:
        os.kill(pid, signal.SIGKILL)


def test_ignore_term_survives_sigterm_with_its_grandchild(workspace: Path) -> None:
    process = subprocess.Popen(
        _argv(workspace), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env=_env(workspace), start_new_session=True,
    )  # fmt: skip
    assert process.stdin is not None and process.stdout is not None
    try:
        process.stdin.write(b"scenario:ignore-term")
        process.stdin.close()
        pid_file = workspace / "codex-home" / "grandchild.pid"
        deadline = time.monotonic() + 10
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        grandchild = int(pid_file.read_text())
        os.killpg(process.pid, signal.SIGTERM)
        time.sleep(0.3)
        assert process.poll() is None
        os.kill(grandchild, 0)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        process.stdout.close()
    assert process.returncode == -signal.SIGKILL


def test_hang_emits_the_start_and_dies_on_sigterm(workspace: Path) -> None:
    process = subprocess.Popen(
        _argv(workspace), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env=_env(workspace), start_new_session=True,
    )  # fmt: skip
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(b"scenario:hang")
    process.stdin.close()
    summary = EventSummary()
    summary.feed(process.stdout.readline())
    summary.feed(process.stdout.readline())
    assert summary.thread_id is not None and summary.events == 2
    os.killpg(process.pid, signal.SIGTERM)
    assert process.wait(timeout=10) == -signal.SIGTERM
    process.stdout.close()


def test_huge_output_is_valid_and_completes(workspace: Path) -> None:
    events = workspace / "events.jsonl"
    with open(events, "wb") as sink:
        done = subprocess.run(
            _argv(workspace), input=b"scenario:huge-output", stdout=sink, stderr=subprocess.DEVNULL,
            env=_env(workspace), timeout=60,
        )  # fmt: skip
    assert done.returncode == 0
    assert events.stat().st_size > 128 * 1024 * 1024
    summary = EventSummary()
    with open(events, "rb") as handle:
        for raw in handle:
            assert len(raw) < 8 * 1024 * 1024
            summary.feed(raw)
    assert summary.turn_completed and summary.diagnostics == []
    assert worker_actions(events, 8) == []


def test_full_auto_is_a_usage_error(workspace: Path) -> None:
    done = subprocess.run(
        [str(FAKE), "exec", "--full-auto", "-"], input=b"hi", capture_output=True, env=_env(workspace), timeout=30
    )
    assert done.returncode == 2
    assert done.stdout == b""
    assert b"unexpected argument '--full-auto' found" in done.stderr


def test_outside_a_git_repo_fails_at_startup_without_json(workspace: Path) -> None:
    elsewhere = workspace / "not-a-repo"
    elsewhere.mkdir()
    done, _ = run_fake(workspace, "scenario:complete", argv=_argv(workspace, cwd=elsewhere))
    assert done.returncode == 1
    assert done.stdout == b""
    assert b"Not inside a trusted directory" in done.stderr


def test_chat_wire_api_fails_at_startup(workspace: Path) -> None:
    argv = [*_argv(workspace)[:-1], "-c", 'model_providers.wb_mock.wire_api="chat"', "-"]
    done, _ = run_fake(workspace, "scenario:complete", argv=argv)
    assert done.returncode == 1 and done.stdout == b""
    assert b"is no longer supported" in done.stderr
