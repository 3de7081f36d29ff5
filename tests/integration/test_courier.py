"""The courier (docs/courier.md): warm commands behave as cold ones, and every fault of the brief is handled.

Real processes throughout: the thin client, the courier it starts, a remote machine (every tier
of tests/ssh_tiers.py: in-process asyncssh, OpenSSH sshd, then the exec targets `env -i … wb` and
`ssh -T` through OpenSSH), and the remote wb in serve mode or as an older one-call-per-session peer.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import COURIER_MODULE, REPO_ROOT, Machine, command_process, pid_alive, prepare_remote, wait_for

from tests.integration.inprocess_sshd import keygen
from tests.integration.sshd import SshdFactory, SshdServer
from tests.ssh_tiers import EXEC_TIERS, SSH_TIERS, SshMachine, SshMachines, channel_tiers
from tests.tests_support import wb_recording_modules

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the courier is Linux-only")
ON = {"WB_COURIER": "on"}
OFF = {"WB_COURIER": "off"}
# A test whose every wb command sets WB_COURIER itself runs the same in both courier passes: it runs
# in the WB_COURIER=on pass only (tests/conftest.py, which checks that claim).
ONE_PASS = pytest.mark.courier_independent


def _status(who: Machine, env: dict[str, str] | None = None) -> dict[str, object]:
    done = who.wb("courier", "status", "--json", env=env)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert isinstance(document, dict)
    return document


def _courier_pid(who: Machine, env: dict[str, str] | None = None) -> int | None:
    pid = _status(who, env).get("pid")
    return pid if isinstance(pid, int) else None


def _couriers_under(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if COURIER_MODULE in cmdline and any(marker in part for part in cmdline):
            found.append(proc)
    return found


# --------------------------------------------------------------------------- same behaviour, warm and cold


def _strip_refs(text: str) -> str:
    import re

    return re.sub(r"agt-[0-9a-f]{32}", "agt-X", text)


def test_warm_and_cold_commands_print_and_exit_the_same(machine: Machine) -> None:
    clone = machine.clone()
    cases: list[tuple[tuple[str, ...], str | None, Path | None]] = [
        (("--version",), None, None),
        (("agent", "list"), None, None),
        (("agent", "list", "--json"), None, None),
        (("agent", "status", "agt-nothex"), None, None),
        (("agent", "status", "agt-" + "0" * 32), None, None),
        (("agent", "list", "--to", "nowhere"), None, None),
        (
            (
                "agent",
                "bogus",
            ),
            None,
            None,
        ),
        # --task-file - reads the caller's stdin; --repo comes from the origin of the current directory
        (
            ("agent", "dispatch", "--new-worktree", "{}", "--profile", "fake", "--task-file", "-"),
            "scenario:complete",
            clone,
        ),
        (("agent", "dispatch", "--new-worktree", "b{}", "--profile", "fake", "--task-file", "-"), "   \n", clone),
    ]
    for index, (args, stdin, cwd) in enumerate(cases):
        outputs = []
        for mode, env in (("zzwarm", ON), ("zzcold", OFF)):
            argv = [arg.replace("{}", f"{mode}{index}") for arg in args]
            done = machine.wb(*argv, input=stdin, cwd=cwd, env=env)
            outputs.append(
                (done.returncode, _strip_refs(done.stdout.replace(mode, "M")), done.stderr.replace(mode, "M"))
            )
        assert outputs[0] == outputs[1], args
    assert _courier_pid(machine) is not None
    runs = json.loads(machine.wb("agent", "list", "--json").stdout)
    assert {run["worktree"] for run in runs} == {"zzwarm7", "zzcold7"}
    assert all(run["repository"] == "acme/widget" for run in runs)


@ONE_PASS
def test_the_callers_environment_reaches_the_command(machine: Machine, tmp_path: Path) -> None:
    """The courier was started by one environment; a later caller's own WB_CONFIG is the one obeyed."""
    assert machine.wb("agent", "list", env=ON).returncode == 0
    other = tmp_path / "other.yaml"
    other.write_text("agents:\n  profiles: [not, a, mapping]\n")
    other.chmod(0o600)
    done = machine.wb("agent", "list", env={**ON, "WB_CONFIG": str(other)})
    cold = machine.wb("agent", "list", env={**OFF, "WB_CONFIG": str(other)})
    assert done.returncode == cold.returncode == 2
    assert done.stderr == cold.stderr and str(other) in done.stderr


