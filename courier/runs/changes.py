"""What a run changed in its worktree (docs/runs.md#summaries), from git, never raising.

- files: `git status --porcelain -z --untracked-files=normal` entries (git's default untracked
  mode, whatever the repository's `status.showUntrackedFiles`: a new directory whose files are
  all untracked is one entry `dir/`); at most 50 listed, `files_truncated` when there are more.
- new_files: the untracked, non-ignored files (`git ls-files --others --exclude-standard`), read
  from status's own `??` entries when none of them is a directory.
- insertions/deletions: `git diff --shortstat <base>`, i.e. the working tree against the
  base commit, new files included: they are marked intent-to-add in a temporary copy of the
  worktree's index (GIT_INDEX_FILE), so their lines count as added (a binary file adds none)
  while the worktree and its own index are never touched.
- commits: `git rev-list --count <base>..HEAD`; none when HEAD is still the base commit.

A worktree with no status entries whose HEAD is still the base commit changed nothing: its
counts are all zero without asking git for them. Where the index and the object database are,
and HEAD, come from git's files when they have the common layout (courier/runs/git_head.py):
a run that only added files ends with three git processes (status, add, diff), not six.

Without a base SHA, the line counts are against HEAD and `commits` is omitted. A git
failure omits the fields it would have filled; when even `git status` fails (not a git
worktree, git missing, timeout) there is no summary at all (None).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile

from courier.errors import GitFailed
from courier.runs.git import SUMMARY_TIMEOUT_S, copy_index, run_git, stderr_line
from courier.runs.git_head import head_commit, index_and_objects
from protocol import limits
from protocol.models import ChangeSummary

_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_INSERTIONS = re.compile(rb"(\d+) insertions?\(\+\)")
_DELETIONS = re.compile(rb"(\d+) deletions?\(-\)")


def _entries(output: bytes) -> list[tuple[bytes, bytes]]:
    """The (status, path) entries of `git status --porcelain -z` output, in git's order.

    A rename or copy entry (`R`/`C`) is followed by its source path, which is skipped: the
    entry is named by its new path, and a source is never read as an entry of its own.
    """
    tokens = output.split(b"\0")
    entries: list[tuple[bytes, bytes]] = []
    index = 0
    while index < len(tokens):
        token = tokens[index]
        index += 1
        if len(token) < 4:  # "XY path" at least; the empty token after the last NUL ends it
            continue
        status = token[:2]
        entries.append((status, token[3:]))
        if b"R" in status or b"C" in status:
            index += 1
    return entries


def porcelain_paths(output: bytes) -> list[str]:
    """The paths of `git status --porcelain -z` output, one per entry, decoded as UTF-8 with replacement."""
    return [path.decode("utf-8", "replace") for _, path in _entries(output)]


_STATUS = ["status", "--porcelain", "-z", "--untracked-files=normal"]


def _untracked(output: bytes) -> list[bytes] | None:
    """The untracked files of `git status --porcelain -z` output; None when one entry is a directory
    (its files are not listed, so ask `git ls-files --others`)."""
    found = [path for status, path in _entries(output) if status == b"??"]
    return None if any(path.endswith(b"/") for path in found) else found


def _status(worktree_dir: str) -> tuple[list[str], list[bytes] | None] | None:
    """Status's paths and, when status tells them all, the untracked files; None when git fails."""
    done = run_git(_STATUS, cwd=worktree_dir, timeout=SUMMARY_TIMEOUT_S)
    if done.returncode != 0:
        return None
    return porcelain_paths(done.stdout), _untracked(done.stdout)


def count_dirty(worktree_dir: str) -> int:
    """How many `git status --porcelain` entries the worktree has (files already dirty at dispatch).

    Raises GitFailed, naming git's complaint, when git cannot answer.
    """
    done = run_git(_STATUS, cwd=worktree_dir, timeout=SUMMARY_TIMEOUT_S)
    if done.returncode != 0:
        raise GitFailed(f"git status failed in {worktree_dir}: {stderr_line(done)}")
    return len(porcelain_paths(done.stdout))


def _new_files(worktree_dir: str) -> list[bytes] | None:
    done = run_git(["ls-files", "-z", "--others", "--exclude-standard"], cwd=worktree_dir, timeout=SUMMARY_TIMEOUT_S)
    if done.returncode != 0:
        return None
    return [path for path in done.stdout.split(b"\0") if path]


