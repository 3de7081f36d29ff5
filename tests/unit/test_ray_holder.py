"""A run's holder task frees its slot as soon as the run ends (docs/ray.md#cost), without polling."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest
from tests_support import sample_record

from courier.executor import ray_node
from courier.runs import process
from courier.runs.store import Store
from protocol.models import RemoteRequest


def test_a_holder_watches_its_runs_owner_and_returns_once_it_exits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("WB_HOME", str(home))
    owner = subprocess.Popen(["sleep", "60"])
    try:
        record = sample_record(owner_pid=owner.pid, owner_token=process.start_token(owner.pid))
        Store(home).ensure().create(record, "task")
        looks: list[str] = []
        answer = ray_node.answer_here

        def counted(request: RemoteRequest) -> bytes:
            looks.append(request.operation)
            return answer(request)

        monkeypatch.setattr(ray_node, "answer_here", counted)
        holder = threading.Thread(target=ray_node._hold_until_terminal, args=(record.agent_id,), daemon=True)
        holder.start()
        holder.join(timeout=1.0)
        assert holder.is_alive(), "the holder returned while its run's owner still ran"
        # Watching the owner, it looked at the run once; polling every HOLD_POLL_S would be 4 looks.
        assert looks == ["status"]
    finally:
        owner.kill()
        owner.wait()
    ended = time.monotonic()
    holder.join(timeout=ray_node.OWNER_WATCH_S)
    assert not holder.is_alive()
    waited = time.monotonic() - ended
    assert waited < ray_node.OWNER_WATCH_S / 2, "the holder noticed the owner's exit only on its timer"
    assert looks == ["status", "status"]