def test_a_closed_stdout_exits_141_warm(machine: Machine) -> None:
    machine.clone()
    for index in range(3):
        machine.dispatch(worktree=f"w{index}")
    assert machine.wb("agent", "list", env=ON).returncode == 0
    reader, writer = os.pipe()
    os.close(reader)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "courier.main", "agent", "list"],
            env={**machine.env, **ON},
            stdout=writer,
            stderr=subprocess.PIPE,
            timeout=60,
        )
    finally:
        os.close(writer)
    assert done.returncode == 141 and done.stderr == b""


def test_warm_commands_see_a_terminal_as_cold_ones_do(machine: Machine) -> None:
    import pty

    machine.clone()
    ref = machine.dispatch(task="scenario:garbage")
    assert machine.wb("agent", "await", ref).returncode == 0
    shown = []
    for env in (ON, OFF):
        leader, follower = pty.openpty()
        try:
            done = subprocess.run(
                [sys.executable, "-m", "courier.main", "agent", "logs", ref, "--raw"],
                env={**machine.env, **env},
                stdin=subprocess.DEVNULL,
                stdout=follower,
                stderr=subprocess.PIPE,
                timeout=60,
            )
            os.close(follower)
            follower = -1
            chunks = []
            with contextlib.suppress(OSError):
                while chunk := os.read(leader, 65536):
                    chunks.append(chunk)
        finally:
            os.close(leader)
            if follower >= 0:
                os.close(follower)
        assert done.returncode == 0
        shown.append(b"".join(chunks))
    assert shown[0] == shown[1] and b"\x1b" not in shown[0]


def test_ctrl_c_during_a_warm_await_exits_130_and_the_run_goes_on(machine: Machine) -> None:
    machine.clone()
    ref = machine.dispatch(task="scenario:hang")
    waiter = subprocess.Popen(
        [sys.executable, "-m", "courier.main", "agent", "await", ref],
        env={**machine.env, **ON},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_for(lambda: command_process(waiter.pid) not in (None, waiter.pid), 30)
        time.sleep(0.5)  # inside the wait: the child has parsed its arguments and polls
        waiter.send_signal(signal.SIGINT)
        _, err = waiter.communicate(timeout=30)
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.communicate()
    assert waiter.returncode == 130, err
    cold_line = f"interrupted; the run continues; resume with wb agent await {ref}\n"
    assert err.endswith(cold_line) and "Traceback" not in err
    assert json.loads(machine.wb("agent", "status", ref, "--json").stdout)["state"] == "running"
    machine.wb("agent", "stop", ref)


@ONE_PASS
def test_wb_courier_off_starts_no_courier(machine: Machine) -> None:
    assert machine.wb("agent", "list", env=OFF).returncode == 0
    assert _couriers_under(str(machine.root)) == []
    done = machine.wb("courier", "status")
    assert done.returncode == 0 and done.stdout.startswith("no courier is running")


@ONE_PASS
def test_courier_status_says_why_no_courier_can_start_under_a_shared_home(machine: Machine) -> None:
    shared = machine.root / "shared-home"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    done = machine.wb("courier", "status", env={"WB_HOME": str(shared), "XDG_RUNTIME_DIR": ""})
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        f"no courier is running, and none can start here: the wb home {shared} is not a private directory "
        f"of yours (chmod 700 {shared})\n"
    )
    assert list(shared.iterdir()) == []  # nothing created under it


# --------------------------------------------------------------------------- lifecycle and faults


@ONE_PASS
def test_status_and_stop(machine: Machine) -> None:
    assert machine.wb("agent", "list", env=ON).returncode == 0
    status = _status(machine)
    pid = status["pid"]
    assert isinstance(pid, int) and pid_alive(pid)
    assert status["commands"] == 1 and status["machines"] == []
    socket_path = Path(str(status["socket"]))
    assert socket_path.parent == machine.home / "run"
    assert (socket_path.parent.stat().st_mode & 0o777) == 0o700
    assert (socket_path.stat().st_mode & 0o777) == 0o600
    text = machine.wb("courier", "status")
    assert f"pid {pid}" in text.stdout and "machines: none connected" in text.stdout
    stopped = machine.wb("courier", "stop")
    assert stopped.stdout == f"stopped courier {pid}\n"
    assert wait_for(lambda: not pid_alive(pid), 15)
    assert not socket_path.exists()
    assert machine.wb("courier", "stop").stdout == "no courier is running\n"


