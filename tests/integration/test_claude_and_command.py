"""Claude Code (the fake 2.1.328 on PATH) and `command` runs through the real CLI: same records, status, logs, list.

The fake claude replays the real stream shapes (tests/fakes/claude); each failure mode in
docs/harnesses.md ends the run in the state that harness's terminal rule says (docs/runs.md#terminal-state).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CREDENTIAL_ENV, CREDENTIAL_VALUE, Machine, make_clone, prepare_remote

from tests.integration.sshd import SshdFactory, sshd_unavailable_reason

CONFIG = """\
agents:
  providers:
    local-claude:
      base_url: http://127.0.0.1:9
      credential_env: {credential_env}
      wire_api: anthropic
      request_max_retries: 0
  profiles:
    sonnet: {{harness: claude, provider: local-claude, model: claude-sonnet-4-5, reasoning: high}}
    bypass: {{harness: claude, provider: local-claude, model: claude-sonnet-4-5, permissions: bypass}}
    unconfined: {{harness: claude, provider: local-claude, model: claude-sonnet-4-5, sandbox: "off"}}
    script: {{harness: command, command: [{script}, --greeting, hello there]}}
sandbox:
  writable: [{worktrees}]   # the script writes its environment beside its worktree
"""

SCRIPT = """\
#!/bin/sh
# A scripted agent: reads the task, writes a file, reports.
task=$(cat)
printf '%s\\n' "$1 $2" > agent.txt
echo "cwd $(pwd)"
echo "task bytes ${#task}"
env | sort > ../env-of-command.txt
echo "oops on stderr" >&2
echo '{"type":"wb.result","message":"wrote agent.txt"}'
case "$task" in *exit3*) exit 3;; esac
"""


@pytest.fixture
def claude(machine: Machine) -> Machine:
    script = machine.root / "agent.sh"
    script.write_text(SCRIPT)
    script.chmod(0o700)
    worktrees = machine.projects / ".wb-worktrees" / "acme" / "widget"
    worktrees.mkdir(parents=True)
    machine.write_config(CONFIG.format(credential_env=CREDENTIAL_ENV, script=script, worktrees=worktrees))
    machine.clone()
    return machine


def run(machine: Machine, task: str, *, profile: str = "sonnet", worktree: str = "w1", wait: str = "30s") -> dict:  # type: ignore[type-arg]
    done = machine.wb(
        "agent", "dispatch", "--new-worktree", worktree, "--profile", profile, "--repo", "acme/widget", "--task", task
    )
    assert done.returncode == 0, done.stderr
    ref = done.stdout.split()[0]
    waited = machine.wb("agent", "await", ref, "--wait-timeout", wait, "--json", timeout=120)
    assert waited.returncode in (0, 1), waited.stderr
    result: dict = json.loads(waited.stdout)  # type: ignore[type-arg]
    return result


def logs(machine: Machine, result: dict) -> list[str]:  # type: ignore[type-arg]
    done = machine.wb("agent", "logs", result["agent_id"], "--tail", "20")
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()[1:]


def test_a_claude_run_reports_every_fact(claude: Machine) -> None:
    result = run(claude, "scenario:complete please")
    assert result["state"] == "completed" and result["exit_code"] == 0, result
    assert result["resolved"]["harness"] == "claude" and result["resolved"]["routing"]["wire_api"] == "anthropic"
    assert result["result"] == "Created hello.txt."
    assert Path(result["worktree_dir"], "hello.txt").read_text() == "Hello from the fake claude.\n"
    assert result["changes"]["files"] == ["hello.txt"] and result["changes"]["new_files"] == 1
    assert result["tool_calls"] == 2
    assert result["usage"] == {
        "input_tokens": 5100 + 3200 + 200,
        "cached_input_tokens": 3200,
        "cache_write_input_tokens": 200,
        "output_tokens": 112,
        "reasoning_output_tokens": 0,
        "cost_usd": 0.01869,
    }
    assert logs(claude, result) == ["  changed 1 file", "  ran: ls"]
    status = claude.wb("agent", "status", result["agent_id"])
    assert "resolved: claude local-claude/claude-sonnet-4-5 (reasoning high)" in status.stdout
    assert "cost $0.0187" in status.stdout
    listed = claude.wb("agent", "list", "--json")
    assert [r["resolved"]["harness"] for r in json.loads(listed.stdout)] == ["claude"]


def test_the_worker_gets_the_allowlist_one_credential_and_a_private_config_dir(claude: Machine) -> None:
    result = run(claude, "scenario:env-dump")
    assert result["state"] == "completed", result
    home = Path(claude.home, "agents", result["agent_id"], "harness-home")
    env = json.loads((home / "env.json").read_text())
    # Confined, the harness got the run's placeholder as ANTHROPIC_API_KEY and the relay's address as its base URL
    # (docs/security.md#confined-runs); the credential's own variable is not passed.
    assert re.fullmatch(r"wb-run-[0-9a-f]{32}", env["ANTHROPIC_API_KEY"]) and CREDENTIAL_ENV not in env
    base_url = env["ANTHROPIC_BASE_URL"]
    assert re.fullmatch(r"http://127\.0\.0\.1:[0-9]+", base_url) and not base_url.endswith(":9")
    unconfined = run(claude, "scenario:env-dump", profile="unconfined", worktree="w2")
    unconfined_home = Path(claude.home, "agents", unconfined["agent_id"], "harness-home")
    unconfined_env = json.loads((unconfined_home / "env.json").read_text())
    # Unconfined, it got the credential itself; the end of the run masked it in its home's files.
    assert unconfined_env["ANTHROPIC_API_KEY"] == "[redacted]" and CREDENTIAL_ENV not in unconfined_env
    assert unconfined_env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:9"
    assert env["CLAUDE_CONFIG_DIR"] == str(home)
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1" and env["CLAUDE_CODE_MAX_RETRIES"] == "0"
    assert not any(name.startswith(("WB_", "CODEX_", "PYTHON", "GIT_")) for name in env)
    argv = json.loads((home / "argv.json").read_text())
    assert argv[1:] == [
        "-p", "--output-format", "stream-json", "--verbose", "--model", "claude-sonnet-4-5", "--effort", "high",
        "--setting-sources", "", "--strict-mcp-config",
        "--permission-mode", "acceptEdits", "--allowedTools", "Bash", "--permission-prompts", "none",
    ]  # fmt: skip


def test_permissions_bypass_is_passed_on_except_as_root(claude: Machine) -> None:
    result = run(claude, "scenario:env-dump", profile="bypass")
    if os.geteuid() == 0:  # Claude Code refuses bypassPermissions as root: wb says so before starting it
        assert result["state"] == "failed" and "worker_pid" not in result, result
        assert result["failure"].startswith(
            "could not start the harness: permissions: bypass cannot run as root: Claude Code refuses bypassPermissions"
        )
    else:
        assert result["state"] == "completed", result
        argv = json.loads(Path(claude.home, "agents", result["agent_id"], "harness-home", "argv.json").read_text())
        assert argv[-2:] == ["--permission-mode", "bypassPermissions"] and "acceptEdits" not in argv


@pytest.mark.parametrize(
    ("scenario", "exit_code", "failure"),
    [
        ("fail", 1, "harness exited with code 1; harness reported an error: API Error: 400 scripted upstream failure"),
        ("retry-fail", 1, "harness exited with code 1; harness reported an error: Invalid API key"),
        ("max-turns", 1, "harness exited with code 1; harness reported an error: Reached maximum number of turns (2)"),
        ("no-terminal", 0, "no result event"),
    ],
)
def test_failure_modes(claude: Machine, scenario: str, exit_code: int, failure: str) -> None:
    result = run(claude, f"scenario:{scenario}")
    assert result["state"] == "failed" and result["exit_code"] == exit_code, result
    assert result["failure"].startswith(failure)
    assert "result" not in result
    if scenario == "retry-fail":
        assert "  diagnostic: API retry 2/2 (401 authentication_failed)" in logs(claude, result)


def test_garbage_and_an_oversize_line_are_diagnostics(claude: Machine) -> None:
    garbage = run(claude, "scenario:garbage", worktree="w1")
    assert garbage["state"] == "completed" and garbage["result"] == "Done despite the noise."
    assert garbage["harness_diagnostics"][0] == "malformed event line 2: this is not json"  # line 1: system/init
    assert len(garbage["harness_diagnostics"]) == 4
    long = run(claude, "scenario:long-line", worktree="w2")
    assert long["state"] == "completed" and long["result"] == "Said too much once.", long
    assert any("over the 8388608-byte line limit" in d for d in long["harness_diagnostics"])


def test_a_hung_claude_times_out_and_a_stopped_one_fails(claude: Machine) -> None:
    done = claude.wb(
        "agent", "dispatch", "--new-worktree", "w1", "--profile", "sonnet", "--repo", "acme/widget",
        "--task", "scenario:hang", "--timeout", "2s",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    waited = claude.wb("agent", "await", done.stdout.split()[0], "--wait-timeout", "30s", "--json")
    result = json.loads(waited.stdout)
    assert result["state"] == "timeout" and result["failure"] == "timed out after 2s", result


def test_a_credential_the_harness_echoes_is_redacted(claude: Machine) -> None:
    result = run(claude, "scenario:echo-credential", profile="unconfined")
    assert result["state"] == "completed"
    assert result["result"] == "The key is [redacted]."
    assert CREDENTIAL_VALUE not in Path(result["log_path"]).read_text()
    # Confined, it has only the run's placeholder to echo.
    confined = run(claude, "scenario:echo-credential", worktree="w2")
    assert re.fullmatch(r"The key is wb-run-[0-9a-f]{32}\.", confined["result"]), confined


def test_a_machine_without_claude_fails_the_run_naming_it(claude: Machine, tmp_path: Path) -> None:
    bare = tmp_path / "bare-bin"
    bare.mkdir()
    git = shutil.which("git")
    assert git is not None
    os.symlink(git, bare / "git")
    done = claude.wb(
        "agent", "dispatch", "--new-worktree", "w1", "--profile", "sonnet", "--repo", "acme/widget", "--task", "x",
        env={"PATH": str(bare)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(claude.wb("agent", "await", done.stdout.split()[0], "--json").stdout)
    assert result["state"] == "failed"
    assert result["failure"] == 'could not start the harness: harness executable "claude" not found on PATH'


def test_a_command_profile_runs_the_program_in_the_worktree(claude: Machine) -> None:
    result = run(claude, "please do it", profile="script")
    assert result["state"] == "completed" and result["exit_code"] == 0, result
    assert result["resolved"] == {
        "profile": "script", "harness": "command", "provider": "", "model": "",
        "routing": {"base_url": "", "wire_api": ""},
    }  # fmt: skip
    worktree = Path(result["worktree_dir"])
    assert (worktree / "agent.txt").read_text() == "--greeting hello there\n"
    assert result["result"] == "wrote agent.txt"
    assert result["changes"]["files"] == ["agent.txt"]
    assert "usage" not in result and result["tool_calls"] == 0
    assert logs(claude, result) == [
        f"  diagnostic: cwd {worktree}", "  diagnostic: task bytes 12", "  diagnostic: oops on stderr",
    ]  # fmt: skip
    # `logs --follow` prints the same line for the same action, then the terminal state.
    followed = claude.wb("agent", "logs", result["agent_id"], "--follow")
    assert followed.returncode == 0, followed.stderr
    assert followed.stdout.splitlines()[:-1] == logs(claude, result)
    names = {line.split("=", 1)[0] for line in (worktree.parent / "env-of-command.txt").read_text().splitlines()}
    assert CREDENTIAL_ENV not in names and "ANTHROPIC_API_KEY" not in names and "WB_HOME" not in names
    dispatched = claude.wb(
        "agent", "dispatch", "--new-worktree", "w2", "--profile", "script", "--repo", "acme/widget", "--task", "exit3"
    )
    assert dispatched.returncode == 0 and "(command)" in dispatched.stdout
    failed = json.loads(claude.wb("agent", "await", dispatched.stdout.split()[0], "--json").stdout)
    assert failed["state"] == "failed" and failed["failure"] == "command exited with code 3"


def test_version_lists_the_harnesses_this_machine_can_run(claude: Machine, tmp_path: Path) -> None:
    reply = claude.wb("--wb-internal-agent-remote", input='{"schema_version":1,"operation":"version"}')
    capabilities = json.loads(reply.stdout)["capabilities"]
    assert {"harness:codex", "harness:claude", "harness:command"} <= set(capabilities)
    bare = tmp_path / "bin"
    bare.mkdir()
    reply = claude.wb(
        "--wb-internal-agent-remote", input='{"schema_version":1,"operation":"version"}', env={"PATH": str(bare)}
    )
    assert [c for c in json.loads(reply.stdout)["capabilities"] if c.startswith("harness:")] == ["harness:command"]


REMOTE_CONFIG = """\
agents:
  providers:
    local-claude: {{base_url: 'http://127.0.0.1:9', credential_file: {credential}, wire_api: anthropic}}
  profiles:
    sonnet: {{harness: claude, provider: local-claude, model: claude-sonnet-4-5}}
