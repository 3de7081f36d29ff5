"""The watch operation's cursor and the caller's transitions (docs/protocol.md#watch; docs/cli.md, wb agent watch)."""

from __future__ import annotations

from pathlib import Path

import pytest

from courier.client.watching import Tracker
from courier.executor.perform import perform
from courier.runs.watch_op import Cursor
from protocol import limits
from protocol.models import RemoteRequest, Result


def _result(state: str = "running", worker_pid: int | None = None, **extra: object) -> Result:
    body: dict[str, object] = {
        "agent_id": "agt-" + "0" * 32,
        "state": state,
        "profile": "fake",
        "resolved": {
            "profile": "fake", "harness": "codex", "provider": "mock", "model": "m",
            "routing": {"base_url": "http://127.0.0.1:9/v1", "wire_api": "responses"},
        },
        "repository": "acme/widget",
        "worktree_mode": "new",
        "worktree": "w1",
        "started_at": "2026-12-01T00:00:00Z",
        **extra,
    }  # fmt: skip
    if worker_pid:
        body["worker_pid"] = worker_pid
    return Result.model_validate(body)


def test_a_cursor_survives_its_round_trip() -> None:
    cursor = Cursor(1234.5, {"agt-" + "1" * 32: "running"}, {"agt-" + "2" * 32})
    again = Cursor.decode(cursor.encode())
    assert (again.scanned_at, again.live, again.recent) == (cursor.scanned_at, cursor.live, cursor.recent)


def test_a_cursor_the_receiver_did_not_write_is_a_request_refusal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("WB_CONFIG", str(tmp_path / "none.yaml"))
    request = RemoteRequest(schema_version=limits.SCHEMA_VERSION, operation="watch", watch_cursor="bm90IGpzb24=")
    response = perform(request)
    assert response.failure_kind == "request"
    assert response.failure == "watch_cursor is not one this wb wrote; start again without it"


def test_transitions_seen_late_are_still_each_reported() -> None:
    tracker = Tracker()
    assert tracker.apply([]) == []
    # Dispatched and ended between two looks, after its worker ran: dispatched, started, finished.
    events = tracker.apply([_result("completed", worker_pid=42)])
    assert [(e.event, e.state) for e in events] == [("dispatched", "running"), ("started", "running"),
                                                    ("finished", "completed")]  # fmt: skip
    assert events[-1].result is not None and "result" not in events[0].to_json()
    assert tracker.apply([_result("completed", worker_pid=42)]) == []  # reported once


def test_a_run_stalled_when_watch_starts_is_running_then_stalled_and_running_again_when_it_writes() -> None:
    tracker = Tracker()
    stalled = _result(worker_pid=7, stalled_since="2026-12-01T00:10:00Z")
    assert [e.event for e in tracker.apply([stalled])] == ["running", "stalled"]
    assert [e.event for e in tracker.apply([_result(worker_pid=7)])] == ["running"]
    assert tracker.apply([_result(worker_pid=7)]) == []
