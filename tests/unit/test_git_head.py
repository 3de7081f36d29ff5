"""HEAD read from git's files (courier/runs/git_head.py): git's own answer, or None (the caller then asks git).

Every repository here is made by real git; `git rev-parse --verify HEAD` is the reference. The common
layouts (a loose or packed branch, a detached HEAD, a linked worktree, SHA-256) must be read without
git; the rest may only decline.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from courier.runs.git_head import head_commit, index_and_objects
from courier.runs.worktrees import _PLAIN_BRANCH, _plainly_a_branch_name

IDENTITY = ["-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false"]


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", *IDENTITY, *args], cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def git_head(path: Path) -> str | None:
    done = subprocess.run(["git", "rev-parse", "--verify", "--quiet", "HEAD"], cwd=path, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def repository(path: Path, *init: str) -> Path:
    path.mkdir()
    git(path, "init", "-q", "-b", "main", *init)
    (path / "f").write_text("one\n")
    git(path, "add", "f")
    git(path, "commit", "-q", "-m", "one")
    return path


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return repository(tmp_path / "repo")


def test_a_loose_branch(repo: Path) -> None:
    assert head_commit(repo) == git_head(repo) is not None


def test_a_packed_branch_and_one_moved_since(repo: Path) -> None:
    git(repo, "pack-refs", "--all")
    assert not (repo / ".git" / "refs" / "heads" / "main").exists()
    assert head_commit(repo) == git_head(repo) is not None
    (repo / "f").write_text("two\n")
    git(repo, "commit", "-q", "-am", "two")  # the loose file now wins over the packed line
    assert head_commit(repo) == git_head(repo)
    assert head_commit(repo) != git(repo, "rev-parse", "HEAD~1")


def test_a_detached_head(repo: Path) -> None:
    (repo / "f").write_text("two\n")
    git(repo, "commit", "-q", "-am", "two")
    git(repo, "checkout", "-q", "--detach", "HEAD~1")
    assert head_commit(repo) == git_head(repo) == git(repo, "rev-parse", "main~1")


@pytest.mark.parametrize("packed", [False, True])
def test_a_linked_worktree_on_a_nested_branch(repo: Path, tmp_path: Path, packed: bool) -> None:
    worktree = tmp_path / "wt"
    git(repo, "worktree", "add", "-q", "-b", "wb/a/b-c.d", str(worktree), "HEAD")
    (worktree / "f").write_text("two\n")
    git(worktree, "commit", "-q", "-am", "two")
    if packed:
        git(repo, "pack-refs", "--all")
    assert head_commit(worktree) == git_head(worktree) != git_head(repo)
    assert head_commit(repo) == git_head(repo)


def test_sha256_objects(tmp_path: Path) -> None:
    repo = repository(tmp_path / "repo", "--object-format=sha256")
    read = head_commit(repo)
    assert read == git_head(repo) and read is not None and len(read) == 64


def symbolic_branch(repo: Path) -> None:
    git(repo, "symbolic-ref", "refs/heads/alias", "refs/heads/main")
    git(repo, "symbolic-ref", "HEAD", "refs/heads/alias")


def head_file(text: str) -> Callable[[Path], object]:
    return lambda repo: (repo / ".git" / "HEAD").write_text(text)


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda r: git(r, "checkout", "-q", "--orphan", "unborn"), id="unborn branch"),
        pytest.param(symbolic_branch, id="symbolic branch"),
        pytest.param(lambda r: git(r, "symbolic-ref", "HEAD", "refs/remotes/origin/main"), id="outside refs/heads"),
        pytest.param(head_file("ref: refs/heads/../../../HEAD\n"), id="a name that leaves refs"),
        pytest.param(head_file("garbage\n"), id="not a ref"),
    ],
)
def test_anything_else_is_left_to_git(repo: Path, make: Callable[[Path], object]) -> None:
    make(repo)
    assert head_commit(repo) is None


def test_not_a_repository(tmp_path: Path) -> None:
    assert head_commit(tmp_path) is None
    assert index_and_objects(tmp_path) is None
    (tmp_path / ".git").write_text("gitdir: nowhere\n")
    assert head_commit(tmp_path) is None
    assert index_and_objects(tmp_path) is None


def _git_paths(path: Path) -> tuple[str, str]:
    index, objects = git(path, "rev-parse", "--git-path", "index", "--git-path", "objects").splitlines()
    return str((path / index).resolve()), str((path / objects).resolve())


def test_the_index_and_objects_are_where_git_says(repo: Path, tmp_path: Path) -> None:
    worktree = tmp_path / "wt"
    git(repo, "worktree", "add", "-q", "-b", "wb/x", str(worktree), "HEAD")
    for path in (repo, worktree):
        read = index_and_objects(path)
        assert read is not None
        assert tuple(str(Path(found).resolve()) for found in read) == _git_paths(path)
    assert _git_paths(worktree)[0] != _git_paths(repo)[0]  # a linked worktree's own index, the clone's objects


@settings(max_examples=25, deadline=None)
@given(st.from_regex(_PLAIN_BRANCH, fullmatch=True).filter(lambda name: len(name) <= 64))  # a file name's room
def test_any_plain_branch_name_is_read_as_git_reads_it(tmp_path_factory: pytest.TempPathFactory, branch: str) -> None:
    if not _plainly_a_branch_name(branch):
        return
    repo = repository(tmp_path_factory.mktemp("named") / "repo")
    git(repo, "checkout", "-q", "-b", branch)
    assert head_commit(repo) == git_head(repo) is not None
    git(repo, "pack-refs", "--all")
    assert head_commit(repo) == git_head(repo) is not None