"""


@pytest.mark.skipif(sshd_unavailable_reason() is not None, reason=str(sshd_unavailable_reason()))
def test_claude_on_another_machine_and_machines_check_shows_its_harnesses(sshd: SshdFactory, tmp_path: Path) -> None:
    box = sshd.start("127.0.0.4")
    shutil.copy(Path(__file__).resolve().parents[1] / "fakes" / "claude", box.bin_dir / "claude")
    (box.bin_dir / "claude").chmod(stat.S_IRWXU)
    make_clone(box.projects_root / "acme" / "widget")
    credential = box.root / "credential"
    credential.write_text(CREDENTIAL_VALUE)
    credential.chmod(0o600)
    config = box.root / "remote-wb.yaml"
    config.write_text(REMOTE_CONFIG.format(credential=credential))
    config.chmod(0o600)
    env = {
        "HOME": str(tmp_path),
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "WB_CONFIG": str(sshd.write_wb_config("caller-claude", {"box": sshd.target(box)})),
        "WB_HOME": str(tmp_path / "wbhome"),
        "WB_SSH_CONFIG": str(sshd.client_config),
        "LANG": "C.UTF-8",
    }
    caller = Machine(root=tmp_path, env=env)

    checked = caller.wb("machines", "--check", "--json")
    assert checked.returncode == 0, checked.stderr
    (row,) = json.loads(checked.stdout)
    assert row["ok"] and {"claude", "codex", "command"} <= set(row["harnesses"])
    table = caller.wb("machines", "--check")
    assert "HARNESSES" in table.stdout.splitlines()[0] and "claude" in table.stdout.splitlines()[1]

    done = caller.wb(
        "agent", "dispatch", "--to", "box", "--new-worktree", "w1", "--profile", "sonnet", "--repo", "acme/widget",
        "--task", "scenario:complete",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    ref = done.stdout.split()[0]
    result = json.loads(caller.wb("agent", "await", ref, "--json").stdout)
    assert result["machine"] == "box" and result["state"] == "completed", result
    assert result["result"] == "Created hello.txt." and result["usage"]["cost_usd"] == 0.01869
    assert result["changes"]["files"] == ["hello.txt"]
    remote_logs = caller.wb("agent", "logs", ref)
    assert "  ran: ls" in remote_logs.stdout and "  changed 1 file" in remote_logs.stdout
    listed = json.loads(caller.wb("agent", "list", "--all", "--json").stdout)["results"]
    assert [(r["machine"], r["resolved"]["harness"]) for r in listed] == [("box", "claude")]


@pytest.mark.skipif(sshd_unavailable_reason() is not None, reason=str(sshd_unavailable_reason()))
def test_the_readme_supervisor_runs_unchanged_with_codex_claude_and_command_machines(
    sshd: SshdFactory, tmp_path: Path
) -> None:
    """docs/harnesses.md: whatever the harness, the same script collects the same facts, and `list --all` all three."""
    from test_readme_supervisor import README_MACHINES, run_supervisor_script

    harnesses = dict(zip(README_MACHINES, ("codex", "claude", "command"), strict=True))
    targets = {}
    for index, (name, harness) in enumerate(harnesses.items()):
        server = sshd.start(f"127.0.0.{40 + index}")
        prepare_remote(server)  # the fake codex, a clone, a `mock` provider with a credential file
        shutil.copy(Path(__file__).resolve().parents[1] / "fakes" / "claude", server.bin_dir / "claude")
        script = server.root / "agent.sh"
        script.write_text(SCRIPT)
        script.chmod(0o700)
        profile = {
            "codex": "{harness: codex, provider: mock, model: gpt-5.5}",
            "claude": "{harness: claude, provider: mock-claude, model: claude-sonnet-4-5}",
            "command": f"{{harness: command, command: [{script}, one, two]}}",
        }[harness]
        config = (server.root / "remote-wb.yaml").read_text()
        credential = server.root / "credential"
        config = config.replace(
            "  profiles:\n",
            f"    mock-claude: {{base_url: 'http://127.0.0.1:9', credential_file: {credential}, wire_api: anthropic}}\n"
            f"  profiles:\n    fast: {profile}\n",
        )
        (server.root / "remote-wb.yaml").write_text(config)
        targets[name] = sshd.target(server)
    _, env, lines = run_supervisor_script(sshd, tmp_path, targets, "supervisor")
    for name in README_MACHINES:
        assert any(re.fullmatch(rf"{name} agt-[0-9a-f]{{32}} completed 1", line) for line in lines), lines
    listed = subprocess.run(
        [sys.executable, "-m", "courier.main", "agent", "list", "--all", "--json"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    found = {r["machine"]: r["resolved"]["harness"] for r in json.loads(listed.stdout)["results"]}
    assert found == harnesses


def test_the_demo_stand_in_holds_a_real_conversation_with_the_scripted_server(claude: Machine, tmp_path: Path) -> None:
    """courier.demo.standin_claude (for `wb demo` without the real CLI) against the Messages server, through wb."""
    from courier.demo.anthropic_server import HELLO_CONTENT, HELLO_PATH, WRITE_FILE_MESSAGE, AnthropicServer

    bin_dir = tmp_path / "standin-bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "claude"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -m courier.demo.standin_claude "$@"\n')
    wrapper.chmod(0o755)
    claude.env["PATH"] = f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin"
    with AnthropicServer() as server:
        claude.write_config(
            CONFIG.format(credential_env=CREDENTIAL_ENV, script="/bin/true", worktrees="/srv").replace(
                "http://127.0.0.1:9", server.base_url_for("write-file")
            )
        )
        result = run(claude, "Create hello.txt.")
        assert result["state"] == "completed", result
        assert result["result"] == WRITE_FILE_MESSAGE
        assert Path(result["worktree_dir"], HELLO_PATH).read_text() == HELLO_CONTENT
        usage = dict(result["usage"])
        assert usage.pop("cost_usd") > 0
        assert usage == {**server.usage_reported("write-file").as_wb_usage(), "reasoning_output_tokens": 0}
        assert logs(claude, result) == ["  ran: ls", "  changed 1 file"]
        assert all(r.headers.get("x-api-key") == CREDENTIAL_VALUE for r in server.requests)
