"""The benchmarks name the filesystem their scratch lives on (bench/common.py `disk_description`)."""

from __future__ import annotations

from pathlib import Path

from bench.common import disk_description


def test_a_memory_filesystem_and_procfs_are_named_by_their_type() -> None:
    assert disk_description(Path("/dev/shm")) == "tmpfs"
    assert disk_description(Path("/proc/self")) == "proc"


def test_a_path_that_is_not_there_is_an_unknown_filesystem(tmp_path: Path) -> None:
    assert disk_description(tmp_path / "gone") == "an unknown filesystem"
