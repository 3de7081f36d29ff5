"""`wb demo` as a user runs it: a subprocess, an empty HOME, and nothing left behind.

The stand-in path runs with a PATH that holds only git (so no `codex` is found); the
real-Codex path runs when `codex` is installed (scripts/install-codex.sh puts it in
/usr/bin). The embedded SSH server is also checked on its own: it serves the receiver and
refuses everything else.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import json
import os
import pty
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import asyncssh
import psutil
import pytest
from conftest import REPO_ROOT, require_cli

from courier.demo.sshd import EmbeddedSshd, new_key

DEMO_BOUND_S = 60.0
# `wb demo` always runs cold (its sandbox sets WB_COURIER=off): the WB_COURIER=off pass alone runs
# this module, so the two passes weigh about the same (tests/conftest.py).
pytestmark = pytest.mark.courier_independent(cold=True)
STANDIN_NOTICE = "codex not found on PATH: using the bundled stand-in"


def _bin_without_codex(base: Path) -> Path:
    """A PATH directory with git and nothing else (/bin is /usr/bin here, which may hold codex)."""
    bin_dir = base / "bin"
    bin_dir.mkdir()
    git = shutil.which("git")
    assert git is not None, "git is needed"
    (bin_dir / "git").symlink_to(git)
    return bin_dir


def _env(base: Path, path: str) -> dict[str, str]:
    home = base / "home"
    home.mkdir()
    tmp = base / "tmp"
    tmp.mkdir()
    return {
        "HOME": str(home),
        "PATH": path,
        "LANG": "C.UTF-8",
        "TMPDIR": str(tmp),
        "PYTHONPATH": str(REPO_ROOT),
    }


def _leftovers(marker: str) -> list[psutil.Process]:
    """Live processes whose argv, cwd or WB_HOME mention `marker`."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "cwd"]):
        if proc.pid == os.getpid():
            continue
        try:
            text = " ".join(proc.info["cmdline"] or []) + " " + (proc.info["cwd"] or "")
            if marker not in text:
                text = proc.environ().get("WB_HOME", "")
            if marker in text and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


@pytest.fixture
def base(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    for proc in _leftovers(str(tmp_path)):
        with contextlib.suppress(psutil.Error):
            proc.kill()


def _run_demo(
    env: dict[str, str], stderr: int = subprocess.PIPE, *args: str
) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "courier.main", "demo", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        env=env,
        cwd=env["HOME"],
        timeout=DEMO_BOUND_S + 30,
    )
    return done, time.monotonic() - started


def _assert_clean(base: Path, env: dict[str, str]) -> None:
    home = Path(env["HOME"])
    for name in (".ssh", ".wb", ".config/wb"):
        assert not (home / name).exists(), f"the demo created ~/{name}"
    assert list(home.iterdir()) == [], "the demo wrote into HOME"
    assert list(Path(env["TMPDIR"]).iterdir()) == [], "the demo sandbox was not removed"
    assert _leftovers(str(base)) == [], "demo processes were left running"


def _assert_completed(stdout: str) -> str:
    refs = re.findall(r"demo:agt-[0-9a-f]{32}", stdout)
    assert refs, stdout
    lines = stdout.splitlines()
    assert "  state:    completed" in lines, stdout
    assert "  result:   Created hello.txt." in lines, stdout
    assert "  changed:  hello.txt" in lines, stdout
    assert "    ran: /bin/bash -lc ls" in lines, stdout  # from `wb agent logs`
    assert any(line.startswith(f"  {refs[0]}\tcompleted\tdemo\t") for line in lines), stdout  # `list --all`
    assert "done in " in stdout
    return str(refs[0])


def test_the_demo_runs_with_the_standin_harness_and_leaves_nothing_behind(base: Path) -> None:
    env = _env(base, str(_bin_without_codex(base)))
    done, elapsed = _run_demo(env)

    assert done.returncode == 0, done.stdout + done.stderr
    assert elapsed < DEMO_BOUND_S
    assert STANDIN_NOTICE in done.stdout
    _assert_completed(done.stdout)
    assert "machine  demo at 127.0.0.1:" in done.stdout
    assert done.stderr == ""  # not a terminal: no progress line
    _assert_clean(base, env)


def _path_with_real(base: Path, name: str, version: str) -> str:
    """A PATH holding the real pinned CLI (and node, for its npm launcher), none of the other agents."""
    real = require_cli(name, version, install=f"run `bash scripts/install-{name}.sh` (CI installs it)")
    return os.pathsep.join([str(_bin_without_codex(base)), *real.dirs])


