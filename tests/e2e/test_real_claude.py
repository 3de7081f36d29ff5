"""End to end with the real Claude Code CLI (@anthropic-ai/claude-code 2.1.328) against the in-suite Messages server.

`wb agent dispatch` runs a profile whose provider points at
`courier.demo.anthropic_server.AnthropicServer` (SSE at `{base}/v1/messages`), with the real
`claude` (installed by scripts/install-claude.sh, which .ci/run calls) first on PATH and
tests/fakes not on it at all; then once more on a loopback sshd machine. What the real binary
allows the worker, checked here, is written up in docs/harnesses.md.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import CREDENTIAL_ENV, CREDENTIAL_VALUE, FAKES, Machine, git, make_clone, require_cli, unavailable

from courier.demo.anthropic_server import (
    COMMIT_MESSAGE,
    FAIL_MESSAGE,
    HELLO_CONTENT,
    HELLO_PATH,
    OUTSIDE_COMMAND,
    OUTSIDE_MESSAGE,
    WRITE_FILE_LIST_COMMAND,
    WRITE_FILE_MESSAGE,
    AnthropicServer,
)
from tests.integration.sshd import SshdFactory, sshd_unavailable_reason

pytestmark = pytest.mark.e2e

CLAUDE_VERSION = "2.1.328"
MODEL = "claude-sonnet-4-5"


def require_claude() -> str:
    """The real `claude` (never the fake); a skip naming the install step, a failure under CI."""
    return require_cli("claude", CLAUDE_VERSION, install="run `bash scripts/install-claude.sh`").executable


@pytest.fixture(scope="module")
def claude_path() -> str:
    return require_claude()


@pytest.fixture(scope="module")
def server() -> Iterator[AnthropicServer]:
    with AnthropicServer() as running:
        yield running


def _config(server: AnthropicServer) -> str:
    providers, profiles = [], []
    for scenario in ("write-file", "fail", "commit", "outside"):
        providers.append(
            f"    {scenario}:\n"
            f"      base_url: {server.base_url_for(scenario)}\n"
            f"      credential_env: {CREDENTIAL_ENV}\n"
            "      wire_api: anthropic\n"
            "      request_max_retries: 0\n"
        )
        profiles.append(f"    {scenario}: {{harness: claude, provider: {scenario}, model: {MODEL}}}\n")
    return "agents:\n  providers:\n" + "".join(providers) + "  profiles:\n" + "".join(profiles)


@pytest.fixture
def real(machine: Machine, server: AnthropicServer, claude_path: str) -> Machine:
    """The `machine` fixture with the real claude on PATH, tests/fakes gone, and one profile per scenario."""
    kept = [d for d in machine.env["PATH"].split(os.pathsep) if d and Path(d).resolve() != FAKES.resolve()]
    bin_dir = str(Path(claude_path).parent)
    machine.env["PATH"] = os.pathsep.join([bin_dir, *(d for d in kept if d != bin_dir)])
    found = shutil.which("claude", path=machine.env["PATH"])
    assert found is not None and Path(found).parent != FAKES
    machine.write_config(_config(server))
    machine.clone()
    server.clear()
    return machine


def _run(machine: Machine, profile: str, worktree: str = "w1") -> dict:  # type: ignore[type-arg]
    done = machine.wb(
        "agent", "dispatch", "--new-worktree", worktree, "--profile", profile, "--repo", "acme/widget",
        "--task", "Do the scripted task.",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    waited = machine.wb("agent", "await", done.stdout.split()[0], "--wait-timeout", "90s", "--json", timeout=120)
    assert waited.returncode == 0, waited.stderr
    result: dict = json.loads(waited.stdout)  # type: ignore[type-arg]
    return result


def _logs(machine: Machine, result: dict) -> list[str]:  # type: ignore[type-arg]
    done = machine.wb("agent", "logs", result["agent_id"], "--tail", "20")
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()[1:]


def _expected_usage(server: AnthropicServer, scenario: str) -> dict[str, object]:
    return {**server.usage_reported(scenario).as_wb_usage(), "reasoning_output_tokens": 0}


def test_a_real_claude_run_writes_the_file_and_reports_the_facts(real: Machine, server: AnthropicServer) -> None:
    result = _run(real, "write-file")
    assert result["state"] == "completed", result
    assert result["exit_code"] == 0 and "failure" not in result
    assert result["result"] == WRITE_FILE_MESSAGE
    assert Path(result["worktree_dir"], HELLO_PATH).read_text() == HELLO_CONTENT
    assert result["changes"]["files_changed"] == 1 and result["changes"]["files"] == [HELLO_PATH]
    assert result["tool_calls"] == 2  # Bash ls, Write hello.txt
    assert [s.step for s in server.served] == [0, 1, 2]
    usage = dict(result["usage"])
    cost = usage.pop("cost_usd")
    assert usage == _expected_usage(server, "write-file")
    assert isinstance(cost, float) and cost > 0  # Claude Code's own estimate from its price table

    assert _logs(real, result) == [f"  ran: {WRITE_FILE_LIST_COMMAND}", "  changed 1 file"]
    posts = [r for r in server.requests if r.method == "POST"]
    assert posts and all(r.headers.get("x-api-key") == CREDENTIAL_VALUE for r in posts)
    assert all(r.path.startswith("/write-file/v1/messages") and r.body["model"] == MODEL for r in posts)
    assert CREDENTIAL_VALUE not in Path(result["log_path"]).read_text()
    events = [json.loads(line) for line in Path(result["log_path"]).read_text().splitlines() if line.startswith("{")]
    init = events[0]
    assert (init["type"], init["permissionMode"], init["mcp_servers"]) == ("system", "acceptEdits", [])
    assert init["claude_code_version"] == CLAUDE_VERSION


def test_an_upstream_error_fails_the_run_with_claudes_message(real: Machine, server: AnthropicServer) -> None:
    result = _run(real, "fail")
    assert result["state"] == "failed" and result["exit_code"] == 1, result
    assert result["failure"].startswith("harness exited with code 1; harness reported an error: API Error: 400")
    assert FAIL_MESSAGE in result["failure"]
    assert "result" not in result
    # request_max_retries 0 stops Claude Code's retries, but on a 400 it still tries again with fewer
    # beta headers (2.1.328 sent 6 requests here): each got the 400, and the run ended at once.
    served = [s for s in server.served if s.scenario == "fail"]
    assert served and all(s.status == 400 for s in served)
    assert result["duration_ms"] < 30_000


def test_the_worker_edits_only_inside_the_worktree_and_its_commands_are_confined_too(
    real: Machine, server: AnthropicServer
) -> None:
    """The narrow flags: Write outside the worktree is denied without a prompt; Bash's write outside fails in
    wb's sandbox (docs/security.md#confined-runs)."""
    result = _run(real, "outside")
    assert result["state"] == "completed" and result["result"] == OUTSIDE_MESSAGE, result
    assert result["sandbox"] == {"kind": "bwrap", "network": "provider"}
    worktree = Path(result["worktree_dir"])
    assert not (worktree.parent / "outside-write-tool.txt").exists()
    assert not (worktree.parent / "outside-bash.txt").exists()
    tool_results = json.dumps([r.body for r in server.requests if r.method == "POST"])
    assert "Read-only file system" in tool_results  # what the model was told the command met
    lines = _logs(real, result)
    assert lines[0] == "  changed 1 file"  # the attempt; the next line says it was denied
    assert lines[1].startswith("  diagnostic: Permission for this tool use was denied.")
    assert lines[2] == f"  ran: {OUTSIDE_COMMAND}"
    assert result["harness_diagnostics"][0].startswith("Permission for this tool use was denied.")


