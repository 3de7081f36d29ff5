"""The run's diff (docs/cli.md, wb agent diff) against real git: complete, applicable, and touching nothing."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest
from conftest import git, make_clone

from courier.runs.patch import DiffFailed, compute_diff

pytestmark = pytest.mark.courier_independent(cold=True)  # compute_diff in this process: no wb command

EMPTY_BLOB = "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"


def _tree_fingerprint(path: Path) -> tuple[str, bytes, list[str]]:
    """The worktree's porcelain status, its index bytes and the object store's listing."""
    status = git(path, "status", "--porcelain=v1", "-z", "--untracked-files=all")
    index = (path / ".git" / "index").read_bytes()
    # Intent-to-add entries name the well-known empty blob, which git may write; nothing else may appear.
    objects = sorted(
        str(p.relative_to(path / ".git" / "objects"))
        for p in (path / ".git" / "objects").rglob("*")
        if p.is_file() and p.name != EMPTY_BLOB[2:]
    )
    return status, hashlib.sha256(index).digest(), objects


def _dirty_clone(tmp_path: Path) -> tuple[Path, str]:
    repo = make_clone(tmp_path / "repo")
    (repo / "gone.txt").write_text("to be deleted\n")
    (repo / "blob.bin").write_bytes(b"\x00\x01\x02binary\xff")
    (repo / ".gitignore").write_text("*.log\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "second")
    base = git(repo, "rev-parse", "HEAD").strip()
    (repo / "README.md").write_text("# widget\nmore\n")
    (repo / "gone.txt").unlink()
    (repo / "blob.bin").write_bytes(b"\x00\x09binary changed\xfe")
    (repo / "new dir").mkdir()
    (repo / "new dir" / "créé.txt").write_text("one\ntwo\n")
    (repo / "new.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00binary")
    (repo / "noise.log").write_text("ignored\n")
    git(repo, "add", "README.md")  # a staged change is part of the change too
    return repo, base


def test_diff_includes_new_deleted_and_binary_files_and_applies_on_a_fresh_checkout(tmp_path: Path) -> None:
    """The patch holds tracked changes, new untracked files and binary files; git apply recreates the tree."""
    repo, base = _dirty_clone(tmp_path)
    diff = compute_diff(str(repo), base)
    by_path = {change.path: change for change in diff.files}
    assert set(by_path) == {"README.md", "gone.txt", "blob.bin", "new dir/créé.txt", "new.png"}
    assert by_path["README.md"].status == "modified" and by_path["README.md"].insertions == 1
    assert by_path["gone.txt"].status == "deleted" and by_path["gone.txt"].deletions == 1
    assert by_path["new dir/créé.txt"].status == "added" and by_path["new dir/créé.txt"].insertions == 2
    assert by_path["new.png"].binary and by_path["blob.bin"].binary
    assert diff.base_sha == base and diff.head_sha == base

    fresh = tmp_path / "fresh"
    subprocess.run(["git", "clone", "-q", str(repo), str(fresh)], check=True, capture_output=True)
    git(fresh, "checkout", "-q", base)
    subprocess.run(["git", "apply", "--index", "-"], cwd=fresh, input=diff.patch, check=True, capture_output=True)
    for name in ("README.md", "blob.bin", "new dir/créé.txt", "new.png"):
        assert (fresh / name).read_bytes() == (repo / name).read_bytes(), name
    assert not (fresh / "gone.txt").exists()
    assert not (fresh / "noise.log").exists()


def test_diff_leaves_status_index_and_object_store_byte_identical(tmp_path: Path) -> None:
    """A temporary index: the worktree's own index, its status and .git/objects are untouched (the empty blob aside)."""
    repo, base = _dirty_clone(tmp_path)
    before = _tree_fingerprint(repo)
    compute_diff(str(repo), base)
    compute_diff(str(repo), base, with_patch=False)
    assert _tree_fingerprint(repo) == before


def test_diff_counts_commits_made_since_the_base(tmp_path: Path) -> None:
    """A commit on top of the base is part of the change; head_sha names it."""
    repo = make_clone(tmp_path / "repo")
    base = git(repo, "rev-parse", "HEAD").strip()
    (repo / "committed.txt").write_text("c\n")
    git(repo, "add", "committed.txt")
    git(repo, "commit", "-q", "-m", "work")
    diff = compute_diff(str(repo), base)
    assert [change.path for change in diff.files] == ["committed.txt"]
    assert diff.head_sha == git(repo, "rev-parse", "HEAD").strip() != base


def test_a_clean_worktree_has_an_empty_diff(tmp_path: Path) -> None:
    repo = make_clone(tmp_path / "repo")
    diff = compute_diff(str(repo), git(repo, "rev-parse", "HEAD").strip())
    assert diff.files == [] and diff.patch == b""


def test_a_gone_worktree_is_a_finding_naming_it(tmp_path: Path) -> None:
    with pytest.raises(DiffFailed, match=str(tmp_path / "nowhere")) as caught:
        compute_diff(str(tmp_path / "nowhere"), None)
    assert caught.value.exit_code == 1
