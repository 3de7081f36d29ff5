"""How long the caller waits for one machine (docs/cli.md): `--machine-timeout`, and `await`'s bound and pace.

Each peer is a fake `wb_path` script on a real loopback sshd: one that reads the request and
never answers, and one that answers an `await` with `running` at once instead of waiting.
The commands run cold or through the courier, as the suite's WB_COURIER says.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import command_process, courier_on, wait_for
from tests_support import sample_record

from tests.integration.sshd import SshdFactory, SshdServer, sshd_unavailable_reason

pytestmark = pytest.mark.skipif(sshd_unavailable_reason() is not None, reason=str(sshd_unavailable_reason()))

RUN_ID = "agt-" + "5d" * 16
REF = f"m1:{RUN_ID}"
# The remote side of a silent peer stays alive this long; far beyond any bound asked for here.
PEER_HOLDS_S = 120
SILENT = f"cat >/dev/null\nexec sleep {PEER_HOLDS_S}\n"
# What a finished command may take beyond its bound: interpreter exit, closing the connection.
EXIT_SLACK_S = 3.0
_names = iter(range(1_000_000))


@dataclass
class Caller:
    """A supervisor's machine whose wb.yaml names one target per test, each a fake peer on `server`."""

    sshd: SshdFactory
    server: SshdServer
    base: Path

    def env(self, config: Path) -> dict[str, str]:
        return {
            "HOME": str(self.base),
            "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
            "WB_CONFIG": str(config),
            "WB_HOME": str(self.base / "wbhome"),
            "WB_SSH_CONFIG": str(self.sshd.client_config),
            "LANG": "C.UTF-8",
        }

    def peer(self, body: str) -> Path:
        """A wb.yaml whose machine `m1` runs this `#!/bin/sh` body as its wb."""
        script = self.server.script(f"peer{next(_names)}", body)
        return self.sshd.write_wb_config(f"c{next(_names)}", {"m1": self.sshd.target(self.server, wb_path=str(script))})

    def wb(
        self, config: Path, *args: str, timeout: float = 120, env: dict[str, str] | None = None, start_up_s: int = 0
    ) -> tuple[subprocess.CompletedProcess[str], float]:
        """Run wb; `start_up_s` is a slow start-up of the same process (a shell that sleeps, then execs wb)."""
        slow = ["/bin/sh", "-c", f'sleep {start_up_s}; exec "$@"', "sh"] if start_up_s else []
        started = time.monotonic()
        done = subprocess.run(
            [*slow, sys.executable, "-m", "courier.main", *args],
            capture_output=True,
            text=True,
            env={**self.env(config), **(env or {})},
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        return done, time.monotonic() - started


@pytest.fixture(scope="module")
def server(sshd: SshdFactory) -> SshdServer:
    return sshd.start("127.0.0.5")


@pytest.fixture
def caller(sshd: SshdFactory, server: SshdServer, tmp_path: Path) -> Iterator[Caller]:
    yield Caller(sshd, server, tmp_path)


def _channels_in_use(caller: Caller, config: Path) -> int:
    done, _ = caller.wb(config, "courier", "status", "--json")
    rows = json.loads(done.stdout).get("machines") or []
    return sum(int(row.get("channels_in_use", 0)) for row in rows)


# --- --machine-timeout: a peer that reads the request and never answers ------------------------

BOUNDED = [
    ("agent", "status", REF),
    ("agent", "stop", REF),
    ("agent", "logs", REF),
    ("agent", "list", "--to", "m1"),
    ("agent", "prune", "--older-than", "1h", "--to", "m1"),
]


@pytest.mark.parametrize("args", BOUNDED, ids=lambda args: args[1])
def test_a_silent_peer_is_given_up_at_the_machine_timeout_naming_machine_and_run(
    caller: Caller, args: tuple[str, ...]
) -> None:
    config = caller.peer(SILENT)
    done, elapsed = caller.wb(config, *args, "--machine-timeout", "2s", timeout=90)
    assert done.returncode == 255, (done.returncode, done.stderr)
    assert done.stderr.startswith("error: m1 (") and "within 2s" in done.stderr, done.stderr
    if REF in args:
        assert REF in done.stderr, done.stderr
    assert done.stdout == ""
    assert elapsed < 2 + EXIT_SLACK_S + 2, f"the call took {elapsed:.1f}s"  # start-up, connect, exit
    if courier_on():  # the bound reached the courier's call too: it let go of the silent channel
        assert wait_for(lambda: _channels_in_use(caller, config) == 0, 10)


@pytest.mark.parametrize(
    "args",
    [("agent", "status", REF), ("agent", "stop", REF), ("agent", "logs", REF), ("agent", "list"), ("agent", "prune")],
    ids=lambda args: args[1],
)
def test_the_machine_timeout_defaults_to_a_minute(caller: Caller, args: tuple[str, ...]) -> None:
    done, _ = caller.wb(caller.peer(SILENT), *args, "--help", env={"COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    # click wraps help at 80 columns: read the option's entry up to the next option.
    entry = " ".join(done.stdout.split("--machine-timeout", 1)[1].split("\n  --", 1)[0].split())
    assert entry.endswith("[default: 1m]"), entry


def test_a_machine_timeout_that_is_not_positive_is_a_usage_error(caller: Caller) -> None:
    done, _ = caller.wb(caller.peer(SILENT), "agent", "status", REF, "--machine-timeout", "0s")
    assert done.returncode == 2 and done.stderr == "error: --machine-timeout must be more than 0\n"


# --- await: start-up counts inside the bound, and a peer that does not wait is not hammered -----


def test_await_against_a_silent_peer_ends_by_the_bound_plus_its_slack_start_up_included(caller: Caller) -> None:
    config = caller.peer(SILENT)
    # 3 s of start-up (before wb's first call) count inside the bound: the whole command
    # ends by 5 s + 5 s (and the interpreter's exit), not 3 s later.
    done, elapsed = caller.wb(config, "agent", "await", REF, "--wait-timeout", "5s", timeout=60, start_up_s=3)
    assert done.returncode == 255, done.stderr
    assert f"did not answer the await of {REF} within the wait bound (5s, plus 5s" in done.stderr
    assert 5 + 5 <= elapsed < 5 + 5 + 2.5, f"the await took {elapsed:.1f}s"


def _reply(operation: str, **fields: Any) -> str:
    return shlex.quote(json.dumps({"schema_version": 1, "operation": operation, **fields}))


def test_await_backs_off_from_a_peer_that_answers_running_at_once(caller: Caller) -> None:
    calls = caller.server.root / f"calls{next(_names)}"
    running = sample_record(agent_id=RUN_ID, state="running", started_at="2026-11-30T10:00:00.000Z").to_wire()
    config = caller.peer(f"cat >/dev/null\necho x >> {calls}\nprintf '%s\\n' {_reply('await', result=running)}\n")
    done, elapsed = caller.wb(config, "agent", "await", REF, "--wait-timeout", "8s", timeout=60)
    assert done.returncode == 1 and "still running after the wait bound" in done.stderr, done.stderr
    asked = len(calls.read_text().splitlines())
    # Pauses of 0.5 s, 1 s, 2 s, 4 s between calls: five or six calls in 8 s, not one every 0.3 s.
    assert 2 <= asked <= 7, f"asked {asked} times in {elapsed:.1f}s"
    assert elapsed < 8 + EXIT_SLACK_S + 2, f"the await took {elapsed:.1f}s"


# --- await through the courier: a machine lost mid-wait, the courier killed mid-wait ------------


# Both tests set WB_COURIER themselves, so both courier passes would run them alike: one runs them.
@pytest.mark.courier_independent
@pytest.mark.parametrize("mode", ["off", "on"], ids=["cold", "courier"])
def test_an_await_that_loses_its_machine_mid_wait_names_the_reference(
    sshd: SshdFactory, tmp_path: Path, mode: str
) -> None:
    server = sshd.start("127.0.0.6")  # this test's own: it is stopped mid-wait
    caller = Caller(sshd, server, tmp_path)
    waiting = server.root / "waiting"
    config = caller.peer(f"cat >/dev/null\ntouch {waiting}\nexec sleep {PEER_HOLDS_S}\n")
    args = [sys.executable, "-m", "courier.main", "agent", "await", REF, "--wait-timeout", "60s"]
    env = {**caller.env(config), "WB_COURIER": mode}
    with subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as waiter:
        try:
            assert wait_for(waiting.exists, 30)
            sessions = server.session_processes()
            server.stop()  # the machine goes away: its connection drops, a new one is refused
            for session in sessions:
                with contextlib.suppress(psutil.Error):
                    session.kill()
            out, err = waiter.communicate(timeout=60)
        finally:
            if waiter.poll() is None:
                waiter.kill()
                waiter.communicate()
    assert waiter.returncode == 255 and out == "", err
    assert err.startswith("error: m1"), err
    assert err.endswith(f"\nthe run is not affected; await it again with: wb agent await {REF}\n"), err


@pytest.mark.courier_independent(cold=True)  # the WB_COURIER=off pass, to balance the two
def test_the_courier_killed_during_a_remote_await_prints_only_its_warning(caller: Caller) -> None:
    """The courier is killed while its command waits for the machine's reply, again and again.

    Its exit closes the command's socket before the kernel ends the command (the parent-death
    signal comes later), so a command that reported its lost call would print an error and
    `await it again …` beside the warning while the thin client waits on without the courier.
    """
    asked = caller.server.root / f"asked{next(_names)}"
    completed = sample_record(
        agent_id=RUN_ID,
        state="completed",
        terminal=True,
        started_at="2026-11-30T10:00:00.000Z",
        finished_at="2026-11-30T10:01:00.000Z",
    ).to_wire()
    answer = _reply("await", result=completed)
    # The courier's call is held until the courier is killed; the cold call after it is answered at once.
    config = caller.peer(f"cat >/dev/null\n[ -e {asked} ] || {{ touch {asked}; sleep 10; }}\nprintf '%s\\n' {answer}\n")
    args = [sys.executable, "-m", "courier.main", "agent", "await", REF, "--json"]
    env = {**caller.env(config), "WB_COURIER": "on"}
    for attempt in range(8):  # the race it guards against was lost about one time in four
        asked.unlink(missing_ok=True)
        with subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as waiter:
            try:
                assert wait_for(asked.exists, 30)  # the courier's call is in flight on the machine
                command = command_process(waiter.pid)  # the courier's child running the await
                assert command is not None and command != waiter.pid
                os.kill(psutil.Process(command).ppid(), signal.SIGKILL)
                out, err = waiter.communicate(timeout=60)
            finally:
                if waiter.poll() is None:
                    waiter.kill()
                    waiter.communicate()
        assert err == "warning: the wb courier ended during this command; waiting without it\n", (attempt, err)
        assert waiter.returncode == 0 and json.loads(out)["state"] == "completed", (attempt, out)