def test_the_worker_can_commit_in_its_worktree(real: Machine, server: AnthropicServer) -> None:
    result = _run(real, "commit")
    assert result["state"] == "completed" and result["result"] == COMMIT_MESSAGE, result
    assert result["changes"]["commits"] == 1
    worktree = Path(result["worktree_dir"])
    assert git(worktree, "log", "-1", "--format=%s").strip() == "wb demo commit"


def test_no_settings_hooks_or_mcp_servers_are_loaded(real: Machine, server: AnthropicServer, tmp_path: Path) -> None:
    """Hooks in the repository's .claude/settings*.json or the user's ~/.claude, and a project .mcp.json, never run."""
    marker = tmp_path / "hooks-ran"
    marker.mkdir()

    def hooks(name: str) -> str:
        command = {"type": "command", "command": f"touch {marker}/{name}"}
        return json.dumps({"hooks": {"SessionStart": [{"hooks": [command]}], "PreToolUse": [{"hooks": [command]}]}})

    clone = real.projects / "acme" / "widget"
    (clone / ".claude").mkdir()
    (clone / ".claude" / "settings.json").write_text(hooks("project"))
    (clone / ".claude" / "settings.local.json").write_text(hooks("local"))
    mcp = {"mcpServers": {"evil": {"command": "/bin/sh", "args": ["-c", f"touch {marker}/mcp"]}}}
    (clone / ".mcp.json").write_text(json.dumps(mcp))
    git(clone, "add", ".")
    git(clone, "commit", "-q", "-m", "project settings with hooks")
    user_claude = Path(real.env["HOME"]) / ".claude"
    user_claude.mkdir()
    (user_claude / "settings.json").write_text(hooks("user"))

    result = _run(real, "write-file")
    assert result["state"] == "completed", result
    assert sorted(os.listdir(marker)) == []


