"""End to end with the real Gemini CLI (@google/gemini-cli 0.61.0) against the in-suite Gemini server.

`wb agent dispatch` runs with a profile whose provider points at
`courier.demo.gemini_server.GeminiServer`, here and on a loopback sshd machine; the real `gemini`
(installed by scripts/install-gemini.sh, which .ci/run calls) is first on PATH and tests/fakes
is not on it at all. What the real binary did is written up in docs/harnesses.md.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import CREDENTIAL_ENV, CREDENTIAL_VALUE, FAKES, Machine, git, make_clone, require_cli, unavailable

from courier.demo.gemini_server import (
    GEMINI_WRITE_FILE_MESSAGE,
    LIMITS_MESSAGE,
    LIMITS_OUTSIDE_NAME,
    GeminiServer,
)
from courier.demo.model_server import FAIL_MESSAGE, HELLO_CONTENT, HELLO_PATH, WRITE_FILE_LIST_COMMAND
from tests.integration.sshd import SshdFactory, sshd_unavailable_reason

pytestmark = pytest.mark.e2e

GEMINI_VERSION = "0.61.0"
MODEL = "gemini-2.5-pro"
TASK_MARK = "the-real-gemini-task-7d2a"


@pytest.fixture(scope="module")
def gemini_dirs() -> list[str]:
    return require_cli("gemini", GEMINI_VERSION, install="run `bash scripts/install-gemini.sh`").dirs


@pytest.fixture(scope="module")
def server() -> Iterator[GeminiServer]:
    with GeminiServer() as running:
        yield running


def _config(server: GeminiServer) -> str:
    providers, profiles = [], []
    for scenario in ("write-file", "fail", "limits"):
        providers.append(
            f"    {scenario}:\n      base_url: {server.base_url_for(scenario)}\n"
            f"      credential_env: {CREDENTIAL_ENV}\n      wire_api: gemini\n"
        )
        profiles.append(f"    {scenario}:\n      harness: gemini\n      provider: {scenario}\n      model: {MODEL}\n")
    return "agents:\n  providers:\n" + "".join(providers) + "  profiles:\n" + "".join(profiles)


@pytest.fixture
def real(machine: Machine, server: GeminiServer, gemini_dirs: list[str]) -> Machine:
    kept = [d for d in machine.env["PATH"].split(os.pathsep) if d and Path(d).resolve() != FAKES.resolve()]
    machine.env["PATH"] = os.pathsep.join([*gemini_dirs, *(d for d in kept if d not in gemini_dirs)])
    found = shutil.which("gemini", path=machine.env["PATH"])
    assert found is not None and Path(found).parent != FAKES
    machine.write_config(_config(server))
    machine.clone()
    return machine


def _run(machine: Machine, profile: str, worktree: str, task: str) -> dict[str, Any]:
    done = machine.wb("agent", "dispatch", "--new-worktree", worktree, "--profile", profile,
                      "--repo", "acme/widget", "--task", task)  # fmt: skip
    assert done.returncode == 0, done.stderr
    waited = machine.wb("agent", "await", done.stdout.split()[0], "--wait-timeout", "90s", "--json", timeout=120)
    assert waited.returncode == 0, waited.stderr
    result: dict[str, Any] = json.loads(waited.stdout)
    return result


def _logs(machine: Machine, ref: str) -> list[str]:
    done = machine.wb("agent", "logs", ref)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()[1:]


def _session(result: dict[str, Any]) -> str:
    events = Path(result["log_path"]).read_text().splitlines()
    return next(json.loads(x)["session_id"] for x in events if x.startswith('{"type":"init"'))


def _tool_outputs(server: GeminiServer, session_task: str) -> list[str]:
    """The outputs of the tool calls the CLI sent back in the last request of the run whose task is given."""
    bodies = [r.body for r in server.requests if isinstance(r.body, dict) and session_task in json.dumps(r.body)]
    parts = [p for c in bodies[-1]["contents"] for p in c.get("parts", []) if "functionResponse" in p]
    return [json.dumps(p["functionResponse"]["response"]) for p in parts]


def test_a_real_gemini_run_writes_the_file_and_reports_the_facts(real: Machine, server: GeminiServer) -> None:
    server.clear()
    result = _run(real, "write-file", "w1", f"Do the scripted task. {TASK_MARK}")

    assert result["state"] == "completed" and result["exit_code"] == 0 and "failure" not in result, result
    assert result["result"] == GEMINI_WRITE_FILE_MESSAGE  # two streamed chunks, concatenated
    worktree = Path(result["worktree_dir"])
    assert (worktree / HELLO_PATH).read_text() == HELLO_CONTENT
    assert result["changes"]["files_changed"] == 1 and result["changes"]["files"] == [HELLO_PATH]
    assert result["tool_calls"] == 2
    assert [s.step for s in server.served] == [0, 1, 2]
    # Usage is the CLI's result.stats: the sum of the responses' usageMetadata (thoughts are not in it).
    assert result["usage"] == server.usage_reported().wb_usage()

    assert _logs(real, result["agent_id"]) == [f"  ran: {WRITE_FILE_LIST_COMMAND}", "  changed 1 file"]

    # The CLI sent the one credential as its API key header to the configured base URL.
    posts = [r for r in server.requests if r.method == "POST"]
    assert posts and all(r.headers.get("x-goog-api-key") == CREDENTIAL_VALUE for r in posts)
    assert all(r.path == f"/write-file/v1beta/models/{MODEL}:streamGenerateContent?alt=sse" for r in posts)

    # The echoed task is stored as "[task]"; nothing wb wrote or printed carries it.
    events = Path(result["log_path"]).read_text()
    assert TASK_MARK not in events and '"role":"user","content":"[task]"' in events
    assert CREDENTIAL_VALUE not in events
    run_dir = Path(result["log_path"]).parent
    leaked = [p for p in run_dir.iterdir() if p.is_file() and p.name != "task" and TASK_MARK in p.read_text("latin-1")]
    assert leaked == []
    for args in (("status", result["agent_id"]), ("list", "--json"), ("logs", result["agent_id"], "--raw")):
        assert TASK_MARK not in real.wb("agent", *args).stdout


def _texts(content: dict[str, Any]) -> str:
    return "".join(p["text"] for p in content.get("parts", []) if isinstance(p.get("text"), str))


def test_continue_resumes_the_real_gemini_session_and_the_model_sees_the_earlier_turn(
    real: Machine, server: GeminiServer
) -> None:
    """Continue (docs/cli.md, wb agent continue) with 0.61.0: `--resume <session-id>` from the copied home sends the
    whole earlier turn."""
    first_task, follow_up = f"Do the scripted task. {TASK_MARK}-first", f"Now say it again. {TASK_MARK}-follow-up"
    first = _run(real, "write-file", "w1", first_task)
    assert first["state"] == "completed" and first["session_id"] == _session(first), first
    server.clear()
    done = real.wb("agent", "continue", first["agent_id"], "--task", follow_up)
    assert done.returncode == 0, done.stderr
    waited = real.wb("agent", "await", done.stdout.split()[0], "--wait-timeout", "90s", "--json", timeout=120)
    assert waited.returncode == 0, waited.stderr
    second = json.loads(waited.stdout)
    assert second["state"] == "completed" and second["exit_code"] == 0, second
    assert second["parent_id"] == first["agent_id"] and second["worktree_dir"] == first["worktree_dir"]
    assert second["session_id"] == _session(second) == first["session_id"]  # init repeats the resumed ID

    # The one request of the resumed run carries the earlier turn, in order, then the follow-up.
    (posted,) = [r.body for r in server.requests if r.method == "POST" and isinstance(r.body, dict)]
    contents = posted["contents"]
    users = [_texts(c) for c in contents if c.get("role") == "user"]
    # (the first user content is the CLI's session context with the first task as its last part)
    assert users[-1] == follow_up and users[0].endswith(first_task), users
    calls = [p["functionCall"]["name"] for c in contents for p in c.get("parts", []) if "functionCall" in p]
    answers = [p["functionResponse"]["name"] for c in contents for p in c.get("parts", []) if "functionResponse" in p]
    assert calls == ["run_shell_command", "write_file"]
    # 0.61.0 rebuilds each earlier tool result twice from its session file (docs/harnesses.md): same order.
    assert list(dict.fromkeys(answers)) == calls, answers
    assert GEMINI_WRITE_FILE_MESSAGE in [_texts(c) for c in contents if c.get("role") == "model"]
    # With the earlier tool results the script is past its last call: the final text, this run's usage only.
    assert [s.step for s in server.served] == [len(answers)]
    assert second["result"] == GEMINI_WRITE_FILE_MESSAGE and second["tool_calls"] == 0
    assert second["usage"] == server.usage_reported().wb_usage()
    assert follow_up not in Path(second["log_path"]).read_text()
    # The session (task text included) stays in the child's private home: 0700 directories, 0600 files.
    home = Path(second["log_path"]).parent / "harness-home"
    sessions = list(home.glob(".gemini/tmp/*/chats/session-*.jsonl"))
    assert sessions and follow_up in "".join(path.read_text() for path in sessions)
    for path in [home, *home.rglob("*")]:
        if not path.is_symlink():
            assert stat.S_IMODE(path.lstat().st_mode) == (0o700 if path.is_dir() else 0o600), path


def test_continue_with_the_session_gone_from_the_home_fails_as_the_real_gemini_does(
    real: Machine, server: GeminiServer
) -> None:
    first = _run(real, "write-file", "w1", "Do the scripted task.")
    (chats,) = (Path(first["log_path"]).parent / "harness-home").glob(".gemini/tmp/*/chats")
    shutil.rmtree(chats)
    server.clear()
    done = real.wb("agent", "continue", first["agent_id"], "--task", "Once more.")
    assert done.returncode == 0, done.stderr
    waited = real.wb("agent", "await", done.stdout.split()[0], "--wait-timeout", "90s", "--json", timeout=120)
    second = json.loads(waited.stdout)
    assert (second["state"], second["exit_code"], second["failure"]) == ("failed", 42, "harness exited with code 42")
    assert any("Error resuming session" in d for d in second["harness_diagnostics"]), second
    assert server.requests == []  # it never reached the model


def test_an_api_error_ends_the_run_failed_with_the_clis_exit_code(real: Machine, server: GeminiServer) -> None:
    result = _run(real, "fail", "w1", "Do the scripted task.")
    assert result["state"] == "failed"
    # The CLI exits with the HTTP status, truncated to a byte: 400 → 144.
    assert result["exit_code"] == 144
    assert result["failure"].startswith("harness exited with code 144; harness reported an error: [API Error: ")
    assert FAIL_MESSAGE in result["failure"]
    assert "result" not in result and "usage" not in result
    assert [line for line in _logs(real, result["agent_id"]) if FAIL_MESSAGE in line]


def test_what_the_worker_can_and_cannot_do(real: Machine, server: GeminiServer) -> None:
    """docs/harnesses.md, Gemini CLI 0.61.0: no key in commands, commits allowed, no writes outside."""
    task = f"Probe the limits. {TASK_MARK}-limits"
    result = _run(real, "limits", "w1", task)
    assert result["state"] == "completed" and result["result"] == LIMITS_MESSAGE, result
    worktree = Path(result["worktree_dir"])

    shell_output, write_output = _tool_outputs(server, task)
    assert "key-hidden" in shell_output and "key-visible" not in shell_output  # environmentVariableRedaction
    assert "commit-ok" in shell_output
    assert git(worktree, "rev-list", "--count", f"{result['base_sha']}..HEAD").strip() == "1"
    assert result["changes"]["commits"] == 1

    assert not (worktree.parent / LIMITS_OUTSIDE_NAME).exists()
    assert "workspace" in write_output.lower() or "outside" in write_output.lower(), write_output
    logs = _logs(real, result["agent_id"])
    assert logs[0].startswith("  ran: printenv GEMINI_API_KEY")
    assert any(line.startswith("  diagnostic: write_file failed: Path not in workspace") for line in logs), logs
    assert "  changed 1 file" not in logs  # the refused write changed nothing


# --------------------------------------------------------------------------- on a loopback sshd machine

REMOTE_CONFIG = """\
agents:
  providers:
    scripted:
      base_url: {base_url}
      credential_file: {credential}
      wire_api: gemini
  profiles:
    real: {{harness: gemini, provider: scripted, model: {model}}}
