"""A run's change against its base commit (docs/cli.md, wb agent diff), made without touching the worktree.

One `git diff --binary <base>` of the working tree, with every untracked, non-ignored file
first marked intent-to-add in a *copy* of the worktree's index (GIT_INDEX_FILE), so new
files, deleted files and binary files are all in one patch that `git apply` accepts, while
the worktree, its index and `git status` stay byte for byte what they were. Intent-to-add
stores no file content (at most git's well-known empty blob), so the object store gains nothing. The same git
call also yields the per-file status and line counts (`--raw --numstat -z`), so a diff is
three git processes: rev-parse, add, diff.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field

from courier.errors import Finding
from courier.runs.git import PATCH_TIMEOUT_S, copy_index, run_git, stderr_line

_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
# The patch's shape must not depend on the repository's own diff settings.
_DIFF_CONFIG = (
    "-c", "diff.noprefix=false", "-c", "diff.mnemonicPrefix=false", "-c", "diff.relative=false",
    "-c", "core.quotePath=true", "-c", "diff.suppressBlankEmpty=false",
)  # fmt: skip
_DIFF_FLAGS = (
    "diff", "--binary", "--no-renames", "--no-ext-diff", "--no-textconv", "--no-color", "--full-index",
    "--src-prefix=a/", "--dst-prefix=b/", "--ignore-submodules=none", "--raw", "--numstat", "-z", "-p",
)  # fmt: skip
STATUS_WORDS = {"A": "added", "M": "modified", "D": "deleted", "T": "type_changed", "U": "unmerged"}


class DiffFailed(Finding):
    """The worktree is gone or git could not compute its diff (exit 1)."""


@dataclass
class FileChange:
    path: str
    status: str
    insertions: int
    deletions: int
    binary: bool

    def to_wire(self) -> dict[str, object]:
        return {
            "path": self.path,
            "status": self.status,
            "insertions": self.insertions,
            "deletions": self.deletions,
            "binary": self.binary,
        }


@dataclass
class Diff:
    base_sha: str
    head_sha: str
    files: list[FileChange] = field(default_factory=list)
    patch: bytes = b""

    @property
    def insertions(self) -> int:
        return sum(change.insertions for change in self.files)

    @property
    def deletions(self) -> int:
        return sum(change.deletions for change in self.files)


def _path(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def parse_diff_output(output: bytes) -> tuple[list[FileChange], bytes]:
    """(files, patch) from `git diff --raw --numstat -z -p` output.

    Layout: one raw record per file (`:<modes> <shas> <letter>\\0<path>\\0`), then one
    numstat record per file in the same order (`<ins>\\t<del>\\t<path>\\0`, `-` for binary),
    then a NUL, then the patch. With `--no-renames` every record has exactly one path.
    """
    position = 0
    statuses: list[tuple[str, str]] = []
    while output.startswith(b":", position):
        meta_end = output.index(b"\0", position)
        path_end = output.index(b"\0", meta_end + 1)
        letter = output[meta_end - 1 : meta_end].decode("ascii", "replace")
        statuses.append((STATUS_WORDS.get(letter, letter), _path(output[meta_end + 1 : path_end])))
        position = path_end + 1
    files: list[FileChange] = []
    for status, path in statuses:
        record_end = output.index(b"\0", position)
        added, deleted, _ = output[position:record_end].split(b"\t", 2)
        binary = added == b"-"
        files.append(
            FileChange(
                path=path,
                status=status,
                insertions=0 if binary else int(added),
                deletions=0 if binary else int(deleted),
                binary=binary,
            )
        )
        position = record_end + 1
    if files and output.startswith(b"\0", position):
        position += 1
    return files, output[position:]


def compute_diff(worktree_dir: str, base_sha: str | None, *, with_patch: bool = True) -> Diff:
    """The worktree's change against `base_sha` (HEAD when the run recorded none).

    Raises DiffFailed naming the worktree when it is gone or git fails there.
    """
    if not os.path.isdir(worktree_dir):
        raise DiffFailed(f"the run's worktree {worktree_dir} is gone; there is no change to show")
    located = run_git(
        ["rev-parse", "--git-path", "index", "--verify", "HEAD"], cwd=worktree_dir, timeout=PATCH_TIMEOUT_S
    )
    lines = located.stdout.decode("utf-8", "surrogateescape").splitlines()
    if located.returncode != 0 or len(lines) != 2:
        raise DiffFailed(f"git cannot read the worktree {worktree_dir}: {stderr_line(located)}")
    index_path = os.path.join(worktree_dir, lines[0])
    head_sha = lines[1].strip()
    base = base_sha if base_sha and _SHA.fullmatch(base_sha) else head_sha
    scratch = tempfile.mkdtemp(prefix="wb-diff-")
    try:
        temp_index = os.path.join(scratch, "index")
        with contextlib.suppress(FileNotFoundError):  # no index yet: git starts an empty one
            copy_index(index_path, temp_index)
        env = {"GIT_INDEX_FILE": temp_index}
        add = ["add", "--all", "--intent-to-add", "--", "."]
        added = run_git(add, cwd=worktree_dir, env=env, timeout=PATCH_TIMEOUT_S)
        if added.returncode != 0:
            raise DiffFailed(f"git cannot list the new files in {worktree_dir}: {stderr_line(added)}")
        flags = list(_DIFF_FLAGS) if with_patch else [flag for flag in _DIFF_FLAGS if flag not in ("-p", "--binary")]
        done = run_git([*_DIFF_CONFIG, *flags, base, "--"], cwd=worktree_dir, env=env, timeout=PATCH_TIMEOUT_S)
        if done.returncode != 0:
            raise DiffFailed(f"git diff failed in {worktree_dir}: {stderr_line(done)}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    try:
        files, patch = parse_diff_output(done.stdout)
    except ValueError as exc:
        raise DiffFailed(f"git diff in {worktree_dir} gave output wb cannot read: {exc}") from None
    return Diff(base_sha=base, head_sha=head_sha, files=files, patch=patch if with_patch else b"")
