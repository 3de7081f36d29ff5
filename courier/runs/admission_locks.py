"""The locks of admission, in the home's `locks/` (docs/runs.md#dispatch): a worktree's, a clone's, the
machine's slots'. Taken in that order, never the other way round."""

from __future__ import annotations

import contextlib
import fcntl
import os
import zlib
from collections.abc import Iterator

from courier.errors import NotStartable
from courier.runs.store import Store

# Buckets of the worktree locks: few files in the home, whatever the names used; two names that share one
# only wait on each other's admission.
WORKTREE_LOCKS = 64


@contextlib.contextmanager
def worktree_lock(store: Store, repository: str, worktree: str) -> Iterator[None]:
    """The lock of one worktree's admission (docs/runs.md#dispatch): the check that no run holds it, its
    creation, and the record that holds it from then on. Dispatches to other worktrees of the clone go on."""
    bucket = zlib.crc32(f"{repository}\0{worktree}".encode()) % WORKTREE_LOCKS
    with home_lock(store, f"worktree-{bucket:02d}.lock"):
        yield


@contextlib.contextmanager
def clone_lock(store: Store, repository: str) -> Iterator[None]:
    """Around `git worktree add` and its undoing only: git does not add worktrees to one clone concurrently
    (docs/runs.md#dispatch). Always taken inside a worktree lock, never around one."""
    with home_lock(store, repository.replace("/", "__") + ".lock"):
        yield


@contextlib.contextmanager
def slots_lock(store: Store) -> Iterator[None]:
    """The machine-wide lock of the `max_running` check (docs/cli.md#placement-across-a-fleet).

    The worktree check's lock is per worktree; two placements of different worktrees must
    still not both take the last slot. Taken inside a worktree lock, around the clone lock.
    """
    with home_lock(store, "slots.lock"):
        yield


@contextlib.contextmanager
def home_lock(store: Store, name: str) -> Iterator[None]:
    lock_dir = store.home / "locks"
    path = lock_dir / name
    try:
        lock_dir.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:  # a full disk or a read-only home: say where, not "internal"
        reason = (exc.strerror or str(exc)).lower()
        raise NotStartable(f"cannot create the lock {path}: {reason}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
