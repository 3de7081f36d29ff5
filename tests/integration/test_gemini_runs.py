"""Gemini CLI runs with the fake gemini (the real 0.61.0 stream), locally and on a loopback sshd machine
(docs/harnesses.md).

Everything but the model is real: dispatch, the detached owner, git worktrees, the receiver
over OpenSSH. The fake (tests/fakes/gemini) checks what the real CLI checks at start-up (a
trusted folder, API-key auth in its home, the shell tool allowed by a policy), so a run that
completes here proves the private home wb prepares is one the CLI accepts.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import CREDENTIAL_ENV, CREDENTIAL_VALUE, FAKES, Machine, make_clone, wait_for

from tests.integration.sshd import SshdFactory, SshdServer, sshd_unavailable_reason

TASK_MARK = "the-gemini-task-text-5e1f"

GEMINI_CONFIG = """\
agents:
  providers:
    mock:
      base_url: http://127.0.0.1:9/v1
      credential_env: {credential_env}
    gem:
      base_url: http://127.0.0.1:9
      credential_env: {credential_env}
      wire_api: gemini
  profiles:
    fake:
      harness: codex
      provider: mock
      model: gpt-5.5
    gem:
      harness: gemini
      provider: gem
      model: gemini-2.5-pro
    mismatched:
      harness: gemini
      provider: mock
      model: gemini-2.5-pro
