"""The courier's exec peer (courier/channels/exec.py, `ExecPeer`) driven directly, with real child processes.

The exec machine is a fake `wb` (a Python script): one call per process with
`--wb-internal-agent-remote`, request lines answered with its pid with
`--wb-internal-agent-serve`. The first serve process leaves a "holder" child with its
stdout (as an `ssh -T` whose ControlPersist master outlives it would), so the peer can be
made to start a successor while its predecessor's reader still waits for end of file.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from courier.channels.channel import DEFAULT_BOUNDS
from courier.channels.exec import ExecChannel, ExecPeer
from courier.config import ExecTarget
from protocol.entry import REMOTE_ARGUMENT

FAKE_WB = r"""
import json, os, subprocess, sys, time
from pathlib import Path

state = Path(os.environ["FAKE_WB_STATE"])
while (state / "hold").exists():  # the test holds this call until it removes the file
    time.sleep(0.01)
if sys.argv[-1] == "--wb-internal-agent-serve":
    (state / "serve-started").touch()
    holder = state / "holder.pid"
    if not holder.exists():  # the first serve process only: a child that keeps its stdout open
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], stdin=subprocess.DEVNULL)
        holder.write_text(str(child.pid))
    for line in sys.stdin:
        request_id = json.loads(line)["request_id"]
        sys.stdout.write('{"request_id":"%s","pid":%d}\n' % (request_id, os.getpid()))
        sys.stdout.flush()
else:
    request = json.loads(sys.stdin.read())
    capabilities = ["serve"] if request.get("operation") == "version" else []
    print(json.dumps({"schema_version": 1, "ok": True, "pid": os.getpid(), "capabilities": capabilities}))
