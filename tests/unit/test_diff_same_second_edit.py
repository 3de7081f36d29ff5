"""A file edited in the same second as git last wrote the index, to the same size, is still a change."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from courier.runs.changes import summarize_changes
from courier.runs.patch import compute_diff


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, capture_output=True, check=True)


def test_a_same_size_edit_that_stat_cannot_see_is_found_by_git_racy_check(tmp_path: Path) -> None:
    # Git trusts a matching stat only for entries older than the index file; a copy of the index
    # with a fresh mtime would hide this edit (seen as a missing `kept.txt` on a loaded machine).
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "config", "user.email", "t@example.com")
    _git(repo, "config", "user.name", "t")
    _git(repo, "config", "core.trustctime", "false")  # a rewrite in the same second would keep ctime too
    kept = repo / "kept.txt"
    kept.write_text("old kept.txt\n")
    stamp = kept.stat().st_mtime_ns - 10 * 10**9  # ten seconds ago, so a fresh copy of the index is newer
    os.utime(kept, ns=(stamp, stamp))  # older than the index git writes next: not smudged, its stat trusted
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "base")
    kept.write_text("new kept.txt\n")  # the same size
    os.utime(kept, ns=(stamp, stamp))
    os.utime(repo / ".git" / "index", ns=(stamp, stamp))  # git wrote the index in that same instant
    made = compute_diff(str(repo), None)
    assert [change.to_wire()["path"] for change in made.files] == ["kept.txt"]
    assert b"+new kept.txt" in made.patch
    summary = summarize_changes(str(repo), made.base_sha, None)  # its line counts read a copy of the index too
    assert summary is not None and (summary.files, summary.insertions, summary.deletions) == (["kept.txt"], 1, 1)