"""


# This machine runs its workers unconfined (docs/config.md#sandbox): what these tests check is that path.
UNCONFINED = "sandbox:\n  default: \"off\"\n"


@pytest.fixture
def gem(machine: Machine) -> Machine:
    machine.write_config(GEMINI_CONFIG.format(credential_env=CREDENTIAL_ENV))
    machine.clone()
    return machine


def run(machine: Machine, task: str, worktree: str = "g1", *extra: str) -> dict[str, Any]:
    done = machine.wb(
        "agent", "dispatch", "--new-worktree", worktree, "--profile", "gem", "--repo", "acme/widget",
        "--task", task, *extra,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert TASK_MARK not in done.stdout + done.stderr
    ref = done.stdout.split()[0]
    waited = machine.wb("agent", "await", ref, "--wait-timeout", "60s", "--json", timeout=90)
    assert waited.returncode == 0, waited.stderr
    result: dict[str, Any] = json.loads(waited.stdout)
    return result


def logs(machine: Machine, ref: str, *extra: str) -> str:
    done = machine.wb("agent", "logs", ref, *extra)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_gemini_run_completes_with_its_facts_and_never_stores_or_prints_the_task(gem: Machine) -> None:
    result = run(gem, f"scenario:complete {TASK_MARK}")
    ref = result["agent_id"]

    assert result["state"] == "completed" and result["exit_code"] == 0 and "failure" not in result, result
    assert result["resolved"]["harness"] == "gemini"
    assert result["resolved"]["routing"]["wire_api"] == "gemini"
    assert result["result"] == "Created hello.txt."  # the two deltas, concatenated
    assert result["usage"] == {"input_tokens": 6900, "cached_input_tokens": 4200, "output_tokens": 115}
    assert result["tool_calls"] == 2
    assert result["changes"]["files"] == ["hello.txt"]
    assert (Path(result["worktree_dir"]) / "hello.txt").read_text() == "hello from the fake gemini\n"

    lines = logs(gem, ref).splitlines()
    assert lines[1:] == ["  ran: ls", "  changed 1 file"]

    # The CLI echoed the task as a user message: stored as "[task]", printed by nothing.
    events = Path(result["log_path"]).read_text()
    user = [json.loads(x) for x in events.splitlines() if '"role":"user"' in x]
    assert [u["content"] for u in user] == ["[task]"]
    outputs = [
        events,
        logs(gem, ref, "--raw"),
        gem.wb("agent", "status", ref).stdout,
        gem.wb("agent", "status", ref, "--json").stdout,
        gem.wb("agent", "list").stdout,
        gem.wb("agent", "list", "--json").stdout,
    ]
    assert all(TASK_MARK not in text for text in outputs)
    run_dir = Path(result["log_path"]).parent
    assert all(TASK_MARK not in p.read_text(errors="replace") for p in run_dir.iterdir() if p.is_file()
               and p.name != "task")  # fmt: skip


def test_the_worker_gets_the_allowlist_the_one_credential_and_a_private_home(gem: Machine) -> None:
    gem.write_config(gem.config_path.read_text() + UNCONFINED)  # the unconfined path: the worker holds the key
    result = run(gem, "scenario:env-dump", "g2", "--timeout", "2m")
    assert result["state"] == "completed", result
    home = Path(result["log_path"]).parent / "harness-home"
    facts = json.loads((home / "fake-gemini.json").read_text())
    env = facts["env"]
    assert facts["argv"][1:] == ["-o", "stream-json", "-m", "gemini-2.5-pro", "--approval-mode", "auto_edit"]
    assert facts["shell_registered"] is True
    # The worker had the one credential as GEMINI_API_KEY; what it left in harness-home is masked
    # (docs/runs.md#environment-and-credentials).
    assert facts["key_sha256"] == hashlib.sha256(CREDENTIAL_VALUE.encode()).hexdigest()
    assert env["GEMINI_API_KEY"] == "[redacted]" and CREDENTIAL_ENV not in env
    assert env["GOOGLE_GEMINI_BASE_URL"] == "http://127.0.0.1:9"
    assert env["GEMINI_CLI_HOME"] == str(home) and env["TMPDIR"] == str(home / "tmp")
    assert env["HOME"] == gem.env["HOME"]
    allowed = {"PATH", "HOME", "LANG", "TMPDIR", "TMP", "TEMP", "GEMINI_API_KEY", "GOOGLE_GEMINI_BASE_URL",
               "GEMINI_CLI_HOME", "GEMINI_CLI_NO_RELAUNCH"}  # fmt: skip
    assert set(env) - {"PWD", "SHLVL", "_", "LC_CTYPE"} <= allowed
    assert facts["settings"]["security"]["auth"]["selectedType"] == "gemini-api-key"


def _await(machine: Machine, ref: str) -> dict[str, Any]:
    waited = machine.wb("agent", "await", ref, "--wait-timeout", "60s", "--json", timeout=90)
    assert waited.returncode == 0, waited.stderr
    result: dict[str, Any] = json.loads(waited.stdout)
    return result


def test_continue_of_a_gemini_run_resumes_its_session_in_the_same_worktree(gem: Machine) -> None:
    """docs/cli.md, wb agent continue: `--resume <session>` from a copy of the parent's private home; the fake found
    the session."""
    first = run(gem, f"scenario:complete {TASK_MARK}")
    assert first["state"] == "completed" and first["session_id"], first
    done = gem.wb("agent", "continue", first["agent_id"], "--task", f"scenario:env-dump {TASK_MARK}-2")
    assert done.returncode == 0, done.stderr
    child, state, location, _ = done.stdout.split()
    assert child != first["agent_id"] and state == "running" and location == "g1"
    dumped = _await(gem, child)
    assert dumped["state"] == "completed", dumped
    assert dumped["parent_id"] == first["agent_id"] and dumped["session_id"] == first["session_id"]
    for key in ("worktree", "worktree_dir", "base_sha"):
        assert dumped[key] == first[key], key
    home = Path(dumped["log_path"]).parent / "harness-home"
    facts = json.loads((home / "fake-gemini.json").read_text())
    assert facts["argv"][-2:] == ["--resume", first["session_id"]]
    assert facts["cwd"] == first["worktree_dir"]

    # A second continue, from the child: the fake read the session (both earlier turns) in its copied home.
    done = gem.wb("agent", "continue", child, "--task", "scenario:complete file:third.txt")
    assert done.returncode == 0, done.stderr
    third = _await(gem, done.stdout.split()[0])
    assert third["state"] == "completed" and third["parent_id"] == child, third
    assert third["result"] == f"resumed {first['session_id']} after 2 earlier turn(s); created third.txt."
    assert Path(first["worktree_dir"], "third.txt").exists() and Path(first["worktree_dir"], "hello.txt").exists()
    # The parents' homes are untouched by their children: each run resumed from its own copy.
    parent_home = Path(first["log_path"]).parent / "harness-home"
    (session_file,) = parent_home.glob(".gemini/tmp/*/chats/session-*.jsonl")
    assert sum('"type":"user"' in line for line in session_file.read_text().splitlines()) == 1
    assert TASK_MARK not in Path(third["log_path"]).read_text() + logs(gem, third["agent_id"])


def test_continue_fails_the_run_as_gemini_does_when_the_session_is_gone_from_the_home(gem: Machine) -> None:
    first = run(gem, "scenario:complete")
    for chats in (Path(first["log_path"]).parent / "harness-home").glob(".gemini/tmp/*/chats"):
        shutil.rmtree(chats)
    done = gem.wb("agent", "continue", first["agent_id"], "--task", "scenario:complete file:second.txt")
    assert done.returncode == 0, done.stderr
    second = _await(gem, done.stdout.split()[0])
    assert (second["state"], second["exit_code"]) == ("failed", 42), second
    assert second["failure"] == "harness exited with code 42"
    assert any("No previous sessions found for this project." in d for d in second["harness_diagnostics"]), second
    assert not Path(first["worktree_dir"], "second.txt").exists()


@pytest.mark.parametrize(
    ("scenario", "exit_code", "failure"),
    [
        (
            "fail",
            144,
            'harness exited with code 144; harness reported an error: [API Error: {"error":{"code":400,'
            '"message":"API key not valid. Please pass a valid API key.","status":"INVALID_ARGUMENT"}}]',
        ),
        (
            "max-turns",
            53,
            "harness exited with code 53; harness reported an error: Reached max session turns for this "
            "session. Increase the number of turns by specifying maxSessionTurns in settings.json.",
        ),
        ("no-terminal", 0, "no terminal result event"),
        ("error-exit-zero", 0, "harness reported an error: Invalid stream"),
    ],
)
def test_failure_modes(gem: Machine, scenario: str, exit_code: int, failure: str) -> None:
    result = run(gem, f"scenario:{scenario}")
    assert (result["state"], result["exit_code"], result["failure"]) == ("failed", exit_code, failure)


def test_a_hanging_gemini_times_out(gem: Machine) -> None:
    result = run(gem, "scenario:hang", "g1", "--timeout", "1s")
    assert result["state"] == "timeout" and result["failure"] == "timed out after 1s"


def test_garbage_and_an_oversize_line_are_diagnostics_of_a_completed_run(gem: Machine) -> None:
    garbage = run(gem, "scenario:garbage", "g1")
    assert garbage["state"] == "completed" and garbage["result"] == "Done despite the noise."
    diagnostics = garbage["harness_diagnostics"]
    assert any(d.startswith("malformed event line 3: this is not json") for d in diagnostics), diagnostics
    long = run(gem, "scenario:long-line", "g2")
    assert long["state"] == "completed" and long["result"] == "Read a very long file."
    assert any("over the 8388608-byte line limit" in d for d in long["harness_diagnostics"])


def test_the_credential_is_redacted_if_gemini_echoes_it(gem: Machine) -> None:
    gem.write_config(gem.config_path.read_text() + UNCONFINED)  # the unconfined path: the worker holds the key
    result = run(gem, "scenario:echo-credential", "g1")
    assert result["state"] == "completed"
    assert result["result"] == "The key is [redacted]."
    assert CREDENTIAL_VALUE not in Path(result["log_path"]).read_text()
    assert "diagnostic: using key [redacted]" in logs(gem, result["agent_id"])


def test_a_harness_and_provider_that_do_not_fit_are_refused_naming_file_and_key(gem: Machine) -> None:
    done = gem.wb("agent", "dispatch", "--new-worktree", "g9", "--profile", "mismatched", "--repo", "acme/widget",
                  "--task", "x")  # fmt: skip
    assert done.returncode == 2
    assert f'{gem.config_path}: agents.providers.mock.wire_api: Gemini CLI needs "gemini", not "responses"' in (
        done.stderr
    )
    assert not (gem.projects / ".wb-worktrees").exists() or not any((gem.projects / ".wb-worktrees").rglob("g9"))


def test_a_machine_without_gemini_fails_the_run_naming_the_executable(gem: Machine, tmp_path: Path) -> None:
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("git",):
        found = shutil.which(tool)
        assert found is not None
        (bare / tool).symlink_to(found)
    path = f"{bare}:{Path(sys.executable).parent}"
    assert shutil.which("gemini", path=path) is None
    done = gem.wb("agent", "dispatch", "--new-worktree", "g1", "--profile", "gem", "--repo", "acme/widget",
                  "--task", "scenario:complete", env={"PATH": path})  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(gem.wb("agent", "await", done.stdout.split()[0], "--json", env={"PATH": path}).stdout)
    assert result["state"] == "failed"
    assert "gemini" in result["failure"], result["failure"]


# --------------------------------------------------------------------------- over SSH


REMOTE_GEMINI_CONFIG = """\
agents:
  providers:
    gem:
      base_url: http://127.0.0.1:9
      credential_file: {credential}
      wire_api: gemini
  profiles:
    gem: {{harness: gemini, provider: gem, model: gemini-2.5-pro}}
