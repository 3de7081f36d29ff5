"""summarize_changes, count_dirty and run_git against real git repositories (docs/runs.md#summaries)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from courier.runs.changes import GitFailed, count_dirty, porcelain_paths, summarize_changes
from courier.runs.git import NOT_RUN, TIMED_OUT, run_git
from protocol.models import ChangeSummary

pytestmark = pytest.mark.courier_independent(cold=True)  # in-process git helpers: no wb command


def git(cwd: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com",
        "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
    }  # fmt: skip
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "repo"
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    (path / "README.md").write_text("one\ntwo\nthree\n")
    (path / "gone.txt").write_text("bye\n")
    git(path, "add", ".")
    git(path, "commit", "-q", "-m", "initial")
    return path, git(path, "rev-parse", "HEAD").strip()


def test_clean_worktree(repo: tuple[Path, str]) -> None:
    path, base = repo
    assert summarize_changes(str(path), base, None) == ChangeSummary(
        files_changed=0, insertions=0, deletions=0, new_files=0, commits=0
    )
    assert count_dirty(str(path)) == 0


def test_new_modified_and_deleted_files(repo: tuple[Path, str]) -> None:
    path, base = repo
    (path / "hello.txt").write_text("hello\n")  # untracked: listed, a new file, its line counted
    (path / "README.md").write_text("one\n2\nthree\nfour\n")  # 2 insertions, 1 deletion
    (path / "gone.txt").unlink()  # 1 deletion
    summary = summarize_changes(str(path), base, 3)
    assert summary is not None
    assert summary.files_changed == 3
    assert sorted(summary.files or []) == ["README.md", "gone.txt", "hello.txt"]
    assert (summary.insertions, summary.deletions) == (3, 2)
    assert summary.new_files == 1
    assert summary.commits == 0
    assert summary.files_truncated is None
    assert summary.preexisting_changes == 3
    assert count_dirty(str(path)) == 3


def test_commits_since_base_count_and_their_lines(repo: tuple[Path, str]) -> None:
    path, base = repo
    for index in range(2):
        (path / f"c{index}.txt").write_text("x\ny\n")
        git(path, "add", ".")
        git(path, "commit", "-q", "-m", f"c{index}")
    summary = summarize_changes(str(path), base, None)
    assert summary is not None
    assert summary.commits == 2
    assert summary.files_changed == 0  # committed work is clean in status
    assert (summary.insertions, summary.deletions) == (4, 0)  # but counted against the base
    assert summary.preexisting_changes is None


def test_renamed_files_are_one_entry(repo: tuple[Path, str]) -> None:
    path, base = repo
    git(path, "mv", "gone.txt", "moved.txt")
    summary = summarize_changes(str(path), base, None)
    assert summary is not None and summary.files == ["moved.txt"] and summary.files_changed == 1


def test_sixty_files_list_fifty_and_say_truncated(repo: tuple[Path, str]) -> None:
    path, base = repo
    for index in range(60):
        (path / f"f{index:02}.txt").write_text(f"{index}\n")
    summary = summarize_changes(str(path), base, 0)
    assert summary is not None
    assert summary.files_changed == 60
    assert summary.files == [f"f{index:02}.txt" for index in range(50)]
    assert summary.files_truncated is True
    wire = summary.to_wire()
    assert wire["files_truncated"] is True and len(wire["files"]) == 50


def test_without_a_base_lines_are_against_head_and_commits_omitted(repo: tuple[Path, str]) -> None:
    path, _ = repo
    (path / "README.md").write_text("one\n")
    summary = summarize_changes(str(path), None, None)
    assert summary is not None
    assert (summary.insertions, summary.deletions, summary.commits) == (0, 2, None)


def test_an_unknown_base_degrades_only_the_fields_it_fills(repo: tuple[Path, str]) -> None:
    path, _ = repo
    (path / "new.txt").write_text("n\n")
    summary = summarize_changes(str(path), "0" * 40, None)
    assert summary is not None
    assert summary.files_changed == 1
    assert (summary.insertions, summary.deletions, summary.commits) == (None, None, None)


def test_a_non_hex_base_is_never_given_to_git(repo: tuple[Path, str]) -> None:
    path, _ = repo
    summary = summarize_changes(str(path), "--output=/tmp/x", None)
    assert summary is not None and summary.commits is None


def test_non_git_and_missing_directories_degrade_to_none(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    assert run_git(["rev-parse", "--git-dir"], cwd=plain).returncode != 0, "precondition: tmp_path is not in a repo"
    assert summarize_changes(str(plain), None, None) is None
    assert summarize_changes(str(tmp_path / "missing"), "a" * 40, 2) is None
    with pytest.raises(GitFailed, match="git status failed"):
        count_dirty(str(plain))
    with pytest.raises(GitFailed):
        count_dirty(str(tmp_path / "missing"))


def test_user_git_config_and_git_variables_are_ignored(repo: tuple[Path, str], tmp_path: Path) -> None:
    path, _ = repo
    hostile = tmp_path / "gitconfig"
    hostile.write_text("[status]\n\tshowUntrackedFiles = no\n")
    os.environ["GIT_CONFIG_GLOBAL"] = str(hostile)
    os.environ["GIT_DIR"] = str(tmp_path / "elsewhere")
    try:
        (path / "untracked.txt").write_text("u\n")
        summary = summarize_changes(str(path), None, None)
    finally:
        del os.environ["GIT_CONFIG_GLOBAL"], os.environ["GIT_DIR"]
    assert summary is not None and summary.files == ["untracked.txt"]


def test_run_git_reports_failures_instead_of_raising(tmp_path: Path) -> None:
    missing = run_git(["status"], cwd=tmp_path / "nope", timeout=5)
    assert missing.returncode == NOT_RUN and b"could not run git" in missing.stderr
    (tmp_path / "hook").mkdir()
    slow = run_git(["-c", "alias.nap=!sleep 5", "nap"], cwd=tmp_path / "hook", timeout=0.3)
    assert slow.returncode == TIMED_OUT and b"timed out" in slow.stderr


def test_porcelain_paths_parses_renames_and_odd_names() -> None:
    output = b" M a b.txt\0R  new.txt\0old.txt\0?? caf\xc3\xa9\n.txt\0A  x\0"
    assert porcelain_paths(output) == ["a b.txt", "new.txt", "café\n.txt", "x"]
    assert porcelain_paths(b"") == []


def _snapshot(path: Path) -> tuple[bytes, bytes, set[str]]:
    """The worktree's index bytes, `git status` output and every file under its git dir."""
    git_dir = Path(git(path, "rev-parse", "--absolute-git-dir").strip())
    common = Path(git(path, "rev-parse", "--path-format=absolute", "--git-common-dir").strip())
    status = subprocess.run(["git", "status", "--porcelain=v2", "-z", "--untracked-files=all"], cwd=path,
                            capture_output=True, check=True).stdout  # fmt: skip
    files = {str(p) for p in common.rglob("*")}
    return (git_dir / "index").read_bytes(), status, files


