"""A warm command's own process is the thin client (docs/courier.md): it imports almost nothing.

Measured as a user runs it: the installed `wb` command of this environment, the courier started
by an earlier command. Every module it loads is a few hundred microseconds of every warm call.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Machine

from tests.tests_support import imported_modules

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the courier is Linux-only"),
    pytest.mark.courier_independent(cold=True),  # each wb here sets WB_COURIER itself
]
INSTALLED_WB = Path(sys.executable).parent / "wb"
# What a warm call must not load: the regex engine, enum (the `socket`/`signal` packages build
# enums of every constant), the socket and signal packages themselves, and anything of the CLI.
NOT_ON_THE_WARM_PATH = ("re", "enum", "socket", "signal", "selectors", "typer", "pydantic", "asyncio", "json")



def test_a_warm_command_imports_only_the_thin_client(machine: Machine) -> None:
    assert INSTALLED_WB.is_file(), f"wb is not installed beside {sys.executable}"
    first = subprocess.run(
        [str(INSTALLED_WB), "agent", "list", "--json"],
        capture_output=True,
        text=True,
        env={**machine.env, "WB_COURIER": "on"},
        cwd=machine.root,
        timeout=120,
    )
    try:
        assert first.returncode == 0, first.stderr
        names, done = imported_modules(
            [str(INSTALLED_WB), "agent", "list", "--json"], {**machine.env, "WB_COURIER": "on"}, machine.root
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == []
        assert "courier.warm.thin_client" in names  # the warm path was taken
        assert not names & set(NOT_ON_THE_WARM_PATH), sorted(names & set(NOT_ON_THE_WARM_PATH))
    finally:
        subprocess.run(
            [str(INSTALLED_WB), "courier", "stop"], env={**machine.env, "WB_COURIER": "on"}, capture_output=True
        )


def test_a_cold_list_does_not_scan_installed_distributions(machine: Machine) -> None:
    """pydantic's plugin loader (importlib.metadata and an entry-point scan) is not on wb's path."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", str(INSTALLED_WB), "agent", "list", "--json"],
        capture_output=True,
        text=True,
        env={**machine.env, "WB_COURIER": "off"},
        cwd=machine.root,
        timeout=120,
    )
    names = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
    assert "courier.hot" in names  # the cold path was taken (list without typer, courier/hot.py)
    assert "importlib.metadata" not in names