def _shortstat(worktree_dir: str, base: str, new_files: list[bytes]) -> tuple[int, int] | None:
    """Lines added and deleted against `base`, new files included, from a throwaway index.

    The copy of the index and any object git writes for it (the empty blob of an
    intent-to-add entry) live in a scratch directory, so the repository is not written at all.
    """
    located = _index_and_objects(worktree_dir)
    if located is None:
        return None
    index, objects = located
    try:
        scratch = tempfile.mkdtemp(prefix="wb-changes-")
    except OSError:  # no room for the scratch index: only the line counts degrade
        return None
    try:
        temp_index = os.path.join(scratch, "index")
        os.mkdir(os.path.join(scratch, "objects"))  # git refuses an object directory that does not exist
        if os.path.isfile(index):
            copy_index(index, temp_index)
        env = {
            "GIT_INDEX_FILE": temp_index,
            "GIT_OBJECT_DIRECTORY": os.path.join(scratch, "objects"),
            "GIT_ALTERNATE_OBJECT_DIRECTORIES": _quoted(objects),
            "GIT_LITERAL_PATHSPECS": "1",
        }
        if new_files:
            pathspecs = os.path.join(scratch, "new-files")
            with open(pathspecs, "wb") as handle:
                handle.write(b"\0".join(new_files) + b"\0")
            args = ["add", "--intent-to-add", f"--pathspec-from-file={pathspecs}", "--pathspec-file-nul"]
            if run_git(args, cwd=worktree_dir, timeout=SUMMARY_TIMEOUT_S, env=env).returncode != 0:
                return None
        done = run_git(["diff", "--shortstat", base, "--"], cwd=worktree_dir, timeout=SUMMARY_TIMEOUT_S, env=env)
    except OSError:
        return None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if done.returncode != 0:
        return None
    insertions = _INSERTIONS.search(done.stdout)
    deletions = _DELETIONS.search(done.stdout)
    return (int(insertions.group(1)) if insertions else 0, int(deletions.group(1)) if deletions else 0)


def _index_and_objects(worktree_dir: str) -> tuple[str, str] | None:
    """Where the worktree's index and its repository's objects are: from git's files, else from git."""
    read = index_and_objects(worktree_dir)
    if read is not None:
        return read
    args = ["rev-parse", "--git-path", "index", "--git-path", "objects"]
    done = run_git(args, cwd=worktree_dir, timeout=SUMMARY_TIMEOUT_S)
    paths = done.stdout.decode("utf-8", "surrogateescape").splitlines()
    if done.returncode != 0 or len(paths) != 2:
        return None
    index, objects = (os.path.join(worktree_dir, path) for path in paths)  # relative to the worktree, or absolute
    return index, objects


def _quoted(path: str) -> str:
    """One entry of GIT_ALTERNATE_OBJECT_DIRECTORIES, C-quoted as git reads it (a path may hold ':')."""
    return '"' + path.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _head(worktree_dir: str) -> str | None:
    read = head_commit(worktree_dir)  # without a git process when git's files are the common layout
    if read is not None:
        return read
    done = run_git(["rev-parse", "--verify", "--quiet", "HEAD"], cwd=worktree_dir, timeout=SUMMARY_TIMEOUT_S)
    return done.stdout.decode("ascii", "replace").strip() if done.returncode == 0 else None


def _commits(worktree_dir: str, base: str) -> int | None:
    if head_commit(worktree_dir) == base:
        return 0  # HEAD is still the base: nothing committed
    done = run_git(["rev-list", "--count", f"{base}..HEAD", "--"], cwd=worktree_dir, timeout=SUMMARY_TIMEOUT_S)
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
        status = _status(worktree_dir)
        if status is None:
            return None
        paths, untracked = status
        base = base_sha if base_sha is not None and _SHA.fullmatch(base_sha) else None
        new_files: list[bytes] | None
        stat: tuple[int, int] | None
        if not paths and (base is None or _head(worktree_dir) == base):
            # Nothing changed, nothing committed (a read-only task's usual end): every count is
            # zero, known from one git command (and HEAD's files) instead of five.
            new_files, stat, commits = [], (0, 0), (0 if base is not None else None)
        else:
            new_files = untracked if untracked is not None else _new_files(worktree_dir)
            stat = _shortstat(worktree_dir, base or "HEAD", new_files) if new_files is not None else None
            commits = _commits(worktree_dir, base) if base is not None else None
    except Exception:  # a summary degrades; it never fails the run
        return None
    truncated = len(paths) > limits.CHANGED_FILES_MAX
    return ChangeSummary(
        files_changed=len(paths),
        files=paths[: limits.CHANGED_FILES_MAX] or None,
        insertions=stat[0] if stat else None,
        deletions=stat[1] if stat else None,
        new_files=len(new_files) if new_files is not None else None,
        commits=commits,
        files_truncated=True if truncated else None,
        preexisting_changes=preexisting,
    )
