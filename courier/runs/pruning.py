"""Remove old run records (docs/cli.md, wb agent prune): never a live run; worktrees only when asked.

A record goes when its run is terminal and finished longer ago than the bound. A stored
`running` run counts only when it renders `abandoned` and its worker is gone too; it then
counts as finished at the last write to its record or events. Removal is concurrent-safe
with a running `list`: the run directory is first renamed, atomically and in the same
directory, to a hidden name no reader takes for a run (`.pruning-…`), then deleted; a
`list` that had already seen the old name skips an entry that vanished under it.

With `worktrees`, the worktree of each removed record goes too, with its branch when that
is `wb/<name>` (see courier/runs/worktrees.py), unless a record that stays (a live run's, a
newer run's) names the same worktree.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from courier.errors import WbError
from courier.runs import holders, process, worktrees
from courier.runs.store import EVENTS, RECORD, Record, Store, parse_rfc3339, render, rfc3339
from protocol import limits
from protocol.models import PrunedWorktree
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


@dataclass
class Pruning:
    """What one prune did (or, dry, would do)."""

    removed: list[Pruned] = field(default_factory=list)
    kept_live: int = 0  # records kept because their run may still do something
    worktrees: list[PrunedWorktree] = field(default_factory=list)


def prune(store: Store, older_than_ms: int, *, dry_run: bool, projects_root: Path | None = None) -> Pruning:
    """Remove (or, dry, name) every record old enough, oldest first; unreadable records are left alone.

    With `projects_root`, also the wb worktrees (and `wb/<name>` branches) of the removed
    records under it that no kept record uses.
    """
    store.ensure()
    cutoff = time.time() - older_than_ms / limits.MS_PER_SECOND
    outcome = Pruning()
    chosen: list[tuple[Pruned, Record]] = []
    kept_dirs: set[str] = set()
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
            outcome.kept_live += moment is None
            if record.worktree_dir:
                kept_dirs.add(record.worktree_dir)
            continue
        state = render(record, store).state
        if not dry_run:
            if not _remove(store, name):
                continue
            holders.release(store, record)
        chosen.append((Pruned(agent_id=name, state=state, finished_at=moment), record))
    chosen.sort(key=lambda pair: (pair[0].finished_at, pair[0].agent_id))
    outcome.removed = [pruned for pruned, _ in chosen]
    if projects_root is not None:
        outcome.worktrees = _prune_worktrees(projects_root, [record for _, record in chosen], kept_dirs, dry_run)
    return outcome


def _prune_worktrees(
    projects_root: Path, records: list[Record], kept_dirs: set[str], dry_run: bool
) -> list[PrunedWorktree]:
    """The removed records' worktrees that are wb's own (the layout's path, registered in the
    clone) and that no kept record names; each once, however many records shared it."""
    done: list[PrunedWorktree] = []
    seen: set[str] = set()
    for record in records:
        directory = record.worktree_dir
        if not directory or directory in seen or directory in kept_dirs:
            continue
        seen.add(directory)
        path = worktrees.worktree_path(projects_root, record.repository, record.worktree)
        clone = worktrees.clone_path(projects_root, record.repository)
        if Path(directory) != path or not (clone / ".git").exists():
            continue  # not where wb makes worktrees: never wb's to remove
        branches = worktrees.worktree_branches(clone)
        if path.resolve() not in branches:
            continue  # already gone (removed by hand, or by an earlier prune)
        branch = branches[path.resolve()]
        branch = branch if branch == worktrees.default_branch(record.worktree) else None
        error = None if dry_run else worktrees.remove_for_prune(clone, path, branch)
        done.append(PrunedWorktree(path=str(path), branch=branch, error=error))
    return done


def _remove(store: Store, agent_id: str) -> bool:
    hidden = store.root / f"{_PRUNING_PREFIX}{agent_id}-{secrets.token_hex(4)}"
    try:
        os.rename(store.run_dir(agent_id), hidden)
    except OSError:
        return False  # another prune took it first
    shutil.rmtree(hidden, ignore_errors=True)
    return True
