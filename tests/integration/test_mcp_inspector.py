"""`wb mcp` under the MCP Inspector's command-line mode (npm @modelcontextprotocol/inspector, pinned in
scripts/install-inspector.sh), a client nobody here wrote: list the tools, then dispatch, await and diff
a run on a loopback sshd machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import Machine, RealCli, make_machine, prepare_remote, require_cli
from tests_support import sample_record

from courier.mcp_server import available_tools
from courier.runs.process import start_token
from courier.runs.store import Store
from tests import json_documents
from tests.integration.sshd import SshdFactory, SshdServer, sshd_unavailable_reason

pytestmark = [
    pytest.mark.skipif(sshd_unavailable_reason() is not None, reason=str(sshd_unavailable_reason())),
    # `wb mcp` always runs cold and serves every tool in its own process: the WB_COURIER=off pass
    # alone runs this module (tests/conftest.py).
    pytest.mark.courier_independent(cold=True),
]

INSPECTOR_VERSION = "2.12.0"
TOOL_ERROR_EXIT = 5  # the Inspector's exit code for a tool result with isError: true


@pytest.fixture(scope="module")
def inspector() -> RealCli:
    """The pinned Inspector: a skip naming the install step on a developer machine, a failure under CI."""
    return require_cli("mcp-inspector", INSPECTOR_VERSION, install="run `bash scripts/install-inspector.sh`")


@pytest.fixture(scope="module")
def box(sshd: SshdFactory) -> SshdServer:
    server = sshd.start("127.0.0.5")
    prepare_remote(server)
    return server


@pytest.fixture
def supervisor(sshd: SshdFactory, box: SshdServer, tmp_path: Path) -> Machine:
    caller = make_machine(tmp_path / "caller")
    caller.env["WB_CONFIG"] = str(sshd.write_wb_config(f"inspector-{tmp_path.name}", {"box": sshd.target(box)}))
    caller.env["WB_SSH_CONFIG"] = str(sshd.client_config)
    return caller


def run(inspector: RealCli, machine: Machine, *args: str) -> subprocess.CompletedProcess[str]:
    """One Inspector CLI call: it starts `wb mcp` with the machine's environment, asks, and exits."""
    server_env = [f"-e{key}={value}" for key, value in machine.env.items()]
    server = [sys.executable, "-m", "courier.main", "mcp"]
    return subprocess.run(
        [inspector.executable, "--cli", "--cwd", str(machine.root), *server_env, *server, *args],
        capture_output=True,
        text=True,
        env={**machine.env, "PATH": ":".join([*inspector.dirs, machine.env["PATH"]])},
        timeout=300,
        stdin=subprocess.DEVNULL,
    )


def call(inspector: RealCli, machine: Machine, tool: str, **arguments: str) -> dict[str, Any]:
    done = run(
        inspector,
        machine,
        "--method",
        "tools/call",
        "--tool-name",
        tool,
        "--tool-arg",
        *(f"{key}={value}" for key, value in arguments.items()),
    )
    assert done.returncode == 0, (done.stdout, done.stderr)
    result = json.loads(done.stdout)
    assert result["isError"] is False
    document: dict[str, Any] = result["structuredContent"]
    assert json.loads(result["content"][0]["text"]) == document
    return document


def test_the_inspector_lists_the_tools_with_portable_schemas(inspector: RealCli, supervisor: Machine) -> None:
    done = run(inspector, supervisor, "--method", "tools/list", "--strict")
    assert done.returncode == 0, done.stderr  # --strict exits 6 on an error-severity schema problem
    tools = {tool["name"]: tool for tool in json.loads(done.stdout)["tools"]}
    assert set(tools) == {tool.name for tool in available_tools()}
    assert {"dispatch", "await", "status", "list", "logs", "stop", "machines"} <= set(tools)
    for tool in tools.values():
        assert tool["inputSchema"]["type"] == "object" and tool["outputSchema"]["type"] == "object"


def test_the_inspector_dispatches_awaits_and_diffs_a_run_on_a_loopback_machine(
    inspector: RealCli, supervisor: Machine, box: SshdServer
) -> None:
    started = call(
        inspector,
        supervisor,
        "dispatch",
        task="scenario:complete file:inspected.txt",
        profile="fake",
        new_worktree="inspected",
        repo="acme/widget",
        to="box",
    )
    json_documents.check("result", started)
    assert started["machine"] == "box" and started["state"] == "running"
    ref = f"box:{started['agent_id']}"
    assert (box.wb_home / "agents" / started["agent_id"] / "run.json").is_file()

    finished = call(inspector, supervisor, "await", ref=ref, wait_timeout="2m")
    json_documents.check("result", finished)
    assert finished["state"] == "completed" and finished["changes"]["files"] == ["inspected.txt"]

    diff = call(inspector, supervisor, "diff", ref=ref)
    json_documents.check("diff", diff)
    assert diff["machine"] == "box" and [f["path"] for f in diff["files"]] == ["inspected.txt"]
    assert diff["files"][0]["insertions"] == 1 and diff["base_sha"] == finished["base_sha"]
    assert "+Hello from the fake codex." in diff["patch"]

    refused = run(inspector, supervisor, "--method", "tools/call", "--tool-name", "stop", "--tool-arg", f"ref={ref}")
    assert refused.returncode == TOOL_ERROR_EXIT, refused.stderr
    error = json.loads(json.loads(refused.stdout)["content"][0]["text"])
    json_documents.check("error", error)
    message = f"box: agent run {started['agent_id']} is already completed"
    assert error == {"message": message, "class": "finding", "exit_code": 1}


def test_a_default_await_of_a_long_run_answers_before_the_inspectors_request_timeout(
    inspector: RealCli, supervisor: Machine
) -> None:
    """docs/mcp.md: the Inspector gives up on a request after 60 s; `await` by default waits 45 s, then
    returns the run as observed (`terminal: false`), not an error (before, it waited up to 1 h)."""
    record = sample_record(owner_pid=os.getpid(), owner_token=start_token(os.getpid()))  # running while we live
    Store(supervisor.home).ensure().create(record, "task")
    began = time.monotonic()
    observed = call(inspector, supervisor, "await", ref=record.agent_id)
    elapsed = time.monotonic() - began
    json_documents.check("result", observed)
    assert observed["agent_id"] == record.agent_id
    assert observed["state"] == "running" and observed["terminal"] is False
    # The Inspector answered (it fails a request unanswered after 60 s); its own start-up is in `elapsed` too.
    assert elapsed >= 45, f"the await returned after {elapsed:.0f}s, before its 45 s bound"
