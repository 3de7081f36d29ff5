"""The fake `claude` behaves like Claude Code 2.1.328 where wb can tell: flags, line shapes, exit codes, signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from courier.runs.harness.claude import ClaudeEvents, claude_argv
from courier.runs.harness.interface import Launch

FAKE = Path(__file__).resolve().parents[1] / "fakes" / "claude"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "claude-code-2.1.328"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "README.md").write_text("# repo\n")
    return tmp_path


def _argv(workspace: Path, **changes: Any) -> list[str]:
    fields: dict[str, Any] = {
        "worktree": str(workspace / "repo"), "run_dir": workspace, "home": workspace / "home",
        "model": "claude-sonnet-4-5", "provider_name": "p", "provider": None, "env_key": "",
    }  # fmt: skip
    fields.update(changes)
    return [str(FAKE), *claude_argv(Launch(**fields))[1:]]


def _env(workspace: Path) -> dict[str, str]:
    return {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": str(workspace),
        "CLAUDE_CONFIG_DIR": str(workspace / "home"),
        "ANTHROPIC_API_KEY": "sk-fake",
    }


def run_fake(workspace: Path, task: str, argv: list[str] | None = None) -> tuple[int, list[bytes], bytes]:
    done = subprocess.run(
        argv or _argv(workspace), input=task.encode(), capture_output=True, cwd=workspace / "repo",
        env=_env(workspace), timeout=60,
    )  # fmt: skip
    return done.returncode, done.stdout.splitlines(), done.stderr


def keys_by_type(lines: list[bytes]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for line in lines:
        event = json.loads(line)
        found.setdefault(f"{event['type']}/{event.get('subtype', '')}", set()).update(event)
    return found


def real_keys(*names: str) -> dict[str, set[str]]:
    lines = [line for name in names for line in (FIXTURES / name).read_bytes().splitlines() if line.strip()]
    return keys_by_type(lines)


def test_a_complete_run_has_the_real_line_shapes_and_writes_the_file(workspace: Path) -> None:
    code, lines, _ = run_fake(workspace, "scenario:complete file:notes.txt")
    assert code == 0
    assert (workspace / "repo" / "notes.txt").read_text() == "Hello from the fake claude.\n"
    real = real_keys("bash-allowed.jsonl", "write-acceptEdits.jsonl")
    fake = keys_by_type(lines)
    assert set(fake) == set(real) == {"system/init", "assistant/", "user/", "result/success"}
    for kind, keys in fake.items():
        assert keys <= real[kind], (kind, keys - real[kind])  # nothing the real CLI does not write
    required = {"type", "session_id", "is_error", "result", "usage", "total_cost_usd", "num_turns", "subtype"}
    assert required <= fake["result/success"]
    assert json.loads(lines[0])["permissionMode"] == "acceptEdits"
    events = ClaudeEvents()
    for line in lines:
        events.feed(line)
    assert events.failure(code) is None and events.last_message == "Created notes.txt." and events.tool_calls == 2


@pytest.mark.parametrize(
    ("scenario", "fixture", "code"),
    [("fail", "api-error-400.jsonl", 1), ("max-turns", "error-max-turns.jsonl", 1)],
)
def test_failures_end_like_the_real_ones(workspace: Path, scenario: str, fixture: str, code: int) -> None:
    exit_code, lines, _ = run_fake(workspace, f"scenario:{scenario}")
    assert exit_code == code
    fake, real = json.loads(lines[-1]), json.loads((FIXTURES / fixture).read_bytes().splitlines()[-1])
    for key in ("type", "subtype", "is_error", "terminal_reason"):
        assert fake[key] == real[key], key
    assert ("result" in fake) == ("result" in real) and ("errors" in fake) == ("errors" in real)


def test_sigint_exits_0_with_the_interrupted_line_and_no_result(workspace: Path) -> None:
    worker = subprocess.Popen(
        _argv(workspace), stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=workspace / "repo", env=_env(workspace)
    )
    assert worker.stdin is not None and worker.stdout is not None
    worker.stdin.write(b"scenario:hang")
    worker.stdin.close()
    assert json.loads(worker.stdout.readline())["subtype"] == "init"
    assert json.loads(worker.stdout.readline())["type"] == "assistant"  # it is inside its turn now
    os.kill(worker.pid, signal.SIGINT)
    rest = worker.stdout.read().splitlines()
    worker.stdout.close()
    assert worker.wait(timeout=30) == 0
    real_last = json.loads((FIXTURES / "sigint.jsonl").read_bytes().splitlines()[-1])
    assert json.loads(rest[-1])["message"] == real_last["message"]


def test_flag_checks_match_the_real_cli(workspace: Path) -> None:
    argv = [arg for arg in _argv(workspace) if arg != "--verbose"]
    code, lines, stderr = run_fake(workspace, "x", argv)
    assert (code, lines) == (1, [])
    assert b"--output-format=stream-json requires --verbose" in stderr
    if os.geteuid() == 0:
        argv = [*_argv(workspace)[:-6], "--permission-mode", "bypassPermissions"]
        code, lines, stderr = run_fake(workspace, "x", argv)
        assert code == 1 and b"cannot be used with root/sudo privileges" in stderr