def test_new_files_count_with_their_lines_and_nothing_is_touched(repo: tuple[Path, str], tmp_path: Path) -> None:
    """docs/runs.md#summaries: untracked, non-ignored new files are counted, binary ones without lines, via a temporary
    index."""
    clone, _ = repo
    (clone / ".gitignore").write_text("*.log\n")
    git(clone, "add", ".gitignore")
    git(clone, "commit", "-q", "-m", "ignore logs")
    base = git(clone, "rev-parse", "HEAD").strip()
    path = tmp_path / "linked"  # a linked worktree, as wb makes: its index is under the clone's git dir
    git(clone, "worktree", "add", "-q", "-b", "wb/x", str(path), base)
    (path / "hello.txt").write_text("hello\n")
    (path / "pkg").mkdir()
    (path / "pkg" / "a.py").write_text("a = 1\nb = 2\n")
    (path / "pkg" / "*[x].txt").write_text("glob\n")  # a pathspec-looking name is taken literally
    (path / "blob.bin").write_bytes(b"\0\1\2" * 100)
    (path / "debug.log").write_text("ignored\nlines\n")
    (path / "README.md").write_text("one\ntwo\n")  # 1 deletion
    (path / "gone.txt").unlink()  # 1 deletion
    before = _snapshot(path)
    summary = summarize_changes(str(path), base, None)
    assert summary is not None
    assert summary.new_files == 4  # hello.txt, pkg/a.py, pkg/*[x].txt, blob.bin; not the ignored debug.log
    assert (summary.insertions, summary.deletions) == (1 + 2 + 1, 2)  # the binary file adds no lines
    assert summary.files_changed == 5  # README.md, gone.txt, blob.bin, hello.txt, pkg/ (one status entry)
    assert _snapshot(path) == before  # index, status and git dir byte for byte: no lock, no blob, no temp file


def _logging_git(tmp_path: Path) -> tuple[str, Path]:
    """A PATH whose first `git` logs each subcommand and runs the real one, and its log."""
    real, log, bin_dir = shutil.which("git"), tmp_path / "git.log", tmp_path / "bin"
    assert real
    bin_dir.mkdir()
    (bin_dir / "git").write_text(f'#!/bin/sh\necho "$1" >> {log}\nexec {real} "$@"\n')
    (bin_dir / "git").chmod(0o755)
    return f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}", log