@ONE_PASS
def test_a_stale_socket_from_a_killed_courier_is_replaced(machine: Machine) -> None:
    assert machine.wb("agent", "list", env=ON).returncode == 0
    status = _status(machine)
    old = int(str(status["pid"]))
    os.kill(old, signal.SIGKILL)
    assert wait_for(lambda: not pid_alive(old), 15)
    assert Path(str(status["socket"])).exists()  # stale: nobody listens
    done = machine.wb("agent", "list", env=ON)
    assert done.returncode == 0 and done.stdout == "no dispatched agent runs\n" and done.stderr == ""
    new = _courier_pid(machine)
    assert new is not None and new != old


def test_the_courier_killed_during_an_await_is_reported_and_the_await_goes_on(machine: Machine) -> None:
    machine.clone()
    ref = machine.dispatch(task="scenario:slow sleep:4")
    waiter = subprocess.Popen(
        [sys.executable, "-m", "courier.main", "agent", "await", ref, "--json"],
        env={**machine.env, **ON},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_for(lambda: command_process(waiter.pid) not in (None, waiter.pid), 30)
        courier = _courier_pid(machine)
        assert courier is not None
        os.kill(courier, signal.SIGKILL)
        out, err = waiter.communicate(timeout=60)
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.communicate()
    assert err == "warning: the wb courier ended during this command; waiting without it\n"
    assert waiter.returncode == 0 and json.loads(out)["state"] == "completed"


def test_a_killed_courier_is_reported_for_a_command_that_is_not_rerun(machine: Machine, tmp_path: Path) -> None:
    """A dispatch is never re-run blind: its outcome is unknown, the caller is told how to find out (255)."""
    machine.clone()
    slow_git = tmp_path / "bin" / "git"
    slow_git.parent.mkdir()
    real_git = shutil.which("git")
    slow_git.write_text(f'#!/bin/sh\nsleep 3\nexec {real_git} "$@"\n')
    slow_git.chmod(0o755)
    assert machine.wb("agent", "list", env=ON).returncode == 0
    env = {**ON, "PATH": f"{slow_git.parent}:{machine.env['PATH']}"}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "courier.main",
            "agent",
            "dispatch",
            "--new-worktree",
            "k",
            "--profile",
            "fake",
            "--repo",
            "acme/widget",
            "--task",
            "scenario:complete",
        ],
        env={**machine.env, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_for(lambda: command_process(process.pid) not in (None, process.pid), 30)
        courier = _courier_pid(machine)
        assert courier is not None
        os.kill(courier, signal.SIGKILL)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 255 and out == ""
    assert err.startswith("error: the wb courier ended before this command finished; its outcome is unknown")


@ONE_PASS
def test_the_courier_ends_after_courier_idle(machine: Machine) -> None:
    machine.write_config(machine.config_path.read_text() + "courier:\n  idle: 3s\n")
    assert machine.wb("agent", "list", env=ON).returncode == 0
    found = _couriers_under(str(machine.root))
    assert len(found) == 1
    assert wait_for(lambda: not pid_alive(found[0].pid), 30)
    assert not list((machine.home / "run").glob("*.sock"))


@ONE_PASS
def test_a_bad_courier_setting_is_a_usage_error(machine: Machine) -> None:
    machine.write_config(machine.config_path.read_text() + "courier:\n  max_sessions_per_machine: 0\n")
    done = machine.wb("agent", "list", env=OFF)
    assert done.returncode == 2
    assert "courier.max_sessions_per_machine: must be from 1 to" in done.stderr


@ONE_PASS
def test_an_upgraded_wb_is_used_by_the_next_command(tmp_path: Path) -> None:
    """The courier notices that wb changed on disk and steps aside; the next command runs the new program."""
    copy = tmp_path / "installed"
    for package in ("courier", "protocol"):
        shutil.copytree(REPO_ROOT / package, copy / package, ignore=shutil.ignore_patterns("__pycache__"))
    machine = Machine(root=tmp_path / "m")
    from conftest import make_machine

    machine = make_machine(tmp_path / "m")
    machine.env["PYTHONPATH"] = str(copy)
    from courier import __version__

    first = machine.wb("--version", env=ON)
    assert first.stdout == f"wb {__version__} (protocol schema 1)\n"
    old = _courier_pid(machine)
    assert old is not None
    init = copy / "courier" / "__init__.py"
    init.write_text(init.read_text().replace(f'__version__ = "{__version__}"', '__version__ = "99.0.0"'))
    second = machine.wb("--version", env=ON)
    assert second.stdout == "wb 99.0.0 (protocol schema 1)\n" and second.stderr == ""
    assert wait_for(lambda: not pid_alive(old), 15)
    new = _courier_pid(machine)
    assert new is not None and new != old


# --------------------------------------------------------------------------- two users


SECOND_USER = "wbcourier2"
RUNUSER = "/usr/sbin/runuser"
USERADD = "/usr/sbin/useradd"
USERDEL = "/usr/sbin/userdel"


def _readable_copy(deps: str) -> str:
    """wb and its dependencies copied where any user can read them, for a checkout under a private directory."""
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="wb-second-user-code-"))
    for package in ("courier", "protocol"):
        shutil.copytree(REPO_ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(deps, root / "site-packages", ignore=shutil.ignore_patterns("__pycache__"), symlinks=True)
    subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)
    root.chmod(0o755)
    return f"{root}:{root / 'site-packages'}"


