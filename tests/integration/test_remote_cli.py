"""The six commands against another machine: `--to MACHINE` and `machine:agt-…`, over every tier.

The remote machine is this checkout's `wb` with its own WB_HOME, projects root, wb.yaml and
the fake Codex first on its PATH, reached over each tier of tests/ssh_tiers.py: a loopback SSH
server (in-process asyncssh, then real OpenSSH sshd), then an `exec` target (`env -i …` running
the machine's wb locally, then `ssh -T` through OpenSSH to a loopback sshd).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from conftest import courier_on, prepare_remote, wait_for

from tests.json_documents import check_output
from tests.ssh_tiers import INPROCESS_CHANNEL, SSH_TIERS, SshMachine, SshMachines, active_tiers, channel_tiers

# Each exec tier in one courier pass (tests/ssh_tiers.py, "Time"): exec-ssh warm (the courier's
# `ssh -T` serve process per exec machine), exec-env cold; the in-process channel is cold by nature.
PASSES = {"warm": ("exec-ssh",), "cold": ("exec-env", INPROCESS_CHANNEL)}
ssh_tier = channel_tiers(**PASSES)
# The tiers where a command runs on the machine: wb_path scripts, sessions to kill. The in-process
# channel runs no command (its receiver is a function of this process), so those tests skip that tier.
COMMAND_TIERS = [tier for tier in active_tiers(**PASSES) if tier != INPROCESS_CHANNEL]
WB = [sys.executable, "-m", "courier.main"]
INPROCESS_WB = [sys.executable, "-m", "tests.integration.inprocess_channel_cli"]


@pytest.fixture(scope="module")
def sshd(ssh_machines: SshMachines) -> SshMachines:
    """This module's machines: each test runs over every tier, SSH and exec."""
    return ssh_machines


@dataclass
class Caller:
    """The machine a supervisor runs on: its own home and config naming the remote machines."""

    env: dict[str, str]
    command: list[str]  # how wb is started: `python -m courier.main`, or the in-process channel's launcher

    def wb(
        self, *args: str, timeout: float = 120, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [*self.command, *args],
            capture_output=True,
            text=True,
            env={**self.env, **(env or {})},
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        check_output(args, done)  # every --json output follows its published schema
        return done

    @contextlib.contextmanager
    def popen(self, *args: str, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[str]]:
        """A wb process in the background; killed and reaped however the test ends."""
        process = subprocess.Popen(
            [*self.command, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**self.env, **(env or {})},
        )
        try:
            yield process
        finally:
            if process.poll() is None:
                process.kill()
            process.communicate(timeout=30)

    def dispatch(self, task: str, worktree: str, *extra: str) -> str:
        done = self.wb(
            "agent",
            "dispatch",
            "--to",
            "box",
            "--new-worktree",
            worktree,
            "--profile",
            "fake",
            "--repo",
            "acme/widget",
            "--task",
            task,
            *extra,
        )
        assert done.returncode == 0, done.stderr
        ref = done.stdout.split()[0]
        if "--json" not in extra:  # the location is `<machine>:<worktree name>`, not a path
            # (docs/cli.md#wb-agent-dispatch)
            assert done.stdout == f"{ref} running box:{worktree} (mock/gpt-5.5)\n"
        return ref


@pytest.fixture(scope="module")
def box(sshd: SshMachines) -> SshMachine:
    server = sshd.start("127.0.0.2")
    prepare_remote(server)
    return server


@pytest.fixture(scope="module")
def caller(ssh_tier: str, sshd: SshMachines, box: SshMachine, tmp_path_factory: pytest.TempPathFactory) -> Caller:
    home = tmp_path_factory.mktemp("caller")
    noise = box.script(
        "noisy-wb", f'echo "Welcome to box!"\necho "{{}}not json"\nexec {sys.executable} -m courier.main "$@"\n'
    )
    config = sshd.write_wb_config(
        "caller",
        {
            "box": sshd.target(box),
            "noisy": sshd.target(box, wb_path=str(noise)),
            "broken": {"host": "bad host"},
        },
    )
    env = {
        "HOME": str(home),
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "WB_CONFIG": str(config),
        "WB_HOME": str(home / "wbhome"),
        "WB_PROJECTS_ROOT": str(home / "projects"),
        "WB_SSH_CONFIG": str(sshd.client_config),
        "LANG": "C.UTF-8",
    }
    if ssh_tier == INPROCESS_CHANNEL:
        env["WB_COURIER"] = "off"  # the courier cannot carry a receiver that lives in the caller
        env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])  # the launcher is a tests module
        return Caller(env, INPROCESS_WB)
    return Caller(env, WB)


