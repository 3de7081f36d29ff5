"""Branch names wb accepts without asking git (courier/runs/worktrees.py): every one of them git accepts too.

`check_branch_name` skips `git check-ref-format --branch` for plain names (the default `wb/<worktree>`
among them); a name it is not sure of is still asked of git, so only the first direction needs proof.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from courier.errors import UsageError
from courier.runs import git as runs_git
from courier.runs import worktrees
from courier.runs.worktrees import _PLAIN_BRANCH, _plainly_a_branch_name


def git_accepts(branch: str) -> bool:
    done = subprocess.run(["git", "check-ref-format", "--branch", branch], capture_output=True, check=False)
    return done.returncode == 0


@settings(max_examples=100, deadline=None)
@given(st.from_regex(_PLAIN_BRANCH, fullmatch=True))
def test_a_plain_name_is_one_git_accepts(branch: str) -> None:
    if _plainly_a_branch_name(branch):
        assert git_accepts(branch), branch


@pytest.mark.parametrize("branch", ["wb/w1", "wb/fix-login.v2", "feature/a_b/c-d", "x"])
def test_the_usual_names_are_plain(branch: str) -> None:
    assert _plainly_a_branch_name(branch) and git_accepts(branch)


@pytest.mark.parametrize(
    "branch",
    ["a..b", "wb/x.lock", ".hidden", "trailing.", "a//b", "a/", "x@{1}", "has space", "HEAD", "wb/ä", "-", "-x"],
)
def test_anything_else_is_asked_of_git(branch: str) -> None:
    assert not _plainly_a_branch_name(branch)


def test_git_still_judges_what_is_not_plain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[list[str]] = []
    real = runs_git.run_git

    def recording(args: list[str], *rest: Any, **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
        asked.append(args)
        return real(args, *rest, **kwargs)

    monkeypatch.setattr(worktrees, "run_git", recording)
    worktrees.check_branch_name(tmp_path, "wb/w1")
    assert asked == []
    with pytest.raises(UsageError) as refused:
        worktrees.check_branch_name(tmp_path, "bad..name")
    assert 'git refuses the branch name "bad..name"' in refused.value.message
    assert asked == [["check-ref-format", "--branch", "bad..name"]]
