"""The receiver's home from wb.yaml: read once while the file stays the same, again once it changes."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

import courier.config
from courier.errors import UsageError
from courier.runs import context
from courier.runs.context import configured_home


@pytest.fixture
def reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    """Point WB_CONFIG at a private wb.yaml and count how often load_config reads it."""
    directory = tmp_path / "config"
    directory.mkdir(mode=0o700)
    monkeypatch.setenv("WB_CONFIG", str(directory / "wb.yaml"))
    monkeypatch.delenv("WB_HOME", raising=False)
    monkeypatch.setattr(context, "_homes", {})
    calls: list[Path] = []
    real = courier.config.load_config

    def counting(path: Path | None = None) -> courier.config.Config:
        calls.append(Path(str(path)))
        return real(path)

    monkeypatch.setattr(courier.config, "load_config", counting)
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


def test_wb_home_is_resolved_again_when_it_changes(
    tmp_path: Path, reads: Callable[[], int], monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(None)
    monkeypatch.setenv("WB_HOME", str(tmp_path / "from-env-1"))
    assert configured_home() == tmp_path / "from-env-1"
    monkeypatch.setenv("WB_HOME", str(tmp_path / "from-env-2"))
    assert configured_home() == tmp_path / "from-env-2"


def test_without_a_wb_yaml_nothing_is_read(
    tmp_path: Path, reads: Callable[[], int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WB_HOME", str(tmp_path / "plain"))
    assert configured_home() == tmp_path / "plain"
    assert reads() == 0