"""


@pytest.fixture(scope="module")
def gemini_box(sshd: SshdFactory) -> SshdServer:
    reason = sshd_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    server = sshd.start("127.0.0.3")
    shutil.copy(FAKES / "gemini", server.bin_dir / "gemini")
    make_clone(server.projects_root / "acme" / "widget")
    credential = server.root / "credential"
    credential.write_text(CREDENTIAL_VALUE)
    credential.chmod(0o600)
    config = server.root / "remote-wb.yaml"
    config.write_text(REMOTE_GEMINI_CONFIG.format(credential=credential))
    config.chmod(0o600)
    return server


@pytest.fixture(scope="module")
def caller_env(sshd: SshdFactory, gemini_box: SshdServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("gemini-caller")
    config = sshd.write_wb_config("gemini-caller", {"gbox": sshd.target(gemini_box)})
    return {
        "HOME": str(home),
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "WB_CONFIG": str(config),
        "WB_HOME": str(home / "wbhome"),
        "WB_PROJECTS_ROOT": str(home / "projects"),
        "WB_SSH_CONFIG": str(sshd.client_config),
        "LANG": "C.UTF-8",
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
    }


def remote(env: dict[str, str], *args: str) -> Any:
    import subprocess

    return subprocess.run([sys.executable, "-m", "courier.main", *args], capture_output=True, text=True, env=env,
                          timeout=120, stdin=subprocess.DEVNULL)  # fmt: skip


def test_a_remote_gemini_run_round_trip(caller_env: dict[str, str], gemini_box: SshdServer) -> None:
    done = remote(caller_env, "agent", "dispatch", "--to", "gbox", "--new-worktree", "r1", "--profile", "gem",
                  "--repo", "acme/widget", "--task", f"scenario:complete {TASK_MARK}")  # fmt: skip
    assert done.returncode == 0, done.stderr
    ref = done.stdout.split()[0]
    assert ref.startswith("gbox:agt-")

    awaited = remote(caller_env, "agent", "await", ref, "--json")
    assert awaited.returncode == 0, awaited.stderr
    result = json.loads(awaited.stdout)
    assert result["machine"] == "gbox" and result["state"] == "completed", result
    assert result["resolved"]["harness"] == "gemini" and result["result"] == "Created hello.txt."
    assert result["usage"] == {"input_tokens": 6900, "cached_input_tokens": 4200, "output_tokens": 115}
    assert result["changes"]["files"] == ["hello.txt"] and result["tool_calls"] == 2

    status = remote(caller_env, "agent", "status", ref)
    assert status.returncode == 0 and "state:    completed" in status.stdout
    shown = remote(caller_env, "agent", "logs", ref)
    assert shown.returncode == 0 and shown.stdout.splitlines()[1:] == ["  ran: ls", "  changed 1 file"]
    raw = remote(caller_env, "agent", "logs", ref, "--raw")
    assert raw.returncode == 0 and '"content":"[task]"' in raw.stdout
    listed = remote(caller_env, "agent", "list", "--all", "--json")
    assert listed.returncode == 0
    fleet = json.loads(listed.stdout)
    assert [(r["machine"], r["state"]) for r in fleet["results"] if r["agent_id"] == result["agent_id"]] == [
        ("gbox", "completed")
    ]
    everything = status.stdout + shown.stdout + raw.stdout + listed.stdout + awaited.stdout
    assert TASK_MARK not in everything and TASK_MARK not in gemini_box.log()
    events = gemini_box.wb_home / "agents" / result["agent_id"] / "events.jsonl"
    assert TASK_MARK not in events.read_text() and CREDENTIAL_VALUE not in events.read_text()


def test_a_remote_gemini_run_can_be_stopped(caller_env: dict[str, str]) -> None:
    done = remote(caller_env, "agent", "dispatch", "--to", "gbox", "--new-worktree", "r2", "--profile", "gem",
                  "--repo", "acme/widget", "--task", "scenario:hang")  # fmt: skip
    assert done.returncode == 0, done.stderr
    ref = done.stdout.split()[0]
    assert wait_for(lambda: json.loads(remote(caller_env, "agent", "status", ref, "--json").stdout).get("worker_pid"))
    assert remote(caller_env, "agent", "stop", ref).returncode == 0
    result = json.loads(remote(caller_env, "agent", "await", ref, "--json").stdout)
    assert result["state"] == "failed" and "stopped on request" in result["failure"]