def test_the_demo_uses_the_real_codex_when_it_is_on_path(base: Path) -> None:
    env = _env(base, _path_with_real(base, "codex", "0.169.0"))
    done, elapsed = _run_demo(env)

    assert done.returncode == 0, done.stdout + done.stderr
    assert elapsed < DEMO_BOUND_S
    assert "harness  real Codex " in done.stdout and STANDIN_NOTICE not in done.stdout
    _assert_completed(done.stdout)
    assert "diagnostic:" not in done.stdout  # Codex's home is not under the machine's TMPDIR: no warning
    _assert_clean(base, env)


GEMINI_STANDIN_NOTICE = "gemini not found on PATH: using the bundled stand-in"


def _assert_gemini_completed(stdout: str) -> None:
    refs = re.findall(r"demo:agt-[0-9a-f]{32}", stdout)
    assert refs, stdout
    lines = stdout.splitlines()
    assert "  state:    completed" in lines, stdout
    assert "  resolved: gemini demo/gemini-2.5-pro" in lines, stdout
    assert "  result:   Created hello.txt with a greeting." in lines, stdout
    assert "  changed:  hello.txt" in lines, stdout
    assert "  usage:    input 6900 (cached 4200), output 115" in lines, stdout
    assert "    ran: ls" in lines and "    changed 1 file" in lines, stdout  # from `wb agent logs`
    assert any(line.startswith(f"  {refs[0]}\tcompleted\tdemo\tgemini-2.5-pro\t") for line in lines), stdout
    assert "diagnostic:" not in stdout


def test_the_demo_runs_gemini_with_its_standin(base: Path) -> None:
    env = _env(base, str(_bin_without_codex(base)))
    done, elapsed = _run_demo(env, subprocess.PIPE, "--harness", "gemini")
    assert done.returncode == 0, done.stdout + done.stderr
    assert elapsed < DEMO_BOUND_S
    assert GEMINI_STANDIN_NOTICE in done.stdout
    _assert_gemini_completed(done.stdout)
    _assert_clean(base, env)


def test_the_demo_uses_the_real_gemini_when_it_is_on_path(base: Path) -> None:
    env = _env(base, _path_with_real(base, "gemini", "0.61.0"))
    done, elapsed = _run_demo(env, subprocess.PIPE, "--harness", "gemini")
    assert done.returncode == 0, done.stdout + done.stderr
    assert elapsed < DEMO_BOUND_S
    assert "harness  real Gemini CLI 0.61.0 " in done.stdout and GEMINI_STANDIN_NOTICE not in done.stdout
    _assert_gemini_completed(done.stdout)
    _assert_clean(base, env)  # the CLI's home was the run's private one: nothing in HOME or TMPDIR


CLAUDE_STANDIN_NOTICE = "claude not found on PATH: using the bundled stand-in"


def _assert_claude_completed(stdout: str) -> None:
    refs = re.findall(r"demo:agt-[0-9a-f]{32}", stdout)
    assert refs, stdout
    lines = stdout.splitlines()
    assert "  state:    completed" in lines, stdout
    assert "  resolved: claude demo/claude-sonnet-4-5" in lines, stdout
    assert "  result:   Created hello.txt." in lines, stdout
    assert "  changed:  hello.txt" in lines, stdout
    assert any(line.startswith("  usage:    input 8500 (cached 3200), output 112, cost $") for line in lines), stdout
    assert "    ran: ls" in lines and "    changed 1 file" in lines, stdout
    assert any(line.startswith(f"  {refs[0]}\tcompleted\tdemo\tclaude-sonnet-4-5\t") for line in lines), stdout


def test_the_demo_runs_claude_with_its_standin(base: Path) -> None:
    env = _env(base, str(_bin_without_codex(base)))
    done, elapsed = _run_demo(env, subprocess.PIPE, "--harness", "claude")
    assert done.returncode == 0, done.stdout + done.stderr
    assert elapsed < DEMO_BOUND_S
    assert CLAUDE_STANDIN_NOTICE in done.stdout
    _assert_claude_completed(done.stdout)
    _assert_clean(base, env)


def test_the_demo_uses_the_real_claude_when_it_is_on_path(base: Path) -> None:
    env = _env(base, _path_with_real(base, "claude", "2.1.328"))
    done, elapsed = _run_demo(env, subprocess.PIPE, "--harness", "claude")
    assert done.returncode == 0, done.stdout + done.stderr
    assert elapsed < DEMO_BOUND_S
    assert "harness  real Claude Code 2.1.328 " in done.stdout and CLAUDE_STANDIN_NOTICE not in done.stdout
    _assert_claude_completed(done.stdout)
    _assert_clean(base, env)


