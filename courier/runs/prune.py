"""Remove old run records (contract §15.5): records only, never worktrees or branches, never a live run.

A record goes when its run is terminal and finished longer ago than the bound. A stored
`running` run counts only when it renders `abandoned` and its worker is gone too; it then
counts as finished at the last write to its record or events. Removal is concurrent-safe
with a running `list`: the run directory is first renamed, atomically and in the same
directory, to a hidden name no reader takes for a run (`.pruning-…`), then deleted; a
`list` that had already seen the old name skips an entry that vanished under it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from courier.errors import WbError
from courier.runs import process
from courier.runs.store import EVENTS, RECORD, Record, Store, parse_rfc3339, render, rfc3339
from protocol.refs import is_run_id

_PRUNING_PREFIX = ".pruning-"


@dataclass
class Pruned:
    agent_id: str
    state: str
    finished_at: float

    def to_wire(self) -> dict[str, object]:
        return {
            "agent_id": self.agent_id,
            "state": self.state,
            "finished_at": rfc3339(datetime.fromtimestamp(self.finished_at, UTC)),
        }


def _last_write(store: Store, agent_id: str) -> float:
    run_dir = store.run_dir(agent_id)
    moments = []
    for name in (RECORD, EVENTS):
        with contextlib.suppress(OSError):
            moments.append(os.lstat(run_dir / name).st_mtime)
    return max(moments, default=time.time())


def finished_at(store: Store, record: Record) -> float | None:
    """When the run finished, as a Unix time; None while it may still do something."""
    if record.state == "running":
        result = render(record, store)
        if result.state != "abandoned" or process.same_process(record.worker_pid, record.worker_token):
            return None
        return _last_write(store, record.agent_id)
    if record.finished_at:
        with contextlib.suppress(ValueError):
            return parse_rfc3339(record.finished_at).timestamp()
    return _last_write(store, record.agent_id)


def prune(store: Store, older_than_ms: int, *, dry_run: bool) -> list[Pruned]:
    """Remove (or, dry, name) every record old enough; oldest first. Unreadable records are left alone."""
    store.ensure()
    cutoff = time.time() - older_than_ms / 1000
    chosen: list[Pruned] = []
    with os.scandir(store.root) as entries:
        names = [(entry.name, entry.is_symlink()) for entry in entries]
    for name, symlink in names:
        if name.startswith(_PRUNING_PREFIX) and not symlink and not dry_run:
            shutil.rmtree(store.root / name, ignore_errors=True)  # left by a prune that was interrupted
            continue
        if symlink or not is_run_id(name):
            continue
        try:
            record = store.load(name)
        except WbError:
            continue
        moment = finished_at(store, record)
        if moment is None or moment > cutoff:
            continue
        state = render(record, store).state
        if not dry_run and not _remove(store, name):
            continue
        chosen.append(Pruned(agent_id=name, state=state, finished_at=moment))
    chosen.sort(key=lambda pruned: (pruned.finished_at, pruned.agent_id))
    return chosen


def _remove(store: Store, agent_id: str) -> bool:
    hidden = store.root / f"{_PRUNING_PREFIX}{agent_id}-{secrets.token_hex(4)}"
    try:
        os.rename(store.run_dir(agent_id), hidden)
    except OSError:
        return False  # another prune took it first
    shutil.rmtree(hidden, ignore_errors=True)
    return True
