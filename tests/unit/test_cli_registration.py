"""How the CLI turns argv into click commands (docs/benchmarks.md, "Start-up"): as few as the call needs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer.core
import typer.main

from courier import cli


@pytest.fixture
def empty_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("WB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("WB_CONFIG", raising=False)
    monkeypatch.setattr(cli, "_prepared", None)  # whatever a test prepares is undone after it
    return tmp_path


def _count_builds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    built: list[str] = []
    original = typer.main.get_command_from_info

    def counting(command_info: typer.models.CommandInfo, **kwargs: object) -> object:
        built.append(cli._command_name(command_info))
        return original(command_info, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(typer.main, "get_command_from_info", counting)
    return built


def test_a_cold_command_builds_only_the_command_it_names(
    empty_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    built = _count_builds(monkeypatch)
    assert cli.run_typer(["agent", "list", "--json"]) == 0  # cli.run would take the hot path (no click at all)
    assert json.loads(capsys.readouterr().out) == []
    assert built == ["list"]


def test_argv_that_names_no_command_builds_them_all(
    empty_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    built = _count_builds(monkeypatch)
    assert cli.run(["agent", "lst"]) == 2
    assert "list" in built and "status" in built and "machines" in built
    assert "No such command 'lst'" in capsys.readouterr().err


def test_a_commands_help_is_the_same_built_alone_and_in_the_whole_tree(
    empty_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.run(["agent", "list", "--help"]) == 0
    alone = capsys.readouterr().out
    cli.prepare()
    assert cli.run(["agent", "list", "--help"]) == 0
    assert capsys.readouterr().out == alone
    assert "--stalled" in alone and alone.startswith("Usage: wb agent list [OPTIONS]")


def test_after_prepare_a_command_builds_nothing(
    empty_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The courier prepares before it forks: its children must find every command and coercion built."""
    cli.prepare()

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("built after prepare")

    monkeypatch.setattr(typer.main, "get_command_from_info", refuse)
    monkeypatch.setattr(typer.main, "get_group_from_info", refuse)
    monkeypatch.setattr(typer.core, "build_runtime_param", refuse)
    assert cli.run(["agent", "list", "--json", "--machine-timeout", "5s"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert cli.run(["agent", "status", "agt-" + "0" * 32]) == 1
    assert cli.run(["agent", "list", "--help"]) == 0
