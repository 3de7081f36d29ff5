"""Issue 10 against another machine over both SSH tiers: hostile text from a peer never reaches the
terminal raw (docs/cli.md#conventions-shared-by-every-command), and a peer's store files are opened
without following links or blocking (docs/protocol.md#the-receivers-rules; docs/runs.md#the-store)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import prepare_remote
from tests_support import sample_record

from courier.runs.store import Store
from tests.ssh_tiers import SshMachine, SshMachines


@pytest.fixture(scope="module")
def sshd(ssh_machines: SshMachines) -> SshMachines:
    """This module's machines: each test runs over both SSH tiers (tests/ssh_tiers.py)."""
    return ssh_machines


# Characters that must never reach a terminal from foreign text: C0/C1 controls, bidi controls,
# line and paragraph separators, the soft hyphen and other format characters.
UNSAFE = "\x1b\x07\x9b\u202e\u2066\u200b\u2028\u2029\u00ad\u180e\ufeff\U000e0041"
HOSTILE = "\x1b[31m" + UNSAFE


@pytest.fixture(scope="module")
def box(sshd: SshMachines) -> SshMachine:
    server = sshd.start("127.0.0.4")
    prepare_remote(server)
    return server


def _caller_env(sshd: SshMachines, box: SshMachine, home: Path, targets: dict[str, dict[str, Any]]) -> dict[str, str]:
    config = sshd.write_wb_config(f"caller-{home.name}", targets)
    return {
        "HOME": str(home),
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "WB_CONFIG": str(config),
        "WB_HOME": str(home / "wbhome"),
        "WB_PROJECTS_ROOT": str(home / "projects"),
        "WB_SSH_CONFIG": str(sshd.client_config),
        "LANG": "C.UTF-8",
    }


def _wb(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "courier.main", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def _hostile_result() -> dict[str, Any]:
    record = sample_record(state="completed", branch="wb/w1", finished_at=None)
    result = record.model_dump(mode="json", exclude_none=True, exclude={"timeout_ms", "schema_version", "network"})
    # Printable enough for the protocol models (no C0/C1 or bidi there), still unsafe on a terminal.
    result["profile"] = "fake\u2028\u2029\u00adx"
    result["branch"] = "wb/\u2028x\u00ad\u180ey"
    result["resolved"]["model"] = "gpt\u2029\u00ad5"
    result["failure"] = f"boom {HOSTILE} end"
    result["result"] = f"done {HOSTILE} end"
    return result


def _peer(box: SshMachine, name: str, reply: dict[str, Any]) -> Path:
    body = json.dumps(reply)  # ASCII: every hostile character travels as a JSON escape
    return box.script(name, f"cat >/dev/null\ncat <<'EOF'\n{body}\nEOF\n")


def _assert_clean(text: str) -> None:
    bad = sorted({f"U+{ord(ch):04X}" for ch in text if ch in UNSAFE})
    assert bad == [], f"unsafe characters reached the terminal: {bad}\n{text!r}"


def test_a_peers_warnings_and_fields_are_sanitised_in_list_to(
    sshd: SshMachines, box: SshMachine, tmp_path: Path
) -> None:
    result = _hostile_result()
    reply = {
        "schema_version": 1,
        "operation": "list",
        "results": [result],
        "warnings": [{"agent_id": "agt-" + "1" * 32, "error": f"unreadable {HOSTILE} record"}],
        "now": "2026-11-30T00:00:00.000Z",
    }
    peer = _peer(box, "hostile-list", reply)
    env = _caller_env(sshd, box, tmp_path, {"evil": sshd.target(box, wb_path=str(peer))})
    done = _wb(env, "agent", "list", "--to", "evil")
    assert done.returncode == 1, done.stderr
    assert result["agent_id"] in done.stdout and "fake" in done.stdout
    assert "warning: evil:agt-1111" in done.stderr and "unreadable" in done.stderr
    _assert_clean(done.stdout + done.stderr)
    # The same peer through list --all: the same sanitiser.
    every = _wb(env, "agent", "list", "--all")
    assert every.returncode == 1
    _assert_clean(every.stdout + every.stderr)


def test_a_peers_status_and_await_print_no_unsafe_character(sshd: SshMachines, box: SshMachine, tmp_path: Path) -> None:
    result = _hostile_result()
    ref = f"evil:{result['agent_id']}"
    for operation in ("status", "await"):
        reply = {"schema_version": 1, "operation": operation, "result": result, "now": "2026-11-30T00:00:00.000Z"}
        peer = _peer(box, f"hostile-{operation}", reply)
        env = _caller_env(sshd, box, tmp_path, {"evil": sshd.target(box, wb_path=str(peer))})
        done = _wb(env, "agent", operation, ref)
        assert done.returncode == 0, done.stderr
        assert "boom" in done.stdout and "wb/ x" in done.stdout
        _assert_clean(done.stdout + done.stderr)


def test_a_peers_refusal_text_is_sanitised(sshd: SshMachines, box: SshMachine, tmp_path: Path) -> None:
    reply = {
        "schema_version": 1,
        "operation": "status",
        "failure": f"no such run {HOSTILE}",
        "failure_kind": "not_found",
        "now": "2026-11-30T00:00:00.000Z",
    }
    peer = _peer(box, "hostile-refusal", reply)
    env = _caller_env(sshd, box, tmp_path, {"evil": sshd.target(box, wb_path=str(peer))})
    done = _wb(env, "agent", "status", "evil:agt-" + "2" * 32)
    assert done.returncode == 1 and "no such run" in done.stderr
    _assert_clean(done.stdout + done.stderr)


def _receivers(box: SshMachine) -> list[psutil.Process]:
    found = []
    for process in box.session_processes():
        try:
            if "--wb-internal-agent-remote" in process.cmdline():
                found.append(process)
        except psutil.Error:
            continue
    return found


@pytest.mark.parametrize("kind", ["symlink", "hardlink", "fifo"])
def test_remote_logs_refuse_a_linked_or_special_transcript(
    sshd: SshMachines, box: SshMachine, tmp_path: Path, kind: str
) -> None:
    env = _caller_env(sshd, box, tmp_path, {"box": sshd.target(box)})
    record = sample_record(state="completed")
    Store(box.wb_home).create(record, "task")
    events = box.wb_home / "agents" / record.agent_id / "events.jsonl"
    big = box.root / f"elsewhere-{kind}.jsonl"
    big.write_bytes(b'{"type":"turn.started"}\n' * 130_000)  # about 3 MB, over the 2 MiB remote bound
    if kind == "symlink":
        events.symlink_to(big)
        reason = "is a symbolic link"
    elif kind == "hardlink":
        os.link(big, events)
        reason = "has 2 hard links"
    else:
        os.mkfifo(events, 0o600)
        reason = "is a FIFO"
    for extra in (("--raw",), (), ("--follow",)):
        started = time.monotonic()
        done = _wb(env, "agent", "logs", f"box:{record.agent_id}", *extra, timeout=30)
        assert done.returncode == 1, (extra, done.stdout, done.stderr)
        assert done.stdout == ""
        assert f"error: box: {events} {reason}" in done.stderr
        assert "internal" not in done.stderr
        assert time.monotonic() - started < 20
    assert _receivers(box) == []  # no receiver left blocked on the FIFO