def _python_for(user: str) -> list[str] | None:
    """An interpreter the other user can run, with the paths that let it import wb and its dependencies."""
    import pydantic

    deps = str(Path(pydantic.__file__).resolve().parents[1])

    def works(candidate: str, pythonpath: str, code: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [RUNUSER, "-u", user, "--", candidate, "-c", code],
            capture_output=True,
            text=True,
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": pythonpath},
        )

    for candidate in (sys.executable, "/usr/bin/python3"):
        probe = works(candidate, "", "import sys; print(sys.version_info[:2])")
        if probe.returncode != 0 or probe.stdout.strip() != str(tuple(sys.version_info[:2])):
            continue
        pythonpath = f"{REPO_ROOT}:{deps}"
        if works(candidate, pythonpath, "import pydantic, asyncssh, typer, courier").returncode != 0:
            # The checkout or its virtualenv is under a directory only root can enter (CI's clone may be).
            pythonpath = _readable_copy(deps)
        if works(candidate, pythonpath, "import pydantic, asyncssh, typer, courier").returncode == 0:
            return [candidate, pythonpath]
    return None


@pytest.fixture
def second_user() -> Iterator[tuple[str, Path]]:
    if os.geteuid() != 0 or not os.access(RUNUSER, os.X_OK) or not os.access(USERADD, os.X_OK):
        pytest.skip("needs root with useradd and runuser to make a second user")
    import tempfile

    home = Path(tempfile.mkdtemp(prefix="wb-second-user-"))
    subprocess.run([USERDEL, SECOND_USER], capture_output=True)
    subprocess.run([USERADD, "-M", "-d", str(home), "-s", "/bin/sh", SECOND_USER], check=True, capture_output=True)
    shutil.chown(home, SECOND_USER, SECOND_USER)
    home.chmod(0o700)
    try:
        yield SECOND_USER, home
    finally:
        for proc in psutil.process_iter(["username"]):
            if proc.info["username"] == SECOND_USER:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
        subprocess.run([USERDEL, SECOND_USER], capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


@ONE_PASS
def test_two_users_each_have_their_own_courier_and_cannot_reach_the_other(
    machine: Machine, second_user: tuple[str, Path]
) -> None:
    user, home = second_user
    python = _python_for(user)
    if python is None:  # e.g. the checkout or its virtualenv lives under a directory only root can enter
        pytest.skip("no Python with wb's dependencies that a second user can run here")
    interpreter, pythonpath = python
    env = {
        "HOME": str(home),
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "WB_COURIER": "on",
        "PYTHONPATH": pythonpath,
    }

    def as_second(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                RUNUSER,
                "-u",
                user,
                "--",
                "env",
                "-i",
                *(f"{k}={v}" for k, v in env.items()),
                interpreter,
                "-m",
                "courier.main",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd="/",
        )

    assert machine.wb("agent", "list", env=ON).returncode == 0
    mine = _status(machine)
    done = as_second("agent", "list")
    assert done.returncode == 0 and done.stdout == "no dispatched agent runs\n", done.stderr
    theirs = json.loads(as_second("courier", "status", "--json").stdout)
    assert theirs["pid"] != mine["pid"]
    assert psutil.Process(int(theirs["pid"])).username() == user
    assert str(theirs["socket"]).startswith(str(home / ".wb" / "run"))
    # The other user cannot even reach the first user's socket (a 0700 directory of root's) ...
    probe = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "try:\n"
        "    s.connect(sys.argv[1])\n"
        "except OSError as exc:\n"
        "    print('refused', exc.errno); sys.exit(0)\n"
        "try:\n"
        "    s.sendall(b'\\0\\0\\0\\x0e\\0\\0\\0\\x01\\0\\0\\0\\x06status')\n"
        "    print('answered', repr(s.recv(100)))\n"
        "except OSError as exc:\n"
        "    print('answered', exc.errno)\n"
    )
    socket_path = Path(str(mine["socket"]))
    reached = subprocess.run(
        [RUNUSER, "-u", user, "--", interpreter, "-c", probe, str(socket_path)], capture_output=True, text=True
    )
    assert reached.stdout.startswith("refused"), reached.stdout + reached.stderr
    # ... and were the socket reachable (a hard link in their home, mode 0666), the courier
    # would still refuse their uid (SO_PEERCRED) and close the connection without a word.
    borrowed = home / "borrowed.sock"
    os.link(socket_path, borrowed)
    socket_path.chmod(0o666)
    try:
        reached = subprocess.run(
            [RUNUSER, "-u", user, "--", interpreter, "-c", probe, str(borrowed)], capture_output=True, text=True
        )
    finally:
        socket_path.chmod(0o600)
        borrowed.unlink()
    assert reached.stdout.startswith("answered"), reached.stdout + reached.stderr
    assert "status" not in reached.stdout and "pid" not in reached.stdout
    assert pid_alive(int(str(mine["pid"])))


