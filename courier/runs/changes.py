"""What a run changed in its worktree (contract §7.6), from git, never raising.

- files: `git status --porcelain -z` entries (git's default untracked mode: a new directory
  whose files are all untracked is one entry `dir/`); at most 50 listed, `files_truncated`
  when there are more.
- insertions/deletions: `git diff --shortstat <base>`, i.e. the working tree against the
  base commit. Tracked files only: untracked files count in `files_changed` but add no lines.
- commits: `git rev-list --count <base>..HEAD`.

Without a base SHA, the line counts are against HEAD and `commits` is omitted. A git
failure omits the fields it would have filled; when even `git status` fails (not a git
worktree, git missing, timeout) there is no summary at all (None).
"""

from __future__ import annotations

import re

from courier.errors import GitFailed
from courier.runs.git import run_git, stderr_line
from protocol import limits
from protocol.models import ChangeSummary

GIT_TIMEOUT_S = 30.0

_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_INSERTIONS = re.compile(rb"(\d+) insertions?\(\+\)")
_DELETIONS = re.compile(rb"(\d+) deletions?\(-\)")


def porcelain_paths(output: bytes) -> list[str]:
    """The paths of `git status --porcelain -z` output, one per entry, in git's order.

    A rename or copy entry (`R`/`C`) is followed by its source path, which is skipped: the
    entry is named by its new path. Paths are decoded as UTF-8 with replacement.
    """
    tokens = output.split(b"\0")
    paths: list[str] = []
    index = 0
    while index < len(tokens):
        token = tokens[index]
        index += 1
        if len(token) < 4:  # "XY path" at least; the empty token after the last NUL ends it
            continue
        status, path = token[:2], token[3:]
        paths.append(path.decode("utf-8", "replace"))
        if b"R" in status or b"C" in status:
            index += 1
    return paths


def _status(worktree_dir: str) -> list[str] | None:
    done = run_git(["status", "--porcelain", "-z"], cwd=worktree_dir, timeout=GIT_TIMEOUT_S)
    if done.returncode != 0:
        return None
    return porcelain_paths(done.stdout)


def count_dirty(worktree_dir: str) -> int:
    """How many `git status --porcelain` entries the worktree has (files already dirty at dispatch).

    Raises GitFailed, naming git's complaint, when git cannot answer.
    """
    done = run_git(["status", "--porcelain", "-z"], cwd=worktree_dir, timeout=GIT_TIMEOUT_S)
    if done.returncode != 0:
        raise GitFailed(f"git status failed in {worktree_dir}: {stderr_line(done)}")
    return len(porcelain_paths(done.stdout))


def _shortstat(worktree_dir: str, base: str) -> tuple[int, int] | None:
    done = run_git(["diff", "--shortstat", base, "--"], cwd=worktree_dir, timeout=GIT_TIMEOUT_S)
    if done.returncode != 0:
        return None
    insertions = _INSERTIONS.search(done.stdout)
    deletions = _DELETIONS.search(done.stdout)
    return (int(insertions.group(1)) if insertions else 0, int(deletions.group(1)) if deletions else 0)


def _commits(worktree_dir: str, base: str) -> int | None:
    done = run_git(["rev-list", "--count", f"{base}..HEAD", "--"], cwd=worktree_dir, timeout=GIT_TIMEOUT_S)
    text = done.stdout.strip()
    if done.returncode != 0 or not text.isdigit():
        return None
    return int(text)


def summarize_changes(worktree_dir: str, base_sha: str | None, preexisting: int | None) -> ChangeSummary | None:
    """The ChangeSummary of a worktree after a run; None when git cannot even list its status.

    `base_sha` must be a full hexadecimal commit ID (as recorded at dispatch); anything else
    is treated as no base. `preexisting` (files dirty at dispatch) is passed through.
    """
    try:
        paths = _status(worktree_dir)
        if paths is None:
            return None
        base = base_sha if base_sha is not None and _SHA.fullmatch(base_sha) else None
        stat = _shortstat(worktree_dir, base or "HEAD")
        commits = _commits(worktree_dir, base) if base is not None else None
    except Exception:  # a summary degrades; it never fails the run
        return None
    truncated = len(paths) > limits.CHANGED_FILES_MAX
    return ChangeSummary(
        files_changed=len(paths),
        files=paths[: limits.CHANGED_FILES_MAX] or None,
        insertions=stat[0] if stat else None,
        deletions=stat[1] if stat else None,
        commits=commits,
        files_truncated=True if truncated else None,
        preexisting_changes=preexisting,
    )
