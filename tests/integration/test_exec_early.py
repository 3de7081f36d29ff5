"""A cold command starts an exec machine's receiver before its own imports (docs/cli.md#exec-targets).

A real local exec machine (`sh -c 'log the start; exec "$@"' env WB_HOME=… wb`), the CLI as a user runs
it with the courier off. The wrapper writes one line per receiver started, its PID: a call that took the
receiver started early starts no second one; a command that asks nothing kills the one it started, and
nothing is created on the machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from conftest import pid_alive, wait_for

from courier import config_cache

pytestmark = pytest.mark.courier_independent(cold=True)  # the cold path is the one this is about

WB = str(Path(sys.executable).parent / "wb")
RUN = "agt-" + "ab" * 16


@dataclass
class Box:
    caller_env: dict[str, str]
    config: Path
    starts: Path  # one line per receiver started: its PID
    home: Path  # the machine's WB_HOME, made by its first answered request

    def wb(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [WB, *args], capture_output=True, text=True, env=self.caller_env, timeout=120, stdin=subprocess.DEVNULL
        )

    def started(self) -> list[int]:
        return [int(line) for line in self.starts.read_text().split()] if self.starts.exists() else []

    def keep_parsed_copy(self) -> None:
        """wb.yaml's parsed copy, as wb keeps it once the file is two seconds old (docs/config.md#the-parsed-copy)."""
        document = yaml.safe_load(self.config.read_text())
        os.environ["XDG_CACHE_HOME"] = self.caller_env["XDG_CACHE_HOME"]
        try:
            assert config_cache.keep_copy(self.config, self.config.stat(), document, racy_s=0.0)
        finally:
            del os.environ["XDG_CACHE_HOME"]


@pytest.fixture
def box(tmp_path: Path) -> Box:
    starts, home = tmp_path / "starts", tmp_path / "box-home"
    machine = [
        "sh", "-c", f'echo "$$" >> {starts}; exec "$@"', "sh",
        "env", f"WB_HOME={home}", f"WB_PROJECTS_ROOT={tmp_path / 'box-projects'}",
        f"WB_CONFIG={tmp_path / 'none.yaml'}",
    ]  # fmt: skip
    config_dir = tmp_path / "config"
    config_dir.mkdir(mode=0o700)
    config = config_dir / "wb.yaml"
    config.write_text(yaml.safe_dump({"session_move": {"targets": {"e1": {"exec": {"argv": machine, "wb_path": WB}}}}}))
    config.chmod(0o600)
    env = {
        "HOME": str(tmp_path),
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "WB_CONFIG": str(config),
        "WB_HOME": str(tmp_path / "caller-home"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "WB_COURIER": "off",
        "LANG": "C.UTF-8",
    }
    return Box(env, config, starts, home)


def test_a_cold_call_takes_the_receiver_it_started_before_its_imports(box: Box) -> None:
    box.keep_parsed_copy()
    done = box.wb("agent", "list", "--to", "e1", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
    assert len(box.started()) == 1  # the receiver started early answered: no second one
    done = box.wb("agent", "status", f"e1:{RUN}")
    assert done.returncode == 1 and f"unknown agent run {RUN}" in done.stderr, done.stderr
    assert len(box.started()) == 2


@pytest.mark.parametrize(
    "argv",
    [
        ("agent", "list", "--to", "e1", "--no-such-flag"),  # refused by the CLI's argument layer (sys.exit)
        ("agent", "logs", f"e1:{RUN}", "--tail", "-3"),  # refused by wb's own check of the value
    ],
)
def test_a_command_that_asks_nothing_ends_the_receiver_it_started_and_creates_nothing(
    box: Box, argv: tuple[str, ...]
) -> None:
    box.keep_parsed_copy()
    done = box.wb(*argv)
    assert done.returncode == 2, done.stderr
    assert len(box.started()) == 1  # started early, before the command line was checked
    assert wait_for(lambda: not pid_alive(box.started()[0]), 10)
    assert not box.home.exists()  # it was killed, or it read an empty request: no home made on the machine


def test_without_a_parsed_copy_the_channel_starts_the_receiver_itself(box: Box) -> None:
    done = box.wb("agent", "list", "--to", "e1", "--no-such-flag")
    assert done.returncode == 2 and box.started() == []  # no guess: the user's command is not run on one
    done = box.wb("agent", "list", "--to", "e1", "--json")
    assert done.returncode == 0, done.stderr
    assert len(box.started()) == 1


def test_a_receiver_given_empty_input_refuses_it_and_creates_no_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {"PATH": os.environ["PATH"], "WB_HOME": str(home), "WB_CONFIG": str(tmp_path / "none.yaml")}
    done = subprocess.run(
        [WB, "--wb-internal-agent-remote"], input=b"", capture_output=True, env=env, timeout=60, check=True
    )
    reply = json.loads(done.stdout)
    assert reply["failure_kind"] == "request" and "empty request" in reply["failure"]
    assert reply["home_id"] is None and not home.exists()


def test_switched_off_the_command_starts_only_for_the_call(box: Box) -> None:
    box.keep_parsed_copy()
    box.caller_env["WB_EXEC_EARLY"] = "off"
    done = box.wb("agent", "list", "--to", "e1", "--no-such-flag")
    assert done.returncode == 2 and box.started() == []
    done = box.wb("agent", "list", "--to", "e1", "--json")
    assert done.returncode == 0, done.stderr
    assert len(box.started()) == 1


def test_without_pidfds_the_channel_ends_the_early_receiver_and_starts_its_own(box: Box, tmp_path: Path) -> None:
    """A kernel before 5.3 has no pidfd_open: the early receiver cannot be watched on the loop."""
    shim = tmp_path / "no-pidfd"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(
        "import os\n\ndef _none(pid, flags=0):\n    raise OSError(38, 'Function not implemented')\n\n"
        "os.pidfd_open = _none\n"
    )
    box.keep_parsed_copy()
    box.caller_env["PYTHONPATH"] = str(shim)
    done = box.wb("agent", "list", "--to", "e1", "--json")
    assert done.returncode == 0 and json.loads(done.stdout) == [], done.stderr
    started = box.started()
    assert len(started) == 2 and not pid_alive(started[0])  # the early one ended, the channel's own answered
