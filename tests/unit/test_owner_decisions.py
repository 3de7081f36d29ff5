"""The terminal state rules of docs/runs.md#terminal-state, first match wins."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests_support import sample_record

from courier.runs.owner import Owner
from courier.runs.store import Store


def _owner(tmp_path: Path) -> tuple[Store, Owner, str]:
    store = Store(tmp_path / "home").ensure()
    record = sample_record()
    store.create(record, "task")
    return store, Owner(store, record), record.agent_id


def _feed(owner: Owner, *lines: str) -> None:
    for line in lines:
        owner.summary.feed(line.encode() + b"\n")


COMPLETED = '{"type":"turn.completed","usage":{"input_tokens":1,"output_tokens":2}}'
FAILED = '{"type":"turn.failed","error":{"message":"boom"}}'


def test_a_stop_request_wins_over_a_timeout(tmp_path: Path) -> None:
    store, owner, agent_id = _owner(tmp_path)
    store.request_stop(agent_id, "test")
    owner.timed_out = True
    owner.decide_and_save(exit_code=143)
    saved = store.load(agent_id)
    assert saved.state == "failed" and str(saved.failure).startswith("stopped on request at ")


@pytest.mark.parametrize(
    ("timed_out", "exit_code", "lines", "state", "failure"),
    [
        (True, 143, [COMPLETED], "timeout", "timed out after 1m0s"),
        (False, 1, [FAILED], "failed", "harness exited with code 1; harness reported a failed turn: boom"),
        (False, 2, [], "failed", "harness exited with code 2"),
        (False, 0, [FAILED], "failed", "harness reported a failed turn: boom"),
        (False, 0, ['{"type":"turn.started"}'], "failed", "no terminal turn event"),
        (False, 0, ["not json", COMPLETED, "{also not"], "completed", None),
        (False, 0, ['{"type":"error","message":"Reconnecting... 1/2"}', COMPLETED], "completed", None),
    ],
)
def test_terminal_state_rules(
    tmp_path: Path, timed_out: bool, exit_code: int, lines: list[str], state: str, failure: str | None
) -> None:
    store, owner, agent_id = _owner(tmp_path)
    owner.timed_out = timed_out
    _feed(owner, *lines)
    owner.decide_and_save(exit_code=exit_code)
    saved = store.load(agent_id)
    assert (saved.state, saved.failure) == (state, failure)
    assert saved.finished_at and saved.duration_ms is not None


def test_a_lost_terminal_save_is_retried_then_reported_through_owner_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from courier.runs import owner as owner_mod
    from courier.runs.store import render

    store, owner, agent_id = _owner(tmp_path)
    owner.record.owner_pid, owner.record.owner_token = 999_999_999, "linux:gone:1"
    store.save(owner.record)
    attempts: list[int] = []

    def failing_save(record: object) -> None:
        attempts.append(1)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(store, "save", failing_save)
    monkeypatch.setattr(owner_mod.time, "sleep", lambda _s: None)
    _feed(owner, COMPLETED)
    owner.decide_and_save(exit_code=0)
    monkeypatch.undo()
    assert len(attempts) == 5
    result = render(store.load(agent_id), store)
    assert result.state == "abandoned"
    assert "could not save the terminal state completed" in str(result.failure)


def test_a_lost_terminal_save_is_retried_five_times_over_15_s_then_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from courier.runs import owner as owner_mod
    from courier.runs import store as store_mod

    store, _, agent_id = _owner(tmp_path)
    record = store.load(agent_id)
    record.state = "completed"
    tries: list[str] = []
    pauses: list[float] = []

    def refuse(saved: object) -> None:
        tries.append("save")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "save", refuse)
    monkeypatch.setattr(owner_mod.time, "sleep", pauses.append)
    owner_mod.save_terminal(store, record)
    assert len(tries) == 5 and pauses == [1.0, 2.0, 4.0, 8.0]
    error = (store.run_dir(agent_id) / store_mod.OWNER_ERROR).read_text()
    assert error == "the owner could not save the terminal state completed: [Errno 28] No space left on device"


def test_a_run_that_ended_between_its_read_and_the_owner_check_renders_its_end_not_abandoned(tmp_path: Path) -> None:
    """A reader holding the record from before the owner's last save, checking the owner after it exited."""
    from courier.runs.store import render

    store, _, agent_id = _owner(tmp_path)
    read_while_running = store.load(agent_id)
    read_while_running.owner_pid, read_while_running.owner_token = 999_999_999, "linux:gone:1"
    ended = read_while_running.model_copy(update={"state": "failed", "failure": "usage limit"})
    store.save(ended)
    result = render(read_while_running, store)
    assert (result.state, result.failure) == ("failed", "usage limit")
    assert render(read_while_running).state == "abandoned"  # without the store nothing can be read again


def test_a_run_whose_owner_started_after_dispatch_made_its_record_renders_running(tmp_path: Path) -> None:
    """Dispatch renders the record it made, without an owner; the owner has written itself in since."""
    import os

    from courier.runs import process
    from courier.runs.store import render

    store, _, agent_id = _owner(tmp_path)
    as_made = store.load(agent_id)
    assert as_made.owner_pid is None
    started = as_made.model_copy(update={"owner_pid": os.getpid(), "owner_token": process.start_token(os.getpid())})
    store.save(started)  # this process stands in for the live owner
    result = render(as_made, store)
    assert (result.state, result.owner_alive) == ("running", True)