def test_a_remote_run_round_trip_with_qualified_references(caller: Caller, box: SshMachine) -> None:
    """dispatch prints box:agt-…; every command accepts exactly that reference back."""
    ref = caller.dispatch("scenario:complete the-remote-task-text-3c9d", "r1")
    assert ref.startswith("box:agt-")
    run_id = ref.split(":", 1)[1]
    assert (box.wb_home / "agents" / run_id / "run.json").exists()
    assert not (Path(caller.env["WB_HOME"]) / "agents" / run_id).exists()

    awaited = caller.wb("agent", "await", ref, "--json")
    assert awaited.returncode == 0, awaited.stderr
    result = json.loads(awaited.stdout)
    assert result["machine"] == "box" and result["state"] == "completed" and result["agent_id"] == run_id
    assert (box.projects_root / ".wb-worktrees/acme/widget/r1/hello.txt").exists()

    status = caller.wb("agent", "status", ref)
    assert status.returncode == 0 and f"agent:    {ref}\n" in status.stdout and "state:    completed" in status.stdout
    same = caller.wb("agent", "status", run_id, "--to", "box", "--json")
    assert same.returncode == 0 and json.loads(same.stdout)["agent_id"] == run_id

    logs = caller.wb("agent", "logs", ref)
    assert logs.returncode == 0
    assert logs.stdout.splitlines()[0] == str(box.wb_home / "agents" / run_id / "events.jsonl")
    assert "  ran: /bin/bash -lc ls" in logs.stdout
    raw = caller.wb("agent", "logs", ref, "--raw")
    assert raw.returncode == 0 and '"type":"turn.completed"' in raw.stdout

    listed = caller.wb("agent", "list", "--to", "box")
    assert listed.returncode == 0 and listed.stdout.startswith(f"{ref}\tcompleted\tfake\tgpt-5.5\tr1\t")
    listed_json = caller.wb("agent", "list", "--to", "box", "--json")
    assert all(item["machine"] == "box" for item in json.loads(listed_json.stdout))
    # The task travelled on stdin only: no process or log line on the remote side carries it.
    assert "the-remote-task-text-3c9d" not in box.log()


def test_a_short_reference_is_resolved_by_the_machine_holding_the_run(caller: Caller, box: SshMachine) -> None:
    """`box:agt-` and 6 hex digits names the run; box resolves it, and the output carries the whole ID."""
    from tests_support import sample_record

    from courier.runs.store import Store

    ref = caller.dispatch("scenario:complete", "r-short")
    run_id = ref.split(":", 1)[1]
    awaited = caller.wb("agent", "await", f"box:{run_id[:10]}", "--json")
    assert awaited.returncode == 0, awaited.stderr
    assert json.loads(awaited.stdout)["agent_id"] == run_id
    status = caller.wb("agent", "status", run_id[:10], "--to", "box")
    assert status.returncode == 0 and f"agent:    {ref}\n" in status.stdout
    twins = [sample_record(agent_id="agt-a11a5e" + tail + "0" * 24, state="completed") for tail in ("01", "02")]
    for twin in twins:
        Store(box.wb_home).create(twin, "task")
    ambiguous = caller.wb("agent", "status", "box:agt-a11a5e")
    assert ambiguous.returncode == 2 and ambiguous.stdout == ""
    assert 'ambiguous run ID prefix "agt-a11a5e": agt-a11a5e01…, agt-a11a5e02… (give more digits)' in ambiguous.stderr


