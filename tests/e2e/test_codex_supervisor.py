"""A real agent as the supervisor: the real Codex 0.169.0 drives wb through `wb mcp`.

Codex runs with a private CODEX_HOME whose config.toml registers `wb mcp` as the MCP server
`wb`; its model is the scripted server's `supervise` scenario, which reads the tool names from
the request's `tools` list, calls `dispatch` (to a loopback sshd machine running the fake
Codex) and then `await`. The test checks, independently of Codex, that the run it dispatched
exists on that machine and completed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import CREDENTIAL_ENV, CREDENTIAL_VALUE, REPO_ROOT, make_machine, prepare_remote, require_cli

from courier.demo.model_server import ModelServer, mcp_tool
from tests.integration.sshd import SshdFactory, SshdServer, sshd_unavailable_reason

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(sshd_unavailable_reason() is not None, reason=str(sshd_unavailable_reason())),
]

# Not in Codex's bundled model catalogue: Codex then offers MCP tools directly (a `mcp__wb`
# namespace) instead of deferring them behind its tool_search tool.
SUPERVISOR_MODEL = "wb-scripted-supervisor"
CODEX_VERSION = "0.169.0"


def _toml(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def _codex_home(root: Path, server: ModelServer, mcp_env: dict[str, str]) -> Path:
    home = root / "codex-home"
    home.mkdir(mode=0o700)
    env_table = ", ".join(f"{key} = {_toml(value)}" for key, value in sorted(mcp_env.items()))
    (home / "config.toml").write_text(
        f"model = {_toml(SUPERVISOR_MODEL)}\n"
        'model_provider = "scripted"\n'
        'approval_policy = "never"\n'
        "[model_providers.scripted]\n"
        'name = "scripted"\n'
        f"base_url = {_toml(server.base_url_for('supervise'))}\n"
        f"env_key = {_toml(CREDENTIAL_ENV)}\n"
        'wire_api = "responses"\n'
        "request_max_retries = 0\n"
        "stream_max_retries = 0\n"
        "[mcp_servers.wb]\n"
        f"command = {_toml(sys.executable)}\n"
        'args = ["-m", "courier.main", "mcp"]\n'
        f"env = {{ {env_table} }}\n"
        # Wait for wb's tools before the first model request, and give a loaded machine time.
        "required = true\n"
        # dispatch and await are not read-only; with approval_policy never Codex refuses them unless approved here.
        'default_tools_approval_mode = "approve"\n'
        "startup_timeout_sec = 60\n"
        "tool_timeout_sec = 600\n"
    )
    return home


def test_codex_dispatches_and_awaits_a_run_through_wb_mcp(sshd: SshdFactory, tmp_path: Path) -> None:
    codex_dirs = require_cli("codex", CODEX_VERSION, install="run `bash scripts/install-codex.sh`").dirs
    box: SshdServer = sshd.start("127.0.0.4")
    prepare_remote(box)
    supervisor = make_machine(tmp_path / "supervisor")
    supervisor.env["WB_CONFIG"] = str(sshd.write_wb_config("codex-supervisor", {"box": sshd.target(box)}))
    supervisor.env["WB_SSH_CONFIG"] = str(sshd.client_config)
    mcp_env = {
        key: supervisor.env[key]
        for key in ("HOME", "PATH", "LANG", "WB_CONFIG", "WB_HOME", "WB_SSH_CONFIG", "PYTHONPATH", "GIT_CONFIG_GLOBAL")
    }
    workdir = tmp_path / "work"
    workdir.mkdir()
    subprocess.run(["git", "init", "-q", str(workdir)], check=True)
    arguments = {
        "task": "scenario:complete file:supervised.txt message:done under supervision",
        "profile": "fake",
        "new_worktree": "supervised",
        "repo": "acme/widget",
        "to": "box",
    }
    prompt = f"Start this task with wb and wait until it ends.\ndispatch: {json.dumps(arguments)}\n"
    with ModelServer() as server:
        codex_home = _codex_home(tmp_path, server, mcp_env)
        env = {
            "HOME": str(tmp_path),
            "PATH": os.pathsep.join([*codex_dirs, "/usr/bin", "/bin"]),
            "CODEX_HOME": str(codex_home),
            CREDENTIAL_ENV: CREDENTIAL_VALUE,
            "LANG": "C.UTF-8",
        }
        done = subprocess.run(
            ["codex", "exec", "--json", "--skip-git-repo-check", "-C", str(workdir), "-s", "read-only", "-"],
            input=prompt,
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO_ROOT,
            timeout=600,
        )
        first = next(r.body for r in server.requests if r.method == "POST" and isinstance(r.body, dict))
        served = [(r.scenario, r.step) for r in server.served]
    assert done.returncode == 0, done.stderr[-3000:]
    # The names the model read: wb's tools as Codex 0.169.0 offers them.
    assert mcp_tool(first, "dispatch") == ("mcp__wb", "dispatch")
    assert mcp_tool(first, "await") == ("mcp__wb", "await")
    assert served == [("supervise", 0), ("supervise", 1), ("supervise", 2)], done.stdout[-4000:]

    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    calls = [e["item"] for e in events if e.get("type") == "item.completed" and e["item"]["type"] == "mcp_tool_call"]
    assert [(c["server"], c["tool"], c["status"]) for c in calls] == [
        ("wb", "dispatch", "completed"),
        ("wb", "await", "completed"),
    ], calls
    started: dict[str, Any] = calls[0]["result"]["structured_content"]
    assert started["machine"] == "box" and started["state"] == "running"
    ref = f"box:{started['agent_id']}"
    messages = [e["item"]["text"] for e in events if e.get("item", {}).get("type") == "agent_message"]
    assert messages[-1] == f"Supervised {ref}: completed."

    # Independently of Codex: the run exists on the loopback machine and completed there.
    status = supervisor.wb("agent", "status", ref, "--json")
    assert status.returncode == 0, status.stderr
    result = json.loads(status.stdout)
    assert result["state"] == "completed" and result["result"] == "done under supervision"
    assert result["changes"]["files"] == ["supervised.txt"]
    assert (box.wb_home / "agents" / started["agent_id"] / "run.json").is_file()