def test_an_unknown_demo_harness_is_refused_before_anything_is_made(base: Path) -> None:
    env = _env(base, str(_bin_without_codex(base)))
    done, _ = _run_demo(env, subprocess.PIPE, "--harness", "aider")
    assert done.returncode == 2
    assert done.stderr == 'error: --harness must be one of claude, codex, gemini, not "aider"\n'
    assert done.stdout == ""
    _assert_clean(base, env)


def test_on_a_terminal_the_await_shows_a_progress_line_on_stderr(base: Path) -> None:
    env = _env(base, str(_bin_without_codex(base)))
    leader, follower = pty.openpty()
    captured = bytearray()

    def read() -> None:
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:
                return
            if not chunk:
                return
            captured.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        done, _ = _run_demo(env, stderr=follower)
    finally:
        os.close(follower)
        reader.join(timeout=5)
        os.close(leader)
    assert done.returncode == 0, done.stdout
    text = captured.decode("utf-8", "replace")
    assert "\r\x1b[K" in text and "demo:agt-" in text  # redrawn in place, naming the run
    assert text.rstrip().endswith("\x1b[K")  # and cleared when the await returned
    assert "\r" not in done.stdout
    _assert_clean(base, env)


# --------------------------------------------------------------------------- the embedded server


@pytest.fixture
def sshd(base: Path) -> Iterator[tuple[EmbeddedSshd, asyncssh.SSHKey]]:
    client_key = new_key()
    home = base / "wbhome"
    env = {"HOME": str(base), "PATH": os.environ["PATH"], "WB_HOME": str(home), "PYTHONPATH": str(REPO_ROOT)}
    server = EmbeddedSshd(user=getpass.getuser(), client_key=client_key, wb_path="wb", env=env, cwd=str(base))
    server.start()
    try:
        yield server, client_key
    finally:
        server.stop()


async def _connect(server: EmbeddedSshd, key: asyncssh.SSHKey, user: str) -> asyncssh.SSHClientConnection:
    return await asyncssh.connect(
        server.host,
        server.port,
        username=user,
        client_keys=[key],
        known_hosts=asyncssh.import_known_hosts(server.host_key_line + "\n"),
        agent_path=None,
        config=None,
        password=None,
        kbdint_auth=False,
        gss_auth=False,
    )


def test_the_embedded_server_runs_the_receiver_and_refuses_everything_else(
    sshd: tuple[EmbeddedSshd, asyncssh.SSHKey],
) -> None:
    server, key = sshd
    user = getpass.getuser()

    async def scenario() -> None:
        async with await _connect(server, key, user) as conn:
            request = json.dumps({"schema_version": 1, "operation": "version"})
            done = await conn.run("wb --wb-internal-agent-remote", input=request, check=False)
            assert done.exit_status == 0, done.stderr
            reply = json.loads(str(done.stdout))
            assert reply["operation"] == "version" and reply["schema_version"] == 1

            other = await conn.run("id", check=False)
            assert other.exit_status == 1 and "only runs the wb receiver" in str(other.stderr)
            shell = await conn.run(check=False)  # no command: a shell
            assert shell.exit_status == 1
            with pytest.raises(asyncssh.ChannelOpenError):
                await conn.run("wb --wb-internal-agent-remote", request_pty="force", term_type="xterm", check=False)
            with pytest.raises(asyncssh.ChannelOpenError):
                await conn.create_connection(asyncssh.SSHTCPSession, "127.0.0.1", server.port)
            with pytest.raises(asyncssh.ChannelListenError):
                await conn.forward_remote_port("127.0.0.1", 0, "127.0.0.1", 9)

        with pytest.raises(asyncssh.PermissionDenied):
            await _connect(server, new_key(), user)  # another key
        with pytest.raises(asyncssh.PermissionDenied):
            await _connect(server, key, user + "x")  # another user

    asyncio.run(scenario())
    assert "'id'" in server.refused


def test_ctrl_c_during_the_run_cleans_up_and_exits_130(base: Path) -> None:
    env = _env(base, str(_bin_without_codex(base)))
    process = subprocess.Popen(
        [sys.executable, "-m", "courier.main", "demo"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=env["HOME"],
        start_new_session=True,  # its own group, as a terminal's foreground job is
    )
    assert process.stdout is not None
    try:
        for line in process.stdout:
            if line.startswith("$ wb agent dispatch"):
                break
        os.killpg(process.pid, signal.SIGINT)
        _, stderr = process.communicate(timeout=DEMO_BOUND_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, stderr
    assert "interrupted; the demo sandbox was removed" in stderr
    _assert_clean(base, env)