def test_stop_through_a_qualified_reference(caller: Caller) -> None:
    ref = caller.dispatch("scenario:hang", "r2")
    assert wait_for(lambda: json.loads(caller.wb("agent", "status", ref, "--json").stdout).get("worker_pid"), 30)
    stopped = caller.wb("agent", "stop", ref)
    assert stopped.returncode == 0 and stopped.stdout.startswith(f"stopping {ref} worker process ")
    result = json.loads(caller.wb("agent", "await", ref, "--json").stdout)
    assert result["state"] == "failed" and "stopped on request" in result["failure"]


def test_stop_of_a_remote_run_whose_worker_is_gone_says_so(caller: Caller, box: SshMachine) -> None:
    from tests_support import sample_record

    from courier.runs.store import Store

    gone = subprocess.Popen(["true"])
    gone.wait()
    # Owner and worker both exited (their PIDs carry other start tokens now, if anyone's).
    record = sample_record(owner_pid=gone.pid, owner_token="linux:x:1", worker_pid=gone.pid, worker_token="linux:x:2")
    Store(box.wb_home).create(record, "task")
    ref = f"box:{record.agent_id}"
    stopped = caller.wb("agent", "stop", ref)
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout == f"{ref}: its worker is already gone; recorded as failed\n"
    assert json.loads(caller.wb("agent", "status", ref, "--json").stdout)["state"] == "failed"


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (
            ("status", "nowhere:agt-" + "0" * 32),
            2,
            'unknown machine "nowhere": configured machines: box, broken, noisy',
        ),
        (("status", "box:agt-" + "0" * 32, "--to", "noisy"), 2, "disagree"),
        (("status", "box:agt-" + "0" * 32), 1, "box: unknown agent run agt-00000000000000000000000000000000"),
        (("status", "broken:agt-" + "0" * 32), 2, "session_move.targets.broken.ssh.host"),
        (
            (
                "dispatch",
                "--to",
                "box",
                "--new-worktree",
                "r9",
                "--profile",
                "ghost",
                "--repo",
                "acme/widget",
                "--task",
                "x",
            ),
            2,
            'box: unknown profile "ghost"',
        ),
        (
            (
                "dispatch",
                "--to",
                "box",
                "--new-worktree",
                "r9",
                "--profile",
                "fake",
                "--repo",
                "acme/nothing",
                "--task",
                "x",
            ),
            1,
            "box: no canonical clone at",
        ),
    ],
)
def test_remote_refusals_keep_their_exit_codes(caller: Caller, args: tuple[str, ...], code: int, message: str) -> None:
    done = caller.wb("agent", *args)
    assert done.returncode == code, done.stderr
    assert message in done.stderr and done.stdout == ""


@pytest.mark.parametrize("ssh_tier", COMMAND_TIERS, indirect=True)
def test_login_shell_noise_before_the_reply_is_tolerated(caller: Caller) -> None:
    """Not over the in-process channel: it needs noise printed by a wb_path script, and that channel runs no command."""
    done = caller.wb("agent", "list", "--to", "noisy")
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("ssh_tier", COMMAND_TIERS, indirect=True)
def test_a_transport_failure_after_sending_names_the_intended_reference(
    caller: Caller, sshd: SshMachines, box: SshMachine
) -> None:
    """Not over the in-process channel: it needs a crashing wb_path script, and that channel runs no command."""
    crash = box.script("crash-after-read", "cat >/dev/null\necho 'segfault' >&2\nexit 139\n")
    config = sshd.write_wb_config("crashing", {"box": sshd.target(box, wb_path=str(crash))})
    done = caller.wb(
        "agent",
        "dispatch",
        "--to",
        "box",
        "--new-worktree",
        "r8",
        "--profile",
        "fake",
        "--repo",
        "acme/widget",
        "--task",
        "x",
        env={"WB_CONFIG": str(config)},
    )
    assert done.returncode == 255
    assert "the run may have started; ask for it with: wb agent status box:agt-" in done.stderr


