"""The cold CLI's SSH carrier (courier/channels/ssh_carrier.py; docs/courier.md#the-ssh-carrier-a-cold-command), over
real OpenSSH.

A cold command that names an SSH machine forks a copy of itself at its start; the copy imports
asyncssh while the command imports pydantic and validates, and makes the command's SSH calls.
What a user sees must not change: the same replies and errors as the command's own process
gives (WB_SSH_CARRIER=off), no connection for a refused request, and no process left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import wait_for
from tests_support import imported_modules, sample_record

from courier.runs.store import Store
from tests.integration.sshd import SshdFactory, SshdServer, sshd_unavailable_reason

pytestmark = [
    pytest.mark.skipif(sshd_unavailable_reason() is not None, reason=str(sshd_unavailable_reason())),
    pytest.mark.courier_independent(cold=True),  # every wb here is run cold (WB_COURIER=off)
]

RUN_ID = "agt-" + "c4" * 16
WB = [sys.executable, "-m", "courier.main"]


@pytest.fixture(scope="module")
def server(sshd: SshdFactory) -> SshdServer:
    machine = sshd.start("127.0.0.31")
    Store(machine.wb_home).ensure().create(sample_record(agent_id=RUN_ID, state="completed", exit_code=0), "a task")
    return machine


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A TCP port that accepts and never speaks: a machine whose SSH handshake never completes."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield sock


def environment(sshd: SshdFactory, tmp_path: Path, targets: dict[str, dict[str, object]]) -> dict[str, str]:
    config = sshd.write_wb_config(f"carrier-{tmp_path.name}", targets)
    return {
        "HOME": str(tmp_path),
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "WB_CONFIG": str(config),
        "WB_HOME": str(tmp_path / "wbhome"),
        "WB_SSH_CONFIG": str(sshd.client_config),
        "WB_COURIER": "off",
        "LANG": "C.UTF-8",
    }


def run(env: dict[str, str], *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*WB, *args], capture_output=True, text=True, env={**env, **extra}, timeout=120, stdin=subprocess.DEVNULL
    )


def test_asyncssh_is_imported_by_the_carrier_and_the_answer_is_the_same(
    sshd: SshdFactory, server: SshdServer, tmp_path: Path
) -> None:
    env = environment(sshd, tmp_path, {"m1": sshd.target(server)})
    argv = ["-m", "courier.main", "agent", "status", f"m1:{RUN_ID}", "--json"]
    # -X importtime reports the command's own imports (the carrier's stderr is /dev/null).
    names, carried = imported_modules(argv, env, tmp_path)
    assert carried.returncode == 0, carried.stderr
    assert "asyncssh" not in names and "courier.channels.ssh_carrier" in names
    names, alone = imported_modules(argv, {**env, "WB_SSH_CARRIER": "off"}, tmp_path)
    assert alone.returncode == 0 and "asyncssh" in names
    assert json.loads(carried.stdout) == json.loads(alone.stdout)
    assert json.loads(carried.stdout)["agent_id"] == RUN_ID


def test_a_fan_out_through_the_carrier_lists_every_machine(
    sshd: SshdFactory, server: SshdServer, tmp_path: Path
) -> None:
    """Two names for one host share one connection (the pool, in the carrier), and both are answered."""
    env = environment(sshd, tmp_path, {"m1": sshd.target(server), "m2": sshd.target(server)})
    carried = run(env, "agent", "list", "--all", "--json")
    alone = run(env, "agent", "list", "--all", "--json", WB_SSH_CARRIER="off")
    assert carried.returncode == alone.returncode == 0, carried.stderr + alone.stderr
    rows = {row["machine"]: row for row in json.loads(carried.stdout)["machines"]}
    assert rows["m1"]["ok"] and rows["m2"]["ok"] and rows["m1"]["error"] is None, rows
    assert json.loads(carried.stdout)["results"] == json.loads(alone.stdout)["results"]


def test_the_carrier_marks_when_asyncssh_is_imported(sshd: SshdFactory, server: SshdServer, tmp_path: Path) -> None:
    """With the dispatch-latency trace on, the carrier marks `carrier.ready` from its own process (the
    benchmark prints it beside the command's `call.send`, docs/benchmarks.md#dispatch-latency)."""
    env = environment(sshd, tmp_path, {"m1": sshd.target(server)})
    trace = tmp_path / "trace"
    done = run(env, "agent", "status", f"m1:{RUN_ID}", WB_STAGE_TRACE=str(trace))
    assert done.returncode == 0, done.stderr
    pids = {name: pid for name, pid, _ in (line.split() for line in trace.read_text().splitlines())}
    assert "carrier.ready" in pids and "call.send" in pids, pids
    assert pids["carrier.ready"] != pids["main.cli"] == pids["call.send"]


def test_a_refused_request_opens_no_connection(sshd: SshdFactory, listener: socket.socket, tmp_path: Path) -> None:
    port = listener.getsockname()[1]
    env = environment(sshd, tmp_path, {"m1": {"host": "127.0.0.1", "port": port, "user": "root"}})
    refused = run(env, "agent", "status", "m1:agt-not-an-id")
    assert refused.returncode == 2 and "error:" in refused.stderr, refused.stderr
    listener.settimeout(0)
    with pytest.raises(BlockingIOError):
        listener.accept()  # nobody connected
    given_up = run(env, "agent", "status", f"m1:{RUN_ID}", "--machine-timeout", "1s")
    assert given_up.returncode == 255 and "did not answer the status request" in given_up.stderr, given_up.stderr
    listener.accept()[0].close()  # the valid request did connect


def test_errors_read_as_they_do_without_the_carrier(sshd: SshdFactory, server: SshdServer, tmp_path: Path) -> None:
    """A machine whose host key is not known: the same message and exit code, from the carrier."""
    unknown = sshd.start("127.0.0.32", remember_key=False)
    env = environment(sshd, tmp_path, {"m1": sshd.target(unknown)})
    carried = run(env, "agent", "status", f"m1:{RUN_ID}")
    alone = run(env, "agent", "status", f"m1:{RUN_ID}", WB_SSH_CARRIER="off")
    assert carried.returncode == alone.returncode == 255
    assert "host key" in carried.stderr and carried.stderr == alone.stderr


def group_empty(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def test_the_carrier_ends_with_its_command(sshd: SshdFactory, listener: socket.socket, tmp_path: Path) -> None:
    """Ended normally, killed, or interrupted: no copy is left running."""
    port = listener.getsockname()[1]
    env = environment(sshd, tmp_path, {"m1": {"host": "127.0.0.1", "port": port, "user": "root"}})
    finished = subprocess.Popen(
        [*WB, "agent", "status", f"m1:{RUN_ID}", "--machine-timeout", "1s"],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    assert finished.wait(timeout=60) == 255
    assert group_empty(finished.pid)  # reaped before the command exited: nothing to wait for

    for ending, code in ((signal.SIGKILL, -signal.SIGKILL), (signal.SIGINT, 130)):
        with subprocess.Popen(
            [*WB, "agent", "status", f"m1:{RUN_ID}", "--machine-timeout", "60s"],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            start_new_session=True,
        ) as hanging:  # fmt: skip
            try:
                connection, _ = listener.accept()  # the carrier has connected: the call is under way
                with connection:
                    os.killpg(hanging.pid, ending)  # ^C reaches the whole group, as from a terminal
                    _, stderr = hanging.communicate(timeout=30)
                    assert hanging.returncode == code, stderr
                    assert wait_for(lambda: group_empty(hanging.pid), 10), f"left running after {ending!r}"
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(hanging.pid, signal.SIGKILL)
