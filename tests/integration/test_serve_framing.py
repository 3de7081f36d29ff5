"""The serve mode's framing (docs/protocol.md "Serve mode"): one request line, one reply line with its request_id.

`wb --wb-internal-agent-serve` runs here as the courier would start it on a peer, fed
JSON lines on stdin; a line without a valid request_id is refused and never executed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from conftest import Machine

from protocol.entry import SERVE_ARGUMENT

pytestmark = pytest.mark.courier_independent(cold=True)  # the serve mode's private entry, never carried by the courier

VERSION = {"schema_version": 1, "operation": "version"}


def serve(machine: Machine, *documents: dict[str, Any]) -> list[dict[str, Any]]:
    """Send the lines, close stdin (the session then ends) and return every reply line, decoded."""
    lines = "".join(json.dumps(document) + "\n" for document in documents)
    done = subprocess.run(
        [sys.executable, "-m", "courier.main", SERVE_ARGUMENT],
        input=lines,
        capture_output=True,
        text=True,
        env=machine.env,
        cwd=machine.root,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    replies = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(replies) == len(documents), done.stdout
    return replies


def test_a_line_without_a_valid_request_id_is_refused_and_not_executed(machine: Machine) -> None:
    machine.clone()
    dispatch = {
        "schema_version": 1,
        "operation": "dispatch",
        "mode": "new",
        "worktree": "unasked",
        "profile": "fake",
        "task": "scenario:complete",
        "repository": "acme/widget",
        "timeout_ms": 60_000,
    }
    bad_ids: list[Any] = ["", "a" * 65, "has space", "new\nline", "é", 7, None]
    replies = serve(
        machine,
        dispatch,
        VERSION,
        *({**VERSION, "request_id": bad} for bad in bad_ids),
    )
    for reply in replies:
        assert reply["request_id"] == ""
        assert reply["failure_kind"] == "request"
        assert reply["failure"] == ("the request has no valid request_id (1-64 of [A-Za-z0-9._-]); it was not executed")
        assert "capabilities" not in reply and "result" not in reply
    assert {reply["operation"] for reply in replies} == {"dispatch", "version"}  # the echo, for the reader
    assert not (machine.home / "agents").exists() or not any((machine.home / "agents").iterdir())


def test_each_valid_request_id_comes_back_on_its_reply(machine: Machine) -> None:
    ids = ["r1", "a.b-C_9", "x" * 64]
    replies = serve(machine, *({**VERSION, "request_id": request_id} for request_id in ids))
    assert sorted(reply["request_id"] for reply in replies) == sorted(ids)
    for reply in replies:
        assert not reply.get("failure") and reply["operation"] == "version"
        assert "serve" in reply["capabilities"]