"""

LIST = b'{"operation":"list","protocol_version":1}\n'


async def _until(condition: Callable[[], bool], timeout: float = 30) -> None:
    """Wait for `condition` on the event loop (the peer's tasks run meanwhile)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out waiting for a condition"
        await asyncio.sleep(0.01)


async def _until_pipes_closed(process: asyncio.subprocess.Process | None) -> None:
    """Wait until a serve process's pipes closed: they close only once the holder's copies do, and a loop
    that ended first would leave their transports open (unclosed-transport warnings at garbage collection)."""
    if process is not None:
        pipes = (process.stdout, process.stderr)
        await _until(lambda: all(pipe is not None and pipe.at_eof() for pipe in pipes))


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _peer(tmp_path: Path) -> ExecPeer:
    script = tmp_path / "fake_wb.py"
    script.write_text(FAKE_WB)
    channel = ExecChannel("box", ExecTarget(argv=[sys.executable, str(script)]))
    channel.env = {**os.environ, "FAKE_WB_STATE": str(tmp_path)}
    return ExecPeer(channel, ["wb", REMOTE_ARGUMENT], max_sessions=4)


async def _served_pid(peer: ExecPeer) -> int:
    outcome = await peer.call(LIST, "list", DEFAULT_BOUNDS)
    assert outcome.exit_status == 0, outcome
    return int(json.loads(outcome.stdout)["pid"])


def test_a_serve_process_that_ends_late_does_not_kill_its_successor(tmp_path: Path) -> None:
    """Serve process A ends (its reader sees end of file) only after B replaced it: B keeps serving."""

    async def scenario() -> None:
        peer = _peer(tmp_path)
        try:
            await _served_pid(peer)  # one process; the peer probes `version` and starts serve process A
            await _until(lambda: peer.describe()["mode"] == "serve")
            first = peer.serve
            assert first is not None
            pid_a = await _served_pid(peer)

            first.close()  # A is killed, but its holder child keeps A's stdout open: A's reader waits
            await _until(lambda: not _alive(pid_a))
            await _served_pid(peer)  # one process again; the peer starts serve process B
            await _until(lambda: peer.serve is not first and peer.describe()["mode"] == "serve")
            pid_b = await _served_pid(peer)
            assert pid_b != pid_a

            ended = asyncio.Event()
            first.when_ended(lambda _: ended.set())  # runs after the peer's own callback for A
            os.kill(int((tmp_path / "holder.pid").read_text()), signal.SIGKILL)  # now A's reader sees end of file
            await asyncio.wait_for(ended.wait(), 30)

            # A kill sent to B was sent by now: B would never answer, and the call would be one process.
            assert await _served_pid(peer) == pid_b, "the end of serve process A killed its successor B"
            assert _alive(pid_b) and peer.describe()["mode"] == "serve"
        finally:
            await peer.close()

    asyncio.run(scenario())


def test_a_serve_process_that_died_is_replaced_even_while_its_stdout_stays_open(tmp_path: Path) -> None:
    """Serve process A dies, its holder child keeps A's stdout open: the call fails over, and B replaces A."""

    async def scenario() -> None:
        peer = _peer(tmp_path)
        process_a: asyncio.subprocess.Process | None = None
        try:
            await _served_pid(peer)
            await _until(lambda: peer.describe()["mode"] == "serve")
            first, process_a = peer.serve, peer._process
            assert process_a is not None
            pid_a = await _served_pid(peer)

            os.kill(pid_a, signal.SIGKILL)  # A's stdin breaks; its reader still waits on the holder's copy of stdout
            await _until(lambda: not _alive(pid_a))
            assert await _served_pid(peer) != pid_a  # this call as one process
            await _until(lambda: peer.serve is not first and peer.describe()["mode"] == "serve", 20)
            pid_b = await _served_pid(peer)
            assert pid_b != pid_a and _alive(pid_b)
        finally:
            os.kill(int((tmp_path / "holder.pid").read_text()), signal.SIGKILL)
            await _until_pipes_closed(process_a)
            await peer.close()

    asyncio.run(scenario())


def test_a_call_right_after_the_serve_process_died_fails_over_at_once(tmp_path: Path) -> None:
    """Serve process A dies and the loop gets no turn before the next call: the write to A's broken stdin
    must fail that call over, not leave it waiting for a reply on A's stdout, which A's holder keeps open."""

    async def scenario() -> None:
        peer = _peer(tmp_path)
        process_a: asyncio.subprocess.Process | None = None
        try:
            await _served_pid(peer)
            await _until(lambda: peer.describe()["mode"] == "serve")
            process_a = peer._process
            pid_a = await _served_pid(peer)

            os.kill(pid_a, signal.SIGKILL)
            while _alive(pid_a):  # blocking on purpose: the loop must not see A's pipes close first
                time.sleep(0.01)
            pid = await asyncio.wait_for(_served_pid(peer), 20)  # the holder keeps A's stdout for 120 s
            assert pid != pid_a
        finally:
            os.kill(int((tmp_path / "holder.pid").read_text()), signal.SIGKILL)
            await _until_pipes_closed(process_a)
            await peer.close()

    asyncio.run(scenario())


def test_a_peer_closed_during_a_call_starts_no_serve_process_after_it(tmp_path: Path) -> None:
    """The courier retires a peer (another caller's environment) while a one-process call is in flight:
    the end of that call must not start a serve process nobody would ever close."""

    async def scenario() -> None:
        peer = _peer(tmp_path)
        (tmp_path / "hold").touch()
        call = asyncio.ensure_future(_served_pid(peer))
        await _until(lambda: peer.describe()["channels_in_use"] == 1)
        await peer.close()  # what ExecPool.retire does
        (tmp_path / "hold").unlink()
        await call
        probe = peer._side_task
        if probe is not None:
            await asyncio.wait_for(asyncio.gather(probe, return_exceptions=True), 30)
        assert peer.describe()["mode"] != "serve", "a retired peer started a serve process"
        assert not (tmp_path / "serve-started").exists()
        await peer.close()

    asyncio.run(scenario())


def test_a_call_while_the_serve_process_is_being_prepared_waits_for_it(tmp_path: Path) -> None:
    """The first call is one process; the version probe after it is held. A call arriving meanwhile
    travels on the serve process once it is up, rather than as one more process beside it (on a Ray
    head each such process joins the cluster afresh, docs/ray.md#cost)."""

    async def scenario() -> None:
        peer = _peer(tmp_path)
        hold = tmp_path / "hold"
        try:
            await _served_pid(peer)  # one process; the peer now probes `version`, then starts its serve process
            hold.touch()  # the probe (started on the loop's next turn) waits until this file is gone
            second = asyncio.ensure_future(peer.call(LIST, "list", DEFAULT_BOUNDS))
            await asyncio.sleep(0.5)
            assert not second.done() and not (tmp_path / "serve-started").exists()
            hold.unlink()
            outcome = await asyncio.wait_for(second, 20)
            served = peer._process
            assert served is not None, "no serve process was started"
            pid = json.loads(outcome.stdout)["pid"]
            assert pid == served.pid, f"answered by one more process ({pid}), not the serve process ({served.pid})"
        finally:
            hold.unlink(missing_ok=True)
            process = peer._process
            await peer.close()
            holder = tmp_path / "holder.pid"
            if holder.exists():
                os.kill(int(holder.read_text()), signal.SIGKILL)
            await _until_pipes_closed(process)

    asyncio.run(scenario())