def test_a_worktree_that_changed_nothing_is_summarized_with_one_git_command(
    repo: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, base = repo
    path_with_logging_git, log = _logging_git(tmp_path)
    monkeypatch.setenv("PATH", path_with_logging_git)
    assert summarize_changes(str(path), base, None) == ChangeSummary(
        files_changed=0, insertions=0, deletions=0, new_files=0, commits=0
    )
    assert log.read_text().split() == ["status"]  # HEAD is read from git's files (courier/runs/git_head.py)
    branch = git(path, "symbolic-ref", "HEAD").strip()
    git(path, "symbolic-ref", "refs/heads/alias", branch)
    git(path, "symbolic-ref", "HEAD", "refs/heads/alias")  # not read from files: git is asked
    log.write_text("")
    summarize_changes(str(path), base, None)
    assert log.read_text().split() == ["status", "rev-parse"]


def test_a_clean_worktree_whose_head_moved_still_counts_its_commits_and_lines(repo: tuple[Path, str]) -> None:
    path, base = repo
    (path / "README.md").write_text("one\n")
    git(path, "commit", "-q", "-am", "shorter")  # clean again, but one commit past the base
    assert summarize_changes(str(path), base, None) == ChangeSummary(
        files_changed=0, insertions=0, deletions=2, new_files=0, commits=1
    )
    git(path, "reset", "-q", "--hard", base)
    git(path, "checkout", "-q", "--detach")
    (path / "README.md").write_text("one\n")
    git(path, "commit", "-q", "-am", "again")
    git(path, "reset", "-q", "--hard", "HEAD~1")  # back at the base: nothing to count
    assert summarize_changes(str(path), base, None) == ChangeSummary(
        files_changed=0, insertions=0, deletions=0, new_files=0, commits=0
    )


def test_a_run_that_added_or_edited_files_is_summarized_with_few_git_commands(
    repo: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the index and objects are, HEAD, and the new files (when status lists each) are not asked of git."""
    clone, base = repo
    path = tmp_path / "linked"
    git(clone, "worktree", "add", "-q", "-b", "wb/y", str(path), base)
    path_with_logging_git, log = _logging_git(tmp_path)
    monkeypatch.setenv("PATH", path_with_logging_git)
    (path / "README.md").write_text("one\ntwo\n")
    assert summarize_changes(str(path), base, None) == ChangeSummary(
        files_changed=1, files=["README.md"], insertions=0, deletions=1, new_files=0, commits=0
    )
    assert log.read_text().split() == ["status", "diff"]
    log.write_text("")
    (path / "hello.txt").write_text("hello\n")
    assert summarize_changes(str(path), base, None) == ChangeSummary(
        files_changed=2, files=["README.md", "hello.txt"], insertions=1, deletions=1, new_files=1, commits=0
    )
    assert log.read_text().split() == ["status", "add", "diff"]
    log.write_text("")
    (path / "pkg").mkdir()
    (path / "pkg" / "a.py").write_text("a = 1\n")  # a new directory is one status entry: git lists its files
    summary = summarize_changes(str(path), base, None)
    assert summary is not None and (summary.new_files, summary.insertions, summary.files_changed) == (2, 2, 3)
    assert log.read_text().split() == ["status", "ls-files", "add", "diff"]


def test_the_repositorys_untracked_files_setting_changes_nothing(repo: tuple[Path, str]) -> None:
    """docs/runs.md#summaries: git's default untracked mode, whatever `status.showUntrackedFiles` says."""
    path, base = repo
    (path / "hello.txt").write_text("hello\n")
    (path / "pkg").mkdir()
    (path / "pkg" / "a.py").write_text("a = 1\n")
    expected = ChangeSummary(
        files_changed=2, files=["hello.txt", "pkg/"], insertions=2, deletions=0, new_files=2, commits=0
    )
    for mode in ("no", "all", "normal"):
        git(path, "config", "status.showUntrackedFiles", mode)
        assert summarize_changes(str(path), base, None) == expected, mode
        assert count_dirty(str(path)) == 2, mode


def test_a_renamed_files_old_name_is_never_read_as_a_new_file(repo: tuple[Path, str]) -> None:
    """A staged rename is two status tokens; the source, here one that looks like an untracked entry, is skipped."""
    path, base = repo
    (path / "?? old.txt").write_text("kept\n")
    git(path, "add", ".")
    git(path, "commit", "-q", "-m", "odd name")
    base = git(path, "rev-parse", "HEAD").strip()
    git(path, "mv", "?? old.txt", "renamed.txt")
    summary = summarize_changes(str(path), base, None)
    assert summary is not None
    assert (summary.files_changed, summary.new_files) == (1, 0)
    assert summary.files == ["renamed.txt"]
    assert (summary.insertions, summary.deletions) == (0, 0)  # git diff reads it as a rename