# --------------------------------------------------------------------------- remote: serve mode and faults

OLD_WB = """\
case "$1" in
  --wb-internal-agent-serve) echo tried >> {marker}; echo "wb: no such option: $1" >&2; exit 2;;
esac
{sleep}
exec {python} -m courier.main "$@" | {python} -c 'import json, sys
reply = json.load(sys.stdin)
reply.pop("capabilities", None)
sys.stdout.write(json.dumps(reply))'
"""


class Caller(Machine):
    """A caller whose wb.yaml names remote machines; each Caller has its own WB_HOME, so its own courier."""


# The remote tests below set WB_COURIER=on themselves, so both courier passes would run the same:
# marked courier_independent, they run in the WB_COURIER=on pass only, over every tier (tests/conftest.py).
ssh_tier = channel_tiers(warm=EXEC_TIERS, cold=())


def _caller(root: Path, config: Path, ssh_config: Path) -> Caller:
    root.mkdir(mode=0o700, parents=True)
    caller = Caller(root=root)
    caller.env = {
        "HOME": str(root),
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "WB_CONFIG": str(config),
        "WB_HOME": str(root / "wbhome"),
        "WB_PROJECTS_ROOT": str(root / "projects"),
        "WB_SSH_CONFIG": str(ssh_config),
        "LANG": "C.UTF-8",
        "PYTHONPATH": str(REPO_ROOT),
        "WB_COURIER": "on",
    }
    return caller


