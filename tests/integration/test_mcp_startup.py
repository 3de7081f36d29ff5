"""`wb mcp` imports only what it answers needs (docs/mcp.md#start-up): the SDK for `initialize`,
the operation modules and the document models for `tools/list`, the rest on the first call.

Observed through the installed console script with PYTHONPROFILEIMPORTTIME (which prints every
module as it is imported on stderr), as a client starts it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

pytestmark = pytest.mark.courier_independent(cold=True)  # `wb mcp` always runs cold (courier/main.py COLD_COMMANDS)

WB = str(Path(sys.executable).parent / "wb")
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}},
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
TOOLS_LIST = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
# Never needed to answer initialize or tools/list: the CLI's argument layer, the configuration,
# the transports and SSH.
NOT_FOR_LISTING = (
    "typer",
    "asyncssh",
    "yaml",
    "courier.cli",
    "courier.config",
    "courier.client.transport",
    "courier.client.asking",
)
# The SDK's parts a stdio server never uses, which its package inits would import (courier/bare_packages.py).
NOT_FOR_A_STDIO_SERVER = ("mcp.client", "mcp.server.mcpserver", "mcp.cli")


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    config = tmp_path / "wb.yaml"
    config.write_text("agents: {}\n")
    config.chmod(0o600)
    environment = {k: v for k, v in os.environ.items() if not k.startswith("WB_")}
    return {**environment, "WB_HOME": str(tmp_path / "home"), "WB_CONFIG": str(config), "PYTHONPROFILEIMPORTTIME": "1"}


def serve(
    env: dict[str, str], tmp_path: Path, *messages: Mapping[str, object]
) -> tuple[dict[int, dict[str, object]], set[str]]:
    """The answers by id, and every module imported, of `wb mcp` given these lines (stdin closed once answered)."""
    asked = {message["id"] for message in messages if "id" in message}
    with open(tmp_path / "stderr", "w+") as stderr:  # a file: the import lines overflow a pipe
        server = subprocess.Popen([WB, "mcp"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr)
        assert server.stdin is not None and server.stdout is not None
        with server:  # closes its pipes and reaps it; killed first if the exchange fails
            try:
                server.stdin.write("".join(json.dumps(message) + "\n" for message in messages).encode())
                server.stdin.flush()
                answers: dict[int, dict[str, object]] = {}
                while set(answers) != asked and (answer := server.stdout.readline()):
                    message = json.loads(answer)
                    answers[message["id"]] = message
                server.stdin.close()
                assert server.wait(timeout=120) == 0
            except BaseException:
                server.kill()
                raise
        stderr.seek(0)
        imported = set()
        for line in stderr.read().splitlines():
            if line.startswith("import time:") and "|" in line:
                imported.add(line.rsplit("|", 1)[1].strip())
    return answers, imported


def test_initialize_is_answered_with_the_sdk_alone(env: dict[str, str], tmp_path: Path) -> None:
    answers, imported = serve(env, tmp_path, INITIALIZE)
    assert answers[1]["result"]["serverInfo"]["name"] == "wb"  # type: ignore[index]
    assert "mcp.types" in imported and "mcp.server.lowlevel" in imported
    found = sorted(name for name in imported if name.startswith(("courier.", "protocol")) or name in NOT_FOR_LISTING)
    # The entry point's own: its exit codes (protocol.limits) and the stage marks (off unless WB_STAGE_TRACE).
    wb_modules = ["courier.bare_packages", "courier.errors", "courier.main", "courier.mcp_server"]
    wb_modules.append("courier.stage_trace")
    assert found == [*wb_modules, "protocol", "protocol.entry", "protocol.limits"], found
    assert sorted(imported & set(NOT_FOR_A_STDIO_SERVER)) == []


def test_tools_list_is_answered_without_the_cli_the_configuration_or_ssh(env: dict[str, str], tmp_path: Path) -> None:
    answers, imported = serve(env, tmp_path, INITIALIZE, INITIALIZED, TOOLS_LIST)
    names = {tool["name"] for tool in answers[2]["result"]["tools"]}  # type: ignore[index]
    assert "dispatch" in names and "machines" in names
    assert "courier.ops" in imported
    assert sorted(name for name in NOT_FOR_LISTING if name in imported) == []
