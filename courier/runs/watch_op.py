"""The `watch` operation's receiver (docs/protocol.md, watch): one long-poll answers every run of this machine.

The request carries the cursor of the previous reply ("" the first time) and a wait bound.
The receiver answers at once on the first call, else as soon as any run's phase (queued,
running, stalled, waiting, finished) differs from what the cursor saw, or when the bound
passes: `results` holds every run that is not terminal and every run that ended since the
cursor (also one dispatched and ended in between), and `watch_cursor` the new cursor.

It looks at the runs through `runs_of(context)` (courier/runs/views.py): this machine's store,
whose scan costs little (the store directory's mtime, one stat of each live run's run.json,
re-read only when it changed, and the live runs' rendering) every WATCH_POLL_S, a terminal
record read once per receiver process; or a cluster executor's merged view of its nodes.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from dataclasses import dataclass, field

from courier.errors import UsageError
from courier.runs.context import Context, Runs
from courier.runs.views import runs_of
from protocol import limits
from protocol.models import RemoteRequest, RemoteResponse, Result

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


def answer(runs: Runs, cursor: Cursor | None, scanned_at: float) -> tuple[list[Result], Cursor, bool]:
    """(results, the new cursor, whether anything changed since `cursor`) for one scan."""
    view = runs.scan()
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
    runs = runs_of(context)
    deadline = time.monotonic() + wait_ms / limits.MS_PER_SECOND
    while True:
        results, fresh, changed = answer(runs, cursor, time.time())
        now = time.monotonic()
        if changed or now >= deadline or context.client_gone():
            break
        time.sleep(max(0.001, min(runs.watch_poll_s, deadline - now)))
    response.set_results(results)
    response.watch_cursor = fresh.encode()