"""


@pytest.fixture(scope="module")
def caller_env(
    tmp_path_factory: pytest.TempPathFactory, server: GeminiServer, gemini_dirs: list[str]
) -> Iterator[dict[str, str]]:
    reason = sshd_unavailable_reason()
    if reason is not None:
        unavailable(reason)
    factory = SshdFactory(tmp_path_factory.mktemp("sshd-gemini-e2e"))
    try:
        box = factory.start("127.0.0.4")
        make_clone(box.projects_root / "acme" / "widget")
        for directory in gemini_dirs:  # the sshd PATH has /usr/bin; link the CLI in wherever npm put it
            for name in ("gemini", "node"):
                if (Path(directory) / name).exists() and not (box.bin_dir / name).exists():
                    (box.bin_dir / name).symlink_to(Path(directory) / name)
        credential = box.root / "credential"
        credential.write_text(CREDENTIAL_VALUE)
        credential.chmod(0o600)
        config = box.root / "remote-wb.yaml"
        config.write_text(REMOTE_CONFIG.format(base_url=server.base_url_for("write-file"), credential=credential,
                                               model=MODEL))  # fmt: skip
        config.chmod(0o600)
        home = tmp_path_factory.mktemp("gemini-caller")
        yield {
            "HOME": str(home),
            "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
            "WB_CONFIG": str(factory.write_wb_config("caller", {"box": factory.target(box)})),
            "WB_HOME": str(home / "wbhome"),
            "WB_SSH_CONFIG": str(factory.client_config),
            "LANG": "C.UTF-8",
        }
    finally:
        factory.close()


def _wb(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "courier.main", *args], capture_output=True, text=True, env=env,
                          timeout=150, stdin=subprocess.DEVNULL)  # fmt: skip


def test_a_real_gemini_run_on_another_machine(caller_env: dict[str, str], server: GeminiServer) -> None:
    server.clear()
    done = _wb(caller_env, "agent", "dispatch", "--to", "box", "--new-worktree", "w1", "--profile", "real",
               "--repo", "acme/widget", "--task", f"Do the scripted task. {TASK_MARK}")  # fmt: skip
    assert done.returncode == 0, done.stderr
    ref = done.stdout.split()[0]
    waited = _wb(caller_env, "agent", "await", ref, "--wait-timeout", "90s", "--json")
    assert waited.returncode == 0, waited.stderr
    result = json.loads(waited.stdout)
    assert result["machine"] == "box" and result["state"] == "completed", result
    assert result["resolved"]["harness"] == "gemini"
    assert result["result"] == GEMINI_WRITE_FILE_MESSAGE
    assert Path(result["worktree_dir"], HELLO_PATH).read_text() == HELLO_CONTENT
    assert result["changes"]["files"] == [HELLO_PATH]
    assert result["usage"] == server.usage_reported().wb_usage()
    logs = _wb(caller_env, "agent", "logs", ref)
    assert logs.returncode == 0 and f"  ran: {WRITE_FILE_LIST_COMMAND}" in logs.stdout.splitlines()
    listed = _wb(caller_env, "agent", "list", "--all", "--json")
    assert any(r["agent_id"] == result["agent_id"] for r in json.loads(listed.stdout)["results"])
    assert TASK_MARK not in waited.stdout + logs.stdout + listed.stdout