REMOTE_CONFIG = """\
agents:
  providers:
    scripted: {{base_url: '{base_url}', credential_file: {credential}, wire_api: anthropic, request_max_retries: 0}}
  profiles:
    real: {{harness: claude, provider: scripted, model: {model}}}
"""


def test_a_real_claude_run_on_another_machine(
    tmp_path_factory: pytest.TempPathFactory, server: AnthropicServer, claude_path: str
) -> None:
    reason = sshd_unavailable_reason()
    if reason is not None:
        unavailable(reason)
    factory = SshdFactory(tmp_path_factory.mktemp("sshd-claude"))
    try:
        box = factory.start("127.0.0.5")
        os.symlink(claude_path, box.bin_dir / "claude")
        make_clone(box.projects_root / "acme" / "widget")
        credential = box.root / "credential"
        credential.write_text(CREDENTIAL_VALUE)
        credential.chmod(0o600)
        remote_config = box.root / "remote-wb.yaml"
        remote_config.write_text(
            REMOTE_CONFIG.format(base_url=server.base_url_for("write-file"), credential=credential, model=MODEL)
        )
        remote_config.chmod(0o600)
        home = tmp_path_factory.mktemp("caller-claude")
        env = {
            "HOME": str(home),
            "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
            "WB_CONFIG": str(factory.write_wb_config("caller", {"box": factory.target(box)})),
            "WB_HOME": str(home / "wbhome"),
            "WB_SSH_CONFIG": str(factory.client_config),
            "LANG": "C.UTF-8",
        }
        caller = Machine(root=home, env=env)
        server.clear()
        done = caller.wb(
            "agent", "dispatch", "--to", "box", "--new-worktree", "w1", "--profile", "real", "--repo", "acme/widget",
            "--task", "Do the scripted task.",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        ref = done.stdout.split()[0]
        waited = caller.wb("agent", "await", ref, "--wait-timeout", "90s", "--json", timeout=120)
        assert waited.returncode == 0, waited.stderr
        result = json.loads(waited.stdout)
        assert result["machine"] == "box" and result["state"] == "completed", result
        assert result["result"] == WRITE_FILE_MESSAGE
        assert Path(result["worktree_dir"], HELLO_PATH).read_text() == HELLO_CONTENT
        assert result["changes"]["files"] == [HELLO_PATH]
        usage = dict(result["usage"])
        usage.pop("cost_usd")
        assert usage == _expected_usage(server, "write-file")
        logs = caller.wb("agent", "logs", ref)
        assert logs.returncode == 0 and f"  ran: {WRITE_FILE_LIST_COMMAND}" in logs.stdout.splitlines()
        checked = json.loads(caller.wb("machines", "--check", "--json").stdout)
        assert "claude" in checked[0]["harnesses"]
    finally:
        factory.close()
