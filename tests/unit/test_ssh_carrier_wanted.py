"""Whether a cold command forks the SSH carrier (courier/channels/carrier_choice.py), from its argv and
wb.yaml's parsed copy: a wrong yes costs a copy that imports asyncssh for nothing, a wrong no the overlap."""

from __future__ import annotations

from pathlib import Path

import pytest

from courier import config_cache
from courier.channels import carrier_choice, ssh_carrier

REF = "agt-" + "ab" * 16


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = tmp_path / "wb.yaml"
    path.write_text("")
    monkeypatch.setenv("WB_CONFIG", str(path))
    return path


@pytest.mark.parametrize(
    ("argv", "wanted"),
    [
        (["agent", "list"], False),
        (["agent", "list", "--to", "box"], True),
        (["agent", "list", "--to=box"], True),
        (["agent", "status", f"box:{REF}"], True),
        (["agent", "status", REF], False),
        (["agent", "list", "--all"], True),
        (["agent", "dispatch", "--to", "auto:gpu", "--task", "x"], True),
        (["machines"], True),
        (["agent", "list", "--to", "box", "--help"], False),
        (["config", "check"], False),
        ([], False),
    ],
)
def test_without_a_parsed_copy_any_other_machine_is_a_guess_of_ssh(
    config: Path, argv: list[str], wanted: bool
) -> None:
    assert carrier_choice.wanted(argv) is wanted


def test_the_parsed_copy_tells_an_exec_machine_from_an_ssh_one(config: Path) -> None:
    document = {
        "session_move": {
            "targets": {"box": {"exec": {"argv": ["docker", "exec", "-i", "box"]}}, "far": {"ssh": {"host": "far"}}}
        }
    }
    assert config_cache.keep_copy(config, config.stat(), document, racy_s=0.0)
    assert not carrier_choice.wanted(["agent", "list", "--to", "box"])
    assert not carrier_choice.wanted(["agent", "status", f"box:{REF}"])
    assert carrier_choice.wanted(["agent", "status", f"far:{REF}"])
    assert carrier_choice.wanted(["agent", "list", "--all"])  # far is among all
    assert not carrier_choice.wanted(["agent", "list", "--to", "unknown"])  # refused before any call


def test_switched_off_no_carrier_is_started(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ssh_carrier.ENV, "off")
    assert ssh_carrier.start() is None and ssh_carrier.current() is None


def test_a_process_forked_from_the_command_neither_uses_nor_ends_its_carrier(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's owner is a fork of the cold CLI: at its exit it must not kill the carrier's pid, which by then may be
    any other process's (it was the Ray tier's namespace holder once)."""
    import os

    monkeypatch.delenv(ssh_carrier.ENV, raising=False)
    carrier = ssh_carrier.start()
    assert carrier is not None and ssh_carrier.current() is carrier
    try:
        child = os.fork()
        if child == 0:  # as an owner forked from the command would, at its exit
            code = 0 if ssh_carrier.current() is None else 3
            ssh_carrier.finish()
            os._exit(code)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert os.waitpid(carrier.pid, os.WNOHANG) == (0, 0)  # still running: the fork left it alone
    finally:
        ssh_carrier.finish()
    assert ssh_carrier.current() is None