class Remote:
    def __init__(self, factory: SshMachines, base: Path) -> None:
        self.factory = factory
        self.box = factory.start("127.0.0.2")
        prepare_remote(self.box)
        self.marker = self.box.root / "serve-attempts"
        python = sys.executable
        old = self.box.script("old-wb", OLD_WB.format(marker=self.marker, sleep="", python=python))
        slow_old = self.box.script("slow-old-wb", OLD_WB.format(marker=self.marker, sleep="sleep 1", python=python))
        self.config = factory.write_wb_config(
            "courier",
            {
                "box": factory.target(self.box),
                "old": factory.target(self.box, wb_path=str(old)),
                "slowold": factory.target(self.box, wb_path=str(slow_old)),
            },
        )
        self.base = base

    def caller(self, name: str) -> Caller:
        return _caller(self.base / name, self.config, self.factory.client_config)


@pytest.fixture(scope="module")
def remote(ssh_machines: SshMachines, tmp_path_factory: pytest.TempPathFactory) -> Remote:
    """One remote machine and its peers, over each SSH tier in turn."""
    return Remote(ssh_machines, tmp_path_factory.mktemp("courier-callers"))


def _machine_row(caller: Caller, machine: str) -> dict[str, object]:
    for row in _status(caller)["machines"]:  # type: ignore[union-attr]
        if row["machine"] == machine:
            return dict(row)
    return {}


def _serve_processes(box: SshMachine) -> list[psutil.Process]:
    found = []
    for proc in box.session_processes():
        with contextlib.suppress(psutil.Error):
            if "--wb-internal-agent-serve" in proc.cmdline():
                found.append(proc)
    return found


@ONE_PASS
def test_a_current_peer_is_used_in_serve_mode_with_concurrent_requests(remote: Remote) -> None:
    caller = remote.caller("serve")
    assert caller.wb("agent", "list", "--to", "box").returncode == 0
    assert wait_for(lambda: _machine_row(caller, "box").get("mode") == "serve", 30)
    assert wait_for(lambda: len(_serve_processes(remote.box)) == 1, 15)
    ref = caller.wb(
        "agent",
        "dispatch",
        "--to",
        "box",
        "--new-worktree",
        "s1",
        "--profile",
        "fake",
        "--repo",
        "acme/widget",
        "--task",
        "scenario:hang",
    )
    assert ref.returncode == 0, ref.stderr
    reference = ref.stdout.split()[0]
    waiter = subprocess.Popen(
        [sys.executable, "-m", "courier.main", "agent", "await", reference, "--wait-timeout", "8s"],
        env=caller.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # The await is in flight on the serve process (one thread per request) ...
        assert wait_for(lambda: any(p.num_threads() > 1 for p in _serve_processes(remote.box)), 30)
        started = time.monotonic()
        status = caller.wb("agent", "status", reference, "--json")
        # ... and does not hold up another request on the same session.
        assert status.returncode == 0 and json.loads(status.stdout)["state"] == "running"
        assert time.monotonic() - started < 6
        assert waiter.poll() is None
        _, err = waiter.communicate(timeout=60)
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.communicate()
    assert waiter.returncode == 1 and "still running after the wait bound" in err
    assert len(_serve_processes(remote.box)) == 1
    assert not remote.marker.exists()
    caller.wb("agent", "stop", reference)
    row = _machine_row(caller, "box")
    assert row["mode"] == "serve" and int(str(row["calls"])) >= 4


@ONE_PASS
def test_an_older_peer_is_used_one_call_per_session(remote: Remote) -> None:
    caller = remote.caller("old")
    for _ in range(3):
        done = caller.wb("agent", "list", "--to", "old", "--json")
        assert (done.returncode == 0 and json.loads(done.stdout) == []) or done.stdout.startswith("["), done.stderr
    assert wait_for(lambda: _machine_row(caller, "old").get("mode") == "session", 30)
    assert caller.wb("agent", "list", "--to", "old").returncode == 0
    assert not remote.marker.exists(), "serve mode was tried with a peer that does not list it"


@ONE_PASS
@pytest.mark.parametrize("ssh_tier", SSH_TIERS, indirect=True)
def test_forty_concurrent_calls_queue_at_max_sessions_per_machine_and_none_fails(remote: Remote) -> None:
    """SSH tiers only: MaxSessions is a bound on one SSH connection's channels."""
    caller = remote.caller("forty")
    assert caller.wb("agent", "list", "--to", "slowold").returncode == 0
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "courier.main", "agent", "list", "--to", "slowold", "--json"],
            env=caller.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(40)
    ]
    outcomes = [(p.communicate(timeout=300), p.returncode) for p in processes]
    for (out, err), code in outcomes:
        assert code == 0, err
        assert isinstance(json.loads(out), list)
    row = _machine_row(caller, "slowold")
    assert row["max_sessions"] == 8
    assert row["peak_channels"] == 8, row  # 40 one-second calls at once: the bound was reached, never passed
    assert int(str(row["calls"])) == 41


