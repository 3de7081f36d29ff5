"""Which run holds a worktree (docs/runs.md#dispatch): one small file per worktree, naming the last
run admitted into it, so a dispatch reads one record instead of every record in the store.

Every admission into a worktree writes its file under that worktree's lock, before the record
exists, so the live run of a worktree is always the one its file names; a name whose record is
gone, terminal, or of another worktree holds nothing. The file is not synced to disk: after a
crash no run is live, whatever it says. A home made by a wb that kept no such files gets them
once, from a scan of its records, before the first admission that reads one.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
from pathlib import Path

from courier.errors import NotStartable, WbError
from courier.runs import process
from courier.runs.admission_locks import worktree_lock
from courier.runs.store import Record, Store, within_admission_grace
from protocol.refs import is_run_id

HOLDERS = "holders"


def is_live(record: Record) -> bool:
    """Stored running, with an owner, worker or admission grace: the run still holds its worktree and a slot."""
    return record.state == "running" and (
        process.same_process(record.owner_pid, record.owner_token)
        or process.same_process(record.worker_pid, record.worker_token)
        or within_admission_grace(record)
    )


def holder(store: Store, repository: str, worktree: str) -> str | None:
    """The live run that holds this worktree, or None. Call it under the worktree's lock."""
    try:
        agent_id = _named(_file(_ready(store), repository, worktree))
    except FileNotFoundError:
        return None
    except OSError as exc:  # unreadable: refused, not taken for a free worktree
        raise _refusal(store, exc) from None
    if not is_run_id(agent_id):
        return None
    try:
        record = store.load(agent_id)
    except (WbError, OSError):
        return None  # pruned or unreadable: it holds nothing
    if record.repository == repository and record.worktree == worktree and is_live(record):
        return agent_id
    return None


def hold(store: Store, repository: str, worktree: str, agent_id: str) -> None:
    """Name `agent_id` as the worktree's run, before its record is made (a name without a record holds nothing)."""
    try:
        _write(_file(_ready(store), repository, worktree), agent_id)
    except OSError as exc:
        raise _refusal(store, exc) from None


def release(store: Store, record: Record) -> None:
    """Forget the worktree's file when it names this (pruned) run, so a home's files do not outgrow its records.
    Under the worktree's lock: an admission naming its own run meanwhile keeps its file."""
    path = _file(store.home / HOLDERS, record.repository, record.worktree)
    if not os.path.exists(path):
        return
    with contextlib.suppress(OSError, WbError), worktree_lock(store, record.repository, record.worktree):
        if _named(path) == record.agent_id:
            os.unlink(path)


def _named(path: Path) -> str:
    """The run a holder file names (not following a link, never waiting on a FIFO)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        return os.read(fd, 100).decode("ascii", "replace").strip()
    finally:
        os.close(fd)


def _file(directory: Path, repository: str, worktree: str) -> Path:
    # A digest: any repository and worktree name makes one plain file name, and no two share one.
    return directory / hashlib.sha256(f"{repository}\0{worktree}".encode()).hexdigest()[:40]


def _write(path: Path, agent_id: str) -> None:
    temp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            os.write(fd, agent_id.encode() + b"\n")
        finally:
            os.close(fd)
        os.replace(temp, path)  # whole or not at all: a reader sees the old name or the new one
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def _refusal(store: Store, exc: OSError) -> NotStartable:
    """A full disk or a read-only home: say where, not "internal"."""
    reason = (exc.strerror or str(exc)).lower()
    return NotStartable(f"cannot read or note the worktree's run under {store.home / HOLDERS}: {reason}")


def _ready(store: Store) -> Path:
    try:
        return _directory(store)
    except OSError as exc:
        raise _refusal(store, exc) from None


def _directory(store: Store) -> Path:
    directory = store.home / HOLDERS
    if os.path.isdir(directory):
        return directory
    # The first admission in a home without the files: every live run's worktree gets its file, in a
    # folder put in place whole, so a concurrent admission sees all of them or makes them itself.
    temp = store.home / f".{HOLDERS}.{secrets.token_hex(6)}.tmp"
    os.mkdir(temp, 0o700)
    try:
        records, _ = store.list()
        for record in records:
            if is_live(record):
                _write(_file(temp, record.repository, record.worktree), record.agent_id)
        os.rename(temp, directory)
    except OSError:
        shutil.rmtree(temp, ignore_errors=True)
        if not os.path.isdir(directory):
            raise
    return directory
