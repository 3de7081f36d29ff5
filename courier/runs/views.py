"""How the handlers that wait on runs look at this machine's store (docs/architecture.md#executor).

`await` and `watch` ask `runs_of(context)`: this machine's store by default, or the view an
executor whose runs live on several nodes put in the context (courier/executor/). The one
receiver-side await loop, `await_run`, polls whichever it is given.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from courier.errors import WbError
from courier.runs.context import Context, Runs, store_for
from courier.runs.store import RECORD, Record, Store, read_record_of, record_dir_problem, render
from protocol import limits
from protocol.models import RemoteResponse, Result
from protocol.refs import is_run_id
from protocol.timestamps import parse_rfc3339


@dataclass
class _Entry:
    signature: tuple[int, int, int]
    record: Record
    started: float


class Scanner:
    """The store as watch sees it, kept between scans: a record is re-read only when its run.json changed."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.lock = threading.Lock()
        self._root_mtime: int | None = None
        self._names: list[str] = []
        self._entries: dict[str, _Entry] = {}

    def _list_names(self) -> list[str]:
        mtime = os.stat(self.store.root).st_mtime_ns
        if mtime != self._root_mtime:
            with os.scandir(self.store.root) as entries:
                self._names = [entry.name for entry in entries if is_run_id(entry.name)]
            self._root_mtime = mtime
        return self._names

    def scan(self) -> dict[str, tuple[Result, float]]:
        """Every readable run: its Result now and its start (Unix time). Unreadable records are left out
        (list names them)."""
        with self.lock:
            out: dict[str, tuple[Result, float]] = {}
            names = self._list_names()
            for name in names:
                entry = self._entries.get(name)
                if entry is None or not entry.record.terminal:
                    entry = self._refresh(name, entry)
                    if entry is None:
                        continue
                out[name] = (render(entry.record, self.store), entry.started)
            for gone in set(self._entries) - set(names):
                del self._entries[gone]
            return out

    def _refresh(self, name: str, entry: _Entry | None) -> _Entry | None:
        run_dir = self.store.run_dir(name)
        try:
            info = os.stat(run_dir / RECORD, follow_symlinks=False)
            signature = (info.st_mtime_ns, info.st_size, info.st_ino)
            if entry is not None and entry.signature == signature:
                return entry
            problem = record_dir_problem(os.lstat(run_dir))
            if problem:
                return None
            record = read_record_of(run_dir, name)
        except (OSError, WbError):
            self._entries.pop(name, None)
            return None
        try:
            started = parse_rfc3339(record.started_at).timestamp()
        except ValueError:
            started = 0.0
        fresh = _Entry(signature, record, started)
        self._entries[name] = fresh
        return fresh


_SCANNERS: dict[str, Scanner] = {}
_SCANNERS_LOCK = threading.Lock()


def scanner_for(store: Store) -> Scanner:
    """One scanner per store and receiver process (a serve session answers many watch calls)."""
    with _SCANNERS_LOCK:
        key = str(store.root)
        if key not in _SCANNERS:
            _SCANNERS[key] = Scanner(store)
        return _SCANNERS[key]


class StoreRuns:
    """This machine's runs, as `await` and `watch` see them."""

    await_poll_s = limits.AWAIT_POLL_S
    watch_poll_s = limits.WATCH_POLL_S

    def __init__(self, store: Store) -> None:
        self.store = store

    def status(self, agent_id: str) -> Result:
        return render(self.store.load(agent_id), self.store)

    def scan(self) -> dict[str, tuple[Result, float]]:
        return scanner_for(self.store).scan()

    def describe(self, response: RemoteResponse) -> None:
        del response  # a machine's own store adds nothing to `version`


def runs_of(context: Context) -> Runs:
    """The runs a handler answers for: the executor's view when it set one, else this machine's store."""
    return context.runs if context.runs is not None else StoreRuns(store_for(context))


def await_run(runs: Runs, agent_id: str, wait_timeout_ms: int, client_gone: Callable[[], bool]) -> Result:
    """Look at the run until it is terminal, the bound passes or the asker is gone (0: no bound)."""
    deadline = time.monotonic() + wait_timeout_ms / limits.MS_PER_SECOND if wait_timeout_ms > 0 else None
    while True:
        result = runs.status(agent_id)
        if result.terminal:
            return result
        now = time.monotonic()
        if (deadline is not None and now >= deadline) or client_gone():
            return result
        pause = runs.await_poll_s if deadline is None else min(runs.await_poll_s, deadline - now)
        time.sleep(max(pause, 0.001))