@pytest.mark.parametrize("ssh_tier", COMMAND_TIERS, indirect=True)
def test_a_peer_without_failure_kind_maps_to_a_finding_with_a_note(
    caller: Caller, sshd: SshMachines, box: SshMachine
) -> None:
    """Not over the in-process channel: it needs an older peer played by a wb_path script (it runs none)."""
    go_reply = '{"schema_version":1,"operation":"status","failure":"agent run not found","results":null}'
    old = box.script("go-wb", f"cat >/dev/null\necho '{go_reply}'\n")
    config = sshd.write_wb_config("gopeer", {"box": sshd.target(box, wb_path=str(old))})
    done = caller.wb("agent", "status", "box:agt-" + "0" * 32, env={"WB_CONFIG": str(config)})
    assert done.returncode == 1
    assert "box: agent run not found (the peer's wb predates failure_kind" in done.stderr


def test_await_without_a_bound_outlasts_several_wire_chunks(caller: Caller) -> None:
    ref = caller.dispatch("scenario:slow sleep:3", "r3")
    started = time.monotonic()
    done = caller.wb("agent", "await", ref, "--wait-timeout", "0", "--json", env={"WB_AWAIT_CHUNK_MS": "1000"})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["state"] == "completed"
    assert time.monotonic() - started >= 1.0


def _remote_pollers(box: SshMachine) -> list[psutil.Process]:
    """One-call receivers, and serve-mode processes (docs/courier.md) with a request in flight.

    One thread per request."""
    return [p for p in box.session_processes() if "--wb-internal-agent-remote" in _cmdline(p) or _serving(p)]


def _serving(process: psutil.Process) -> bool:
    try:
        return "--wb-internal-agent-serve" in process.cmdline() and process.num_threads() > 1
    except psutil.Error:
        return False


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []


@pytest.mark.parametrize("ssh_tier", COMMAND_TIERS, indirect=True)
def test_killing_the_session_sshd_during_await_is_a_transport_error_and_the_run_goes_on(
    caller: Caller, box: SshMachine
) -> None:
    """Not over the in-process channel: it needs a session to kill, and that channel runs no command."""
    ref = caller.dispatch("scenario:slow sleep:4", "r4")
    if courier_on():
        # Warm, the await must ride the session the courier keeps: over exec that is the serve process,
        # started just after the first call of a fresh environment; a one-process exec call whose
        # process is killed is never re-sent (its exit cannot tell a lost channel from a crash).
        assert wait_for(lambda: _courier_mode(caller, "box") == "serve", 30)
    with caller.popen("agent", "await", ref) as waiter:
        _await_killed_session(box, waiter, reconnects=courier_on())
    again = caller.wb("agent", "await", ref, "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["state"] == "completed"


def _courier_mode(caller: Caller, machine: str) -> object:
    rows = json.loads(caller.wb("courier", "status", "--json").stdout).get("machines") or []
    return next((row.get("mode") for row in rows if row["machine"] == machine), None)


def _await_killed_session(box: SshMachine, waiter: subprocess.Popen[str], *, reconnects: bool = False) -> None:
    """Kill the session serving the await (its sshd, or the in-process server drops the connection):
    cold, a transport error; warm, the courier reconnects once (docs/courier.md)."""
    assert wait_for(lambda: _remote_pollers(box), 30)
    box.kill_sessions()
    out, err = waiter.communicate(timeout=60)
    if reconnects:
        assert waiter.returncode == 0, err
        assert "completed" in out
        return
    assert waiter.returncode == 255, err
    assert "box" in err and "Traceback" not in err


@pytest.mark.parametrize("ssh_tier", COMMAND_TIERS, indirect=True)
def test_a_killed_client_leaves_no_remote_poller_beyond_one_chunk(caller: Caller, box: SshMachine) -> None:
    """Not over the in-process channel: it needs a receiver process left behind, and that channel runs no command."""
    ref = caller.dispatch("scenario:hang", "r5")
    with caller.popen("agent", "await", ref, env={"WB_AWAIT_CHUNK_MS": "3000"}) as waiter:
        assert wait_for(lambda: _remote_pollers(box), 30)
        waiter.kill()
        waiter.communicate(timeout=10)
    assert wait_for(lambda: not _remote_pollers(box), 3 + 5)
    caller.wb("agent", "stop", ref)


def test_processes_started_for_a_remote_dispatch_never_hold_the_session_stdio(caller: Caller) -> None:
    ref = caller.dispatch("scenario:hang", "r6")
    assert wait_for(lambda: json.loads(caller.wb("agent", "status", ref, "--json").stdout).get("worker_pid"), 30)
    status = json.loads(caller.wb("agent", "status", ref, "--json").stdout)
    for fd in (0, 1, 2):
        assert os.readlink(f"/proc/{status['owner_pid']}/fd/{fd}") == "/dev/null"
    # The worker's stdout and stderr are the owner's own pipe, not anything of the SSH session.
    owner_fds = {
        os.readlink(f"/proc/{status['owner_pid']}/fd/{fd}") for fd in os.listdir(f"/proc/{status['owner_pid']}/fd")
    }
    for fd in (1, 2):
        link = os.readlink(f"/proc/{status['worker_pid']}/fd/{fd}")
        assert link.startswith("pipe:") and link in owner_fds
    caller.wb("agent", "stop", ref)


@pytest.mark.parametrize("ssh_tier", SSH_TIERS, indirect=True)
def test_the_users_ssh_config_supplies_alias_port_key_and_known_hosts(
    caller: Caller, sshd: SshMachines, box: SshMachine, tmp_path: Path
) -> None:
    """Without WB_SSH_CONFIG, ~/.ssh/config is read: an alias resolves through HostName, Port, IdentityFile.

    SSH tiers only: wb's own SSH client reads that file; an exec target's command reads its own."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    (home / ".ssh" / "config").write_text(
        "Host box-alias\n"
        f"  HostName {box.host}\n"
        f"  Port {box.port}\n"
        "  User root\n"
        f"  IdentityFile {sshd.client_key}\n"
        f"  UserKnownHostsFile {sshd.known_hosts}\n"
    )
    config = sshd.write_wb_config("aliased", {"box": {"host": "box-alias"}})
    env = {key: value for key, value in caller.env.items() if key != "WB_SSH_CONFIG"}
    done = subprocess.run(
        [sys.executable, "-m", "courier.main", "agent", "list", "--to", "box"],
        capture_output=True,
        text=True,
        env={**env, "HOME": str(home), "WB_CONFIG": str(config)},
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr


def test_a_remote_transcript_over_2_mib_is_refused_not_truncated(caller: Caller, box: SshMachine) -> None:
    from tests_support import sample_record

    from courier.runs.store import Store

    record = sample_record(state="completed")
    Store(box.wb_home).create(record, "task")
    events = box.wb_home / "agents" / record.agent_id / "events.jsonl"
    events.write_bytes(b'{"type":"turn.started"}\n' * (3 * 2**20 // 24))
    done = caller.wb("agent", "logs", f"box:{record.agent_id}", "--raw")
    assert done.returncode == 1 and done.stdout == ""
    assert f"box: transcript for {record.agent_id} is {events.stat().st_size} bytes; " in done.stderr
    assert f"fetch it on that machine with wb agent logs {record.agent_id} --raw" in done.stderr
    tail = caller.wb("agent", "logs", f"box:{record.agent_id}", "--tail", "2")
    assert tail.returncode == 0 and tail.stdout.splitlines()[0] == str(events)