def _restart_sshd(factory: SshdFactory, server: SshdServer) -> None:
    """Stop sshd and every session it had, then start it again on the same port with the same keys."""
    server.stop()
    server.log_path.write_text("")
    server.process = subprocess.Popen(
        ["/usr/sbin/sshd", "-D", "-E", str(server.log_path), "-f", str(server.root / "sshd_config")],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    factory._wait_ready(server)


@ONE_PASS
@pytest.mark.parametrize("ssh_tier", ["openssh"], indirect=True)
def test_sshd_restarted_between_two_calls_is_reconnected_transparently(remote: Remote, sshd: SshdFactory) -> None:
    """OpenSSH only: a real sshd restarted on its port (its sessions outliving it) is what is reconnected to."""
    server = sshd.start("127.0.0.3")
    prepare_remote(server)
    config = sshd.write_wb_config("restart", {"again": sshd.target(server)})
    caller = _caller(remote.base / "restart", config, sshd.client_config)
    assert caller.wb("agent", "list", "--to", "again").returncode == 0
    first = _machine_row(caller, "again")
    assert first["connected"] is True
    sessions = server.session_processes()
    _restart_sshd(sshd, server)
    for process in sessions:  # sshd's restart leaves sessions alive; a host's reboot would not
        with contextlib.suppress(psutil.Error):
            process.kill()
    done = caller.wb("agent", "list", "--to", "again")
    assert done.returncode == 0 and done.stdout == "no dispatched agent runs\n" and done.stderr == ""
    second = _machine_row(caller, "again")
    assert second["connected"] is True and int(str(second["calls"])) == 2
    assert float(str(second["connected_at"])) > float(str(first["connected_at"]))  # a new connection


@ONE_PASS
@pytest.mark.parametrize("ssh_tier", SSH_TIERS, indirect=True)
def test_a_host_key_changed_or_removed_in_known_hosts_is_refused_at_once(remote: Remote, tmp_path: Path) -> None:
    """SSH tiers only: wb checks host keys on its own SSH channel (over exec, the command does)."""
    sshd = remote.factory
    server = sshd.start("127.0.0.4")
    prepare_remote(server)
    known_hosts = tmp_path / "known_hosts"
    good = sshd.known_hosts_line(server)
    known_hosts.write_text(good)
    client_config = sshd.write_client_config(f"client-{tmp_path.name}", known_hosts=known_hosts)
    config = sshd.write_wb_config("rekey", {"rekey": sshd.target(server)})
    caller = _caller(remote.base / "rekey", config, client_config)
    assert caller.wb("agent", "list", "--to", "rekey").returncode == 0
    assert _machine_row(caller, "rekey")["connected"] is True
    other = " ".join(keygen(tmp_path / "other_key").split()[:2])
    known_hosts.write_text(f"[{server.host}]:{server.port} {other}\n")
    started = time.monotonic()
    done = caller.wb("agent", "list", "--to", "rekey")
    assert done.returncode == 255 and done.stdout == ""
    assert "the host key has CHANGED" in done.stderr and "ssh-keygen -R" in done.stderr
    assert time.monotonic() - started < 10
    cold = caller.wb("agent", "list", "--to", "rekey", env=OFF)
    assert (cold.returncode, cold.stderr) == (done.returncode, done.stderr)
    known_hosts.write_text("")
    done = caller.wb("agent", "list", "--to", "rekey")
    assert done.returncode == 255 and "the host key is unknown" in done.stderr
    known_hosts.write_text(good)
    assert caller.wb("agent", "list", "--to", "rekey").returncode == 0


# --------------------------------------------------------------------------- the serve process itself


def _serve(env: dict[str, str], cwd: Path | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "courier.main", "--wb-internal-agent-serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=cwd,
    )


def _close_pipes(process: subprocess.Popen[bytes]) -> None:
    for pipe in (process.stdin, process.stdout, process.stderr):
        if pipe is not None:
            pipe.close()


def _read_line(process: subprocess.Popen[bytes], timeout: float = 30) -> dict[str, object]:
    assert process.stdout is not None
    result: list[bytes] = []
    reader = threading.Thread(target=lambda: result.append(process.stdout.readline()))  # type: ignore[union-attr]
    reader.start()
    reader.join(timeout)
    assert result and result[0], "no reply line"
    document = json.loads(result[0])
    assert isinstance(document, dict)
    return document


def test_serve_mode_answers_requests_concurrently_by_request_id_and_ends_at_eof(machine: Machine) -> None:
    machine.clone()
    ref = machine.dispatch(task="scenario:hang")
    process = _serve(machine.env)
    assert process.stdin is not None
    try:
        process.stdin.write(
            json.dumps(
                {
                    "request_id": "slow",
                    "schema_version": 1,
                    "operation": "await",
                    "agent_id": ref,
                    "wait_timeout_ms": 3000,
                }
            ).encode()
            + b"\n"
        )
        process.stdin.write(b'{"request_id":"v","schema_version":1,"operation":"version"}\n')
        process.stdin.write(b'{"request_id":"bad","schema_version":"1","operation":"version"}\n')
        process.stdin.flush()
        replies = [_read_line(process), _read_line(process), _read_line(process, 60)]
    finally:
        process.stdin.close()
    # The await was sent first and answers last: the other two did not wait for it.
    assert [reply["request_id"] for reply in replies][2] == "slow"
    by_id = {reply["request_id"]: reply for reply in replies}
    assert by_id["v"]["operation"] == "version" and "serve" in by_id["v"]["capabilities"]  # type: ignore[operator]
    assert by_id["bad"]["failure_kind"] == "request"
    assert by_id["slow"]["result"]["state"] == "running"  # type: ignore[index]
    assert process.wait(timeout=30) == 0
    _close_pipes(process)
    machine.wb("agent", "stop", ref)


@ONE_PASS
def test_serve_mode_exits_when_its_wb_is_upgraded(tmp_path: Path, machine: Machine) -> None:
    copy = tmp_path / "installed"
    for package in ("courier", "protocol"):
        shutil.copytree(REPO_ROOT / package, copy / package, ignore=shutil.ignore_patterns("__pycache__"))
    process = _serve({**machine.env, "PYTHONPATH": str(copy)}, cwd=tmp_path)
    assert process.stdin is not None
    try:
        process.stdin.write(b'{"request_id":"v","schema_version":1,"operation":"version"}\n')
        process.stdin.flush()
        assert _read_line(process)["request_id"] == "v"
        (copy / "courier" / "__init__.py").write_text('"""wb."""\n\n__version__ = "99.0.0"\n')
        assert process.wait(timeout=30) == 0  # stdin is still open: the upgrade alone ended it
    finally:
        process.stdin.close()
        if process.poll() is None:
            process.kill()
        process.wait()
        _close_pipes(process)


@ONE_PASS
def test_serve_mode_imports_nothing_heavy(tmp_path: Path) -> None:
    """The serve mode is the remote entry of the warm path: as light as the one-call receiver."""
    record = tmp_path / "modules.txt"
    program = wb_recording_modules(record, ["--wb-internal-agent-serve"])
    requests = b"".join(
        json.dumps({"request_id": f"r{index}", "schema_version": 1, "operation": operation}).encode() + b"\n"
        for index, operation in enumerate(("version", "list", "status"))
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "WB_HOME": str(tmp_path / "home"),
        "WB_CONFIG": str(tmp_path / "wb.yaml"),
        "PYTHONPATH": str(REPO_ROOT),
    }
    done = subprocess.run([sys.executable, "-c", program], input=requests, capture_output=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    replies = {json.loads(line)["request_id"]: json.loads(line) for line in done.stdout.splitlines()}
    assert set(replies) == {"r0", "r1", "r2"} and replies["r1"]["results"] == []
    modules = {name.split(".")[0] for name in record.read_text().split()}
    assert not modules & {"asyncssh", "typer", "rich", "click", "yaml", "cryptography"}
