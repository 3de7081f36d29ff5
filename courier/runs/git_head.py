"""HEAD's commit, and where a worktree's index and objects are, read from git's own files, without
starting git (docs/runs.md#dispatch).

A run asks for HEAD twice, at dispatch (its base) and at its end (whether it committed), and
every git process is a fork and exec on the dispatch path and in a burst of dispatches, where
the one under the clone's lock can hold up the others (docs/benchmarks.md#dispatch-latency). The
common layout is read here: `.git` a directory or a `gitdir:` file, HEAD detached (an object
ID) or naming a branch (`refs/heads/…`), the branch a loose file or a `packed-refs` line. For
anything else (a reftable repository, a ref outside `refs/heads/`, an unborn branch, a name
that is not plain, an unreadable file) the answer is None and the caller asks git, so the
answer is always git's. Git writes each of these files whole (a lock file renamed over it), so
a read never sees half of one.
"""

from __future__ import annotations

import os
import re

from protocol import limits

_OBJECT_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_PLAIN_NAME = re.compile(r"refs/heads/[A-Za-z0-9._/-]+")
_MAX_FILE = limits.GIT_REF_FILE_MAX_BYTES
_MAX_PACKED = limits.GIT_PACKED_REFS_MAX_BYTES


def head_commit(path: str | os.PathLike[str]) -> str | None:
    """The object ID HEAD resolves to in the worktree or repository at `path`; None: ask git."""
    try:
        git_dir = _git_dir(os.fspath(path))
        if git_dir is None:
            return None
        common = _common_dir(git_dir)
        if os.path.exists(os.path.join(common, "reftable")):
            return None
        head = _read(os.path.join(git_dir, "HEAD"))
    except (OSError, UnicodeDecodeError):
        return None
    if head is None:
        return None
    if _OBJECT_ID.fullmatch(head):
        return head
    if not head.startswith("ref: "):
        return None
    return _branch(common, head[len("ref: ") :])


def index_and_objects(path: str | os.PathLike[str]) -> tuple[str, str] | None:
    """`git rev-parse --git-path index --git-path objects` in the worktree at `path`; None: ask git.

    The index is the worktree's own git dir's, the objects the common dir's (git never reads the
    GIT_* variables that would move them: courier/runs/git.py `git_environment` drops them).
    """
    try:
        git_dir = _git_dir(os.fspath(path))
        if git_dir is None or not os.path.isdir(git_dir):
            return None
        common = _common_dir(git_dir)
    except (OSError, UnicodeDecodeError):
        return None
    return os.path.join(git_dir, "index"), os.path.join(common, "objects")


def _git_dir(path: str) -> str | None:
    dot_git = os.path.join(path, ".git")
    if os.path.isdir(dot_git):
        return dot_git
    text = _read(dot_git)
    if text is None or not text.startswith("gitdir: "):
        return None
    return os.path.join(path, text[len("gitdir: ") :])  # an absolute gitdir replaces `path`


def _common_dir(git_dir: str) -> str:
    try:
        common = _read(os.path.join(git_dir, "commondir"))
    except FileNotFoundError:
        return git_dir  # the main worktree: its git dir is the common one
    return os.path.join(git_dir, common) if common else git_dir


def _branch(common: str, name: str) -> str | None:
    """A branch's object ID: its loose file, else its packed-refs line; None when neither (or not plain)."""
    if not _PLAIN_NAME.fullmatch(name) or any(part in ("", ".", "..") for part in name.split("/")):
        return None  # a name git would read differently, or one that could leave the refs directory
    try:
        loose = _read(os.path.join(common, name))
    except FileNotFoundError:
        loose = None
    except (OSError, UnicodeDecodeError):  # a directory of that name, an unreadable file: git's to say
        return None
    if loose is not None:
        return loose if _OBJECT_ID.fullmatch(loose) else None  # a symbolic ref chain: git's to follow
    return _packed(common, name)


def _packed(common: str, name: str) -> str | None:
    try:
        with open(os.path.join(common, "packed-refs"), "rb") as handle:
            data = handle.read(_MAX_PACKED + 1)
    except OSError:  # none (every ref is loose), or unreadable: the branch is unborn, or git's to say
        return None
    if len(data) > _MAX_PACKED:
        return None
    wanted = name.encode()
    for line in data.splitlines():
        object_id, _, ref = line.partition(b" ")
        if ref == wanted:  # (a "# pack-refs" header or a "^" peeled line never is)
            text = object_id.decode("ascii", "replace")
            return text if _OBJECT_ID.fullmatch(text) else None
    return None


def _read(path: str) -> str | None:
    """A small file's text without its line end; FileNotFoundError when absent; None when too large."""
    with open(path, "rb") as handle:
        data = handle.read(_MAX_FILE + 1)
    if len(data) > _MAX_FILE:
        return None
    return data.decode("utf-8").rstrip("\n")
