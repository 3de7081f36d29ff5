"""The parsed copy of wb.yaml (courier/config_cache.py; docs/config.md#the-parsed-copy): used only for exactly the
file it was made from, trusted only when it is the user's own and closed, never an error."""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

import pytest

from courier import config_cache
from courier.config_file import read_document

TEXT = "agents:\n  profiles:\n    fake: {harness: codex, model: gpt-5.5}\n"
DOCUMENT = {"agents": {"profiles": {"fake": {"harness": "codex", "model": "gpt-5.5"}}}}


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    directory = tmp_path / "config"
    directory.mkdir(mode=0o700)
    path = directory / "wb.yaml"
    path.write_text(TEXT)
    path.chmod(0o600)
    return path


def after_a_tick(path: Path) -> None:
    """Return once the file system's clock has moved past `path`'s last change (the next write differs in ctime)."""
    probe = path.with_name(".probe")
    while True:
        probe.write_text("")
        if probe.stat().st_ctime_ns > path.stat().st_ctime_ns:
            probe.unlink()
            return


def kept_copy() -> Path:
    directory = config_cache.cache_dir()
    assert directory is not None
    (copy,) = directory.glob("config-*.json")
    return copy


def test_an_unchanged_file_is_read_from_its_copy(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config_cache, "RACY_S", 0.0)
    assert read_document(config) == DOCUMENT
    copy = kept_copy()
    assert copy.stat().st_mode & 0o777 == 0o600 and copy.parent.stat().st_mode & 0o777 == 0o700
    # What the copy says is what the next read gets: it is the copy being read, not the file.
    kept = json.loads(copy.read_text())
    kept["document"]["agents"]["profiles"]["fake"]["model"] = "from-the-copy"
    copy.write_text(json.dumps(kept))
    assert read_document(config)["agents"]["profiles"]["fake"]["model"] == "from-the-copy"


def test_any_change_of_the_file_is_parsed_again(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config_cache, "RACY_S", 0.0)
    read_document(config)
    after_a_tick(config)
    # The same size, the same second: only the stat's nanoseconds and the inode can tell.
    config.write_text(TEXT.replace("gpt-5.5", "gpt-5.6"))
    assert read_document(config)["agents"]["profiles"]["fake"]["model"] == "gpt-5.6"
    replacement = config.with_name("new.yaml")
    replacement.write_text(TEXT.replace("gpt-5.5", "gpt-5.7"))
    replacement.chmod(0o600)
    replacement.replace(config)  # an editor's save: a new inode
    assert read_document(config)["agents"]["profiles"]["fake"]["model"] == "gpt-5.7"


def test_a_file_changed_within_the_racy_window_is_not_copied(config: Path) -> None:
    assert read_document(config) == DOCUMENT
    directory = config_cache.cache_dir()
    assert directory is not None and not list(directory.glob("config-*.json"))
    info = config.stat()
    assert not config_cache.keep_copy(config, info, DOCUMENT)  # the default window, 2 s
    assert config_cache.keep_copy(config, info, DOCUMENT, racy_s=0.0)


@pytest.mark.parametrize(
    "document",
    [{"a": datetime.date(2026, 12, 6)}, {"a": b"binary"}, {1: "an integer key"}, {"a": {"b", "c"}}],
    ids=["date", "binary", "integer-key", "set"],
)
def test_what_json_would_not_give_back_is_not_copied(config: Path, document: dict[object, object]) -> None:
    assert not config_cache.keep_copy(config, config.stat(), document, racy_s=0.0)  # type: ignore[arg-type]
    assert config_cache.read_copy(config, config.stat()) is None


def test_a_copy_others_could_write_or_of_another_file_is_not_used(config: Path) -> None:
    info = config.stat()
    assert config_cache.keep_copy(config, info, DOCUMENT, racy_s=0.0)
    copy = kept_copy()
    assert config_cache.read_copy(config, info) == DOCUMENT
    copy.chmod(0o620)
    assert config_cache.read_copy(config, info) is None
    copy.chmod(0o600)
    copy.parent.chmod(0o770)
    assert config_cache.read_copy(config, info) is None
    copy.parent.chmod(0o700)
    other = config.with_name("other.yaml")  # a copy names its file: a name shared by two paths is a miss
    assert config_cache.read_copy(other, info) is None
    copy.write_text("{not json")
    assert config_cache.read_copy(config, info) is None


def test_a_cache_that_cannot_be_written_changes_nothing(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocked = config.parent.parent / "not-a-directory"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    monkeypatch.setattr(config_cache, "RACY_S", 0.0)
    assert read_document(config) == DOCUMENT
    assert not config_cache.keep_copy(config, config.stat(), DOCUMENT)
    assert sorted(os.listdir(config.parent.parent)) == ["config", "not-a-directory"]


def test_config_check_reads_the_file_itself_and_keeps_no_copy(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config_cache, "RACY_S", 0.0)
    assert read_document(config, use_copy=False) == DOCUMENT
    directory = config_cache.cache_dir()
    assert directory is not None and not directory.exists()
    assert config_cache.keep_copy(config, config.stat(), {"agents": {}})
    assert read_document(config) == {"agents": {}} and read_document(config, use_copy=False) == DOCUMENT
