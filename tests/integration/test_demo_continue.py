"""The README's supervisor loop needs `continue`: in the demo's set-up the bundled stand-ins resume their sessions.

The continue test wires the demo's machine exactly as `wb demo` does (its sandbox, scripted
model server, embedded SSH server and the stand-in under the CLI's name, whether or not the
real CLI is installed), then runs the real CLI: dispatch, await, continue, await. A session
the home does not hold fails as the real CLI fails: its exit code, its message, no events.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO_ROOT

from courier.demo import run as demo
from courier.demo.model_server import RecordedRequest

FIRST_MARK = "first-turn-3c9e"
FOLLOW_UP = "Now add a test for it. follow-up-7d21"
# The demo's own machine, its environment with WB_COURIER=off: the WB_COURIER=off pass alone runs
# this module (tests/conftest.py).
pytestmark = pytest.mark.courier_independent(cold=True)


def _wb(env: dict[str, str], cwd: Path, *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "courier.main", *args, "--json"],
        cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    value = json.loads(done.stdout)
    assert isinstance(value, dict)
    return value


def _ref(result: dict[str, Any]) -> str:
    return f"{result['machine']}:{result['agent_id']}"


def _posted(request: RecordedRequest) -> str:
    return json.dumps(request.body) if request.method == "POST" and isinstance(request.body, dict) else ""


@pytest.mark.parametrize("harness", ["codex", "claude", "gemini"])
def test_the_standin_continues_its_session_as_the_real_cli_does(harness: str) -> None:
    with demo._sandbox() as sandbox:
        installed = demo._install_standin(sandbox, demo.DEMO_HARNESSES[harness])
        model, _sshd, env = demo._set_up(sandbox, installed)
        task = f"{demo.TASK} {FIRST_MARK}"
        first = _wb(env, sandbox.local, "agent", "dispatch", "--to", demo.MACHINE, "--new-worktree", demo.WORKTREE,
                    "--repo", demo.REPOSITORY, "--profile", demo.PROFILE, "--task", task)  # fmt: skip
        first = _wb(env, sandbox.local, "agent", "await", _ref(first), "--wait-timeout", "60s")
        assert first["state"] == "completed", first
        before = len(model.requests)

        child = _wb(env, sandbox.local, "agent", "continue", _ref(first), "--task", FOLLOW_UP)
        second = _wb(env, sandbox.local, "agent", "await", _ref(child), "--wait-timeout", "60s")
        resumed = [text for text in map(_posted, model.requests[before:]) if text]

    assert second["state"] == "completed", second
    assert second["parent_id"] == first["agent_id"]
    assert second["session_id"] == first["session_id"]  # the same session, resumed
    assert second["worktree_dir"] == first["worktree_dir"]
    # The scripted server saw the earlier turn, then the follow-up, as it does from the real CLI.
    assert resumed and FIRST_MARK in resumed[0] and FOLLOW_UP in resumed[0]
    assert resumed[0].index(FIRST_MARK) < resumed[0].index(FOLLOW_UP)


UNKNOWN_SESSION = "0b9c3f5e-1d2a-4e6f-8a7b-9c0d1e2f3a4b"
REFUSALS = {
    # harness: (argv after the CLI's name, its home variable, exit code, stderr's start)
    "codex": (["exec", "--json", "resume", UNKNOWN_SESSION, "-"], "CODEX_HOME", 1, "Error: thread/resume failed"),
    "claude": (["-p", "--output-format", "stream-json", "--verbose", f"--resume={UNKNOWN_SESSION}"],
               "CLAUDE_CONFIG_DIR", 1, "No conversation found with session ID"),
    "gemini": (["-o", "stream-json", "--resume", UNKNOWN_SESSION], "GEMINI_CLI_HOME", 42, "Error resuming session"),
}  # fmt: skip


@pytest.mark.parametrize("harness", sorted(REFUSALS))
def test_a_session_the_home_does_not_hold_fails_before_any_output(harness: str, tmp_path: Path) -> None:
    argv, home_env, code, message = REFUSALS[harness]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), home_env: str(tmp_path / "home"), "LANG": "C.UTF-8",
           "GEMINI_API_KEY": "k", "GOOGLE_GEMINI_BASE_URL": "http://127.0.0.1:9"}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", f"courier.demo.standin_{harness}", *argv],
        input="Go on.", capture_output=True, text=True, env={**env, "PYTHONPATH": str(REPO_ROOT)},
        cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert (done.returncode, done.stdout) == (code, ""), done.stderr
    assert done.stderr.startswith(message)
