"""The `watch` operation's receiver (docs/protocol.md, watch): one long-poll answers every run of this machine.

The request carries the cursor of the previous reply ("" the first time) and a wait bound.
The receiver answers at once on the first call, else as soon as any run's phase (queued,
running, stalled, waiting, finished) differs from what the cursor saw, or when the bound
passes: `results` holds every run that is not terminal and every run that ended since the
cursor (also one dispatched and ended in between), and `watch_cursor` the new cursor.

Noticing a change costs little: the store directory's mtime (a new or removed run), one stat
of each live run's run.json (re-read only when it changed) and the live runs' rendering (an
lstat of events.jsonl and two process checks), every WATCH_POLL_S. A terminal record is read
once per receiver process: a serve session keeps the scan between calls.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import threading
import time
from dataclasses import dataclass, field

from courier.errors import UsageError, WbError
from courier.runs.context import Context, store_for
from courier.runs.store import RECORD, Record, Store, read_record_of, record_dir_problem, render
from protocol import limits
from protocol.models import RemoteRequest, RemoteResponse, Result
from protocol.refs import is_run_id
from protocol.timestamps import parse_rfc3339

# A run's phase as watch reports it (docs/cli.md, wb agent watch).
FINISHED, WAITING, STALLED, QUEUED, RUNNING = "finished", "waiting", "stalled", "queued", "running"


def phase_of(result: Result) -> str:
    """The phase of a run: finished, waiting (a usage-limit wait), stalled, queued (no worker yet) or running."""
    if result.terminal:
        return FINISHED
    if result.waits and not result.worker_pid:
        return WAITING
    if result.stalled_since:
        return STALLED
    if not result.worker_pid:
        return QUEUED
    return RUNNING


@dataclass
class _Entry:
    signature: tuple[int, int, int]
    record: Record
    started: float


@dataclass
class Cursor:
    """What the previous reply saw: its scan time, the live runs' phases, the recently started terminal runs."""

    scanned_at: float
    live: dict[str, str] = field(default_factory=dict)
    recent: set[str] = field(default_factory=set)

    def encode(self) -> str:
        body = {"t": round(self.scanned_at, 3), "live": self.live, "recent": sorted(self.recent)}
        return base64.urlsafe_b64encode(json.dumps(body, separators=(",", ":")).encode()).decode()

    @classmethod
    def decode(cls, text: str) -> Cursor:
        refused = UsageError("watch_cursor is not one this wb wrote; start again without it")
        try:
            body = json.loads(base64.urlsafe_b64decode(text.encode("ascii")))
        except (ValueError, binascii.Error, UnicodeError):
            raise refused from None
        if not isinstance(body, dict):
            raise refused
        scanned_at, live, recent = body.get("t"), body.get("live"), body.get("recent")
        if not isinstance(scanned_at, (int, float)) or not isinstance(live, dict) or not isinstance(recent, list):
            raise refused
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in live.items()):
            raise refused
        if not all(isinstance(item, str) for item in recent):
            raise refused
        return cls(float(scanned_at), live, set(recent))


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


def answer(scanner: Scanner, cursor: Cursor | None, scanned_at: float) -> tuple[list[Result], Cursor, bool]:
    """(results, the new cursor, whether anything changed since `cursor`) for one scan."""
    view = scanner.scan()
    live = {name: result for name, (result, _) in view.items() if not result.terminal}
    phases = {name: phase_of(result) for name, result in live.items()}
    ended: list[Result] = []
    recent: set[str] = set()
    floor = scanned_at - limits.WATCH_UNSEEN_SLACK_S
    for name, (result, started) in view.items():
        if not result.terminal:
            continue
        if started >= floor:
            recent.add(name)
        if cursor is None:
            continue
        unseen = name not in cursor.recent and started >= cursor.scanned_at - limits.WATCH_UNSEEN_SLACK_S
        if name in cursor.live or unseen:
            ended.append(result)
    changed = cursor is None or bool(ended) or phases != cursor.live
    results = sorted([*live.values(), *ended], key=lambda result: (result.started_at, result.agent_id))
    return results, Cursor(scanned_at, phases, recent), changed


def watch_op(request: RemoteRequest, response: RemoteResponse, context: Context) -> None:
    cursor = Cursor.decode(request.watch_cursor) if request.watch_cursor else None
    wait_ms = min(request.wait_timeout_ms or limits.WATCH_WAIT_DEFAULT_MS, limits.FOLLOW_WAIT_MAX_MS)
    scanner = scanner_for(store_for(context))
    deadline = time.monotonic() + wait_ms / limits.MS_PER_SECOND
    while True:
        results, fresh, changed = answer(scanner, cursor, time.time())
        now = time.monotonic()
        if changed or now >= deadline or context.client_gone():
            break
        time.sleep(max(0.001, min(limits.WATCH_POLL_S, deadline - now)))
    response.set_results(results)
    response.watch_cursor = fresh.encode()

