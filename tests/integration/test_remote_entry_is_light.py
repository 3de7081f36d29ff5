"""The remote entry is a hot path: it never pays for asyncssh, typer, rich, the MCP SDK or yaml (without a wb.yaml)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tests_support import wb_recording_modules

pytestmark = pytest.mark.courier_independent(cold=True)  # the receiver's private entry, never carried by the courier

HEAVY = (
    "asyncssh", "typer", "rich", "click", "yaml", "cryptography", "mcp", "mcp_types",
    "starlette", "uvicorn", "jsonschema",
)  # fmt: skip


def _imported(
    tmp_path: Path, request: dict[str, object], config: str | None = None
) -> tuple[set[str], dict[str, object]]:
    """Run the receiver as sshd would, and list every top-level package it had loaded when it exited.

    (`-X importtime` cannot see it all: the receiver points its stderr at /dev/null after reading.)
    """
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "WB_HOME": str(tmp_path / "home"),
        "WB_CONFIG": str(tmp_path / "wb.yaml"),
    }
    if config is not None:
        (tmp_path / "wb.yaml").write_text(config)
        (tmp_path / "wb.yaml").chmod(0o600)
    record = tmp_path / "modules.txt"
    program = wb_recording_modules(record, ["--wb-internal-agent-remote"])
    done = subprocess.run(
        [sys.executable, "-c", program], input=json.dumps(request).encode(), capture_output=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    modules = {name.split(".")[0] for name in record.read_text().split()}
    assert "courier" in modules and "protocol" in modules
    return modules, json.loads(done.stdout)


@pytest.mark.parametrize("operation", ["status", "list", "version", "await", "logs", "stop"])
def test_the_receiver_imports_nothing_heavy(tmp_path: Path, operation: str) -> None:
    request: dict[str, object] = {"schema_version": 1, "operation": operation}
    if operation in ("status", "await", "logs", "stop"):
        request["agent_id"] = "agt-" + "0" * 32
    modules, reply = _imported(tmp_path, request)
    assert reply["operation"] == operation
    assert not modules & set(HEAVY), modules & set(HEAVY)


def test_with_a_wb_yaml_only_yaml_is_added(tmp_path: Path) -> None:
    modules, reply = _imported(tmp_path, {"schema_version": 1, "operation": "list"}, config="agents: {}\n")
    assert reply["results"] == []
    assert "yaml" in modules and not modules & {"asyncssh", "typer", "rich", "click", "cryptography"}


@pytest.mark.parametrize("operation", ["status", "list"])
def test_the_receiver_skips_pydantic_plugin_discovery_and_ctypes(tmp_path: Path, operation: str) -> None:
    """importlib.metadata (pydantic's plugin scan, ≈ 20 ms) and ctypes (the owner's prctl) stay unloaded."""
    request: dict[str, object] = {"schema_version": 1, "operation": operation}
    if operation == "status":
        request["agent_id"] = "agt-" + "0" * 32
    _, reply = _imported(tmp_path, request)
    assert reply["operation"] == operation
    loaded = set((tmp_path / "modules.txt").read_text().split())
    assert not loaded & {"importlib.metadata", "ctypes"}, loaded & {"importlib.metadata", "ctypes"}


@pytest.mark.parametrize("operation", ["status", "list"])
def test_the_receiver_loads_only_the_run_service_for_a_read(tmp_path: Path, operation: str) -> None:
    """The handler registry imports one operation's module: no harness, no configuration, no supervisor's loop."""
    request: dict[str, object] = {"schema_version": 1, "operation": operation}
    if operation == "status":
        request["agent_id"] = "agt-" + "0" * 32
    _, reply = _imported(tmp_path, request)
    assert reply["operation"] == operation
    loaded = set((tmp_path / "modules.txt").read_text().split())
    assert "courier.runs.service" in loaded
    unwanted = {
        "courier.runs.harness",
        "courier.runs.loop_ops",
        "courier.config",
        "courier.runs.admission",
        "courier.cli",
        "courier.runs.bwrap_probe",  # asked by `version` only (wb machines --check)
    }
    assert not loaded & unwanted, loaded & unwanted
