"""The receiver's home from wb.yaml: read once while the file stays the same, again once it changes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import courier.config
import courier.config_file
from courier.errors import UsageError
from courier.runs import context
from courier.runs.context import configured_home, configured_settings


@pytest.fixture
def reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    """Point WB_CONFIG at a private wb.yaml and count how often it is read."""
    directory = tmp_path / "config"
    directory.mkdir(mode=0o700)
    monkeypatch.setenv("WB_CONFIG", str(directory / "wb.yaml"))
    monkeypatch.delenv("WB_HOME", raising=False)
    monkeypatch.setattr(context, "_settings", {})
    calls: list[Path] = []
    real = courier.config_file.read_settings

    def counting(path: Path) -> courier.config_file.Settings:
        calls.append(path)
        return real(path)

    monkeypatch.setattr(courier.config_file, "read_settings", counting)
    return lambda: len(calls)


def _write(home: Path | None) -> Path:
    path = Path(os.environ["WB_CONFIG"])
    path.write_text(f"agents:\n  home: {home}\n" if home else "agents: {}\n")
    path.chmod(0o600)
    return path


def test_asked_twice_the_file_is_read_once(tmp_path: Path, reads: Callable[[], int]) -> None:
    _write(tmp_path / "home-a")
    assert configured_home() == tmp_path / "home-a"
    assert configured_home() == tmp_path / "home-a"
    assert reads() == 1


def test_a_rewritten_file_is_read_again(tmp_path: Path, reads: Callable[[], int]) -> None:
    path = _write(tmp_path / "home-a")
    assert configured_home() == tmp_path / "home-a"
    first = path.stat()
    _write(tmp_path / "home-bb")  # another size as well as another mtime: seen even on a coarse clock
    os.utime(path, ns=(first.st_atime_ns, first.st_mtime_ns + 1_000_000))
    assert configured_home() == tmp_path / "home-bb"
    assert reads() == 2


def test_a_file_made_group_writable_is_refused_at_the_next_ask(tmp_path: Path, reads: Callable[[], int]) -> None:
    path = _write(tmp_path / "home-a")
    assert configured_home() == tmp_path / "home-a"
    path.chmod(0o620)  # only the ctime changes
    with pytest.raises(UsageError, match="writable by group or others"):
        configured_home()


def test_the_environment_the_settings_fall_back_on_is_read_again_when_it_changes(
    tmp_path: Path, reads: Callable[[], int], monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(None)
    monkeypatch.setenv("WB_HOME", str(tmp_path / "from-env-1"))
    assert configured_home() == tmp_path / "from-env-1"
    monkeypatch.setenv("WB_HOME", str(tmp_path / "from-env-2"))
    assert configured_home() == tmp_path / "from-env-2"
    monkeypatch.setenv("WB_PROJECTS_ROOT", str(tmp_path / "projects-2"))
    settings = configured_settings()
    assert settings is not None and settings.projects_root == tmp_path / "projects-2"


def test_the_home_comes_without_the_configuration_models(tmp_path: Path) -> None:
    """A receiver with a wb.yaml: the file's checks and its home, not the providers', profiles' and machines' models."""
    directory = tmp_path / "config"
    directory.mkdir(mode=0o700)
    config = directory / "wb.yaml"
    config.write_text(f"agents:\n  home: {tmp_path / 'h'}\n  profiles:\n    p: {{harness: codex, provider: openai}}\n")
    config.chmod(0o600)
    program = (
        "import sys\n"
        "from courier.runs.context import configured_home\n"
        "print(configured_home())\n"
        "print('courier.config' in sys.modules, 'yaml' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        env={**os.environ, "WB_CONFIG": str(config)},
        timeout=60,
        check=True,
    )
    assert done.stdout.split() == [str(tmp_path / "h"), "False", "True"]


def test_the_same_refusals_as_every_command(tmp_path: Path, reads: Callable[[], int]) -> None:
    """What load_config refuses outside the entries, configured_home refuses too."""
    path = _write(tmp_path / "home-a")
    path.write_text(f"agents:\n  home: {tmp_path}\ncourier:\n  idle: 0s\n")
    with pytest.raises(UsageError, match=r"courier\.idle") as home_refusal:
        configured_home()
    with pytest.raises(UsageError) as config_refusal:
        courier.config.load_config(path)
    assert str(home_refusal.value) == str(config_refusal.value)


def test_without_a_wb_yaml_nothing_is_read(
    tmp_path: Path, reads: Callable[[], int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WB_HOME", str(tmp_path / "plain"))
    assert configured_home() == tmp_path / "plain"
    assert reads() == 0
