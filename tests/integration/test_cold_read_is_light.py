"""A cold `wb agent list` and `status` of this machine import neither typer nor asyncio (docs/benchmarks.md).

Measured as a user runs them: the installed `wb` command, WB_COURIER=off, a wb.yaml and a
run record present. typer (and its click) is the argument layer of every other command;
asyncio is for calls to other machines; neither is needed to read this machine's store.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import Machine

from courier.runs.store import Store
from tests.tests_support import imported_modules, sample_record

INSTALLED_WB = Path(sys.executable).parent / "wb"
NOT_ON_THE_COLD_READ_PATH = ("typer", "typer._click", "asyncio", "asyncssh", "courier.cli", "courier.client.fleet")
RUN_ID = "agt-" + "3" * 32
pytestmark = pytest.mark.courier_independent(cold=True)  # each wb here sets WB_COURIER itself



@pytest.mark.parametrize(
    "argv", [["agent", "list", "--json"], ["agent", "status", RUN_ID, "--json"]], ids=["list", "status"]
)
def test_a_cold_read_of_this_machine_imports_no_typer_and_no_asyncio(argv: list[str], machine: Machine) -> None:
    assert INSTALLED_WB.is_file(), f"wb is not installed beside {sys.executable}"
    Store(machine.home).ensure().create(sample_record(agent_id=RUN_ID, state="completed", exit_code=0), "a task")
    names, done = imported_modules([str(INSTALLED_WB), *argv], {**machine.env, "WB_COURIER": "off"}, machine.root)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert RUN_ID in json.dumps(answer)
    assert "courier.hot" in names and "courier.config" in names  # the command really ran here, wb.yaml read
    assert not names & set(NOT_ON_THE_COLD_READ_PATH), sorted(names & set(NOT_ON_THE_COLD_READ_PATH))


def test_a_cold_read_of_an_unchanged_wb_yaml_imports_no_yaml(machine: Machine, monkeypatch: pytest.MonkeyPatch) -> None:
    """The parsed copy (courier/config_cache.py) stands in for the file while the file is unchanged; an edit is
    parsed again, and what it says is what the command does."""
    from courier import config_cache
    from courier.config_file import read_document

    monkeypatch.setenv("XDG_CACHE_HOME", machine.env["HOME"] + "/.cache")
    monkeypatch.setattr(config_cache, "RACY_S", 0.0)
    read_document(machine.config_path)  # as a command run more than 2 s after the file's last change would
    env = {**machine.env, "WB_COURIER": "off"}
    names, done = imported_modules([str(INSTALLED_WB), "agent", "list", "--json"], env, machine.root)
    assert done.returncode == 0, done.stderr
    assert "courier.config" in names and "yaml" not in names
    machine.write_config(machine.config_path.read_text() + "  bad: [\n")
    names, done = imported_modules([str(INSTALLED_WB), "agent", "list", "--json"], env, machine.root)
    assert "yaml" in names and done.returncode == 2 and "invalid YAML" in done.stderr, done.stderr
