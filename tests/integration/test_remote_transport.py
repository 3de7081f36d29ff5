"""The SSH transport against a loopback SSH server (docs/protocol.md): no mocks between client and server.

Each test runs over both SSH tiers (tests/ssh_tiers.py): an in-process asyncssh server, then a
real OpenSSH sshd. The remote `wb` is this checkout's console script, run by the server as
another machine with its own WB_HOME (sshd's SetEnv). Hostile or broken remotes are fake
`wb_path` scripts.
The client reads the fixture's ssh config through WB_SSH_CONFIG, never ~/.ssh.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from courier import __version__
from courier.call import caller as client
from courier.channels import ssh_client as ssh
from courier.channels.ssh import pooled
from courier.config import Config, load_config
from courier.errors import (
    AuthFailed,
    CallTimedOut,
    ConnectFailed,
    ConnectionLost,
    HostKeyChanged,
    HostKeyConfigRefused,
    HostKeyUnknown,
    RemoteWbMissing,
    ReplyUntrusted,
    SchemaSkew,
    TransportError,
    UsageError,
)
from protocol.models import RemoteRequest
from tests.integration.inprocess_sshd import keygen
from tests.integration.sshd import free_port
from tests.ssh_tiers import SshMachine, SshMachines

RUN_ID = "agt-" + "5e" * 16
VERSION = RemoteRequest(schema_version=1, operation="version")
LIST = RemoteRequest(schema_version=1, operation="list")
REAL_WB = Path(sys.executable).parent / "wb"
# The caller is this process's own client and each remote wb a private entry: no command here goes
# through the courier, so the suite's WB_COURIER=on pass runs this module for both (tests/conftest.py).
pytestmark = pytest.mark.courier_independent


@pytest.fixture(scope="module")
def sshd(ssh_machines: SshMachines) -> SshMachines:
    """This module's machines: each test runs over both SSH tiers."""
    return ssh_machines


@pytest.fixture(scope="module")
def server(sshd: SshMachines) -> SshMachine:
    return sshd.start("127.0.0.1")


@pytest.fixture(autouse=True)
def client_env(sshd: SshMachines, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ssh.CONFIG_ENV, str(sshd.client_config))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.delenv(ssh.KEEPALIVE_ENV, raising=False)


_names = iter(range(1_000_000))


def config_for(sshd: SshMachines, server: SshMachine, machine: str = "m1", **extra: Any) -> Config:
    return load_config(sshd.write_wb_config(f"wb{next(_names)}", {machine: sshd.target(server, **extra)}))


def call_fake(sshd: SshMachines, server: SshMachine, body: str, request: RemoteRequest = VERSION, **kwargs: Any) -> Any:
    """Call through a target whose wb_path is a `#!/bin/sh` script with this body."""
    script = server.script(f"fake{next(_names)}", body)
    return client.call(config_for(sshd, server, wb_path=str(script)), "m1", request, **kwargs)


def document(**fields: Any) -> str:
    """A shell-quoted JSON document for `printf '%s\\n'`."""
    return shlex.quote(json.dumps({"schema_version": 1, "operation": "version", **fields}))


# --- round trips through the real remote wb ---------------------------------------------


def test_version_round_trip_reports_the_remote_home(sshd: SshMachines, server: SshMachine) -> None:
    """The remote wb answers version with its version, its clock and the ID stored in its own WB_HOME."""
    response = client.call(config_for(sshd, server), "m1", VERSION)
    assert response.failure == ""
    assert response.wb_version == __version__
    assert response.now and response.now.endswith("Z")
    assert response.home_id == (server.wb_home / "home-id").read_text().strip()


def test_list_on_an_empty_home_returns_no_results(sshd: SshMachines, server: SshMachine) -> None:
    response = client.call(config_for(sshd, server), "m1", LIST)
    assert (response.failure, response.results_of(), response.home_id) == ("", [], response.home_id)
    assert response.home_id


def test_an_unknown_run_is_an_in_band_refusal_not_an_exception(sshd: SshMachines, server: SshMachine) -> None:
    request = RemoteRequest(schema_version=1, operation="status", agent_id=RUN_ID)
    response = client.call(config_for(sshd, server), "m1", request)
    assert response.operation == "status"
    assert response.failure_kind == "not_found"
    assert RUN_ID in response.failure


def test_one_connection_serves_several_calls_and_machines_run_concurrently(
    sshd: SshMachines, server: SshMachine
) -> None:
    """The fleet shape: one connection per host reused, several hosts at once, each with its own home."""
    others = [sshd.start(host) for host in ("127.0.0.2", "127.0.0.3")]
    targets = {f"m{i}": sshd.target(s) for i, s in enumerate([server, *others])}
    config = load_config(sshd.write_wb_config("fleet", targets))

    async def scenario() -> tuple[list[str | None], list[str]]:
        async with pooled() as pool:
            first = await client.call_async(config, "m0", VERSION)
            second = await client.call_async(config, "m0", LIST)
            assert len(pool.peers) == 1  # both calls went over one connection
        replies = await asyncio.gather(*(client.call_async(config, name, VERSION) for name in targets))
        return [first.home_id, second.home_id], [reply.home_id or "" for reply in replies]

    reused, fleet = asyncio.run(scenario())
    assert reused[0] == reused[1] is not None
    assert len(set(fleet)) == 3 and fleet[0] == reused[0]


# --- the receiver's own rules (serve, through a subprocess) --------------------------------


def run_receiver(tmp_path: Path, stdin: bytes) -> tuple[int, list[dict[str, Any]], bytes]:
    env = {**os.environ, "WB_HOME": str(tmp_path / "home"), "WB_CONFIG": str(tmp_path / "none.yaml")}
    done = subprocess.run(
        [str(REAL_WB), "--wb-internal-agent-remote"], input=stdin, capture_output=True, env=env, timeout=60
    )
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    return done.returncode, lines, done.stderr


def test_receiver_refuses_an_invalid_request_in_band(tmp_path: Path) -> None:
    code, docs, _ = run_receiver(tmp_path, b'{"schema_version":1,"operation":"status","agent_id":"../x"}')
    assert code == 0 and len(docs) == 1
    assert docs[0]["failure_kind"] == "request" and docs[0]["operation"] == "status"
    assert 'invalid agent run ID "../x"' in docs[0]["failure"]
    code, docs, _ = run_receiver(tmp_path, b"not json at all")
    assert code == 0 and docs[0]["operation"] == "" and docs[0]["failure_kind"] == "request"
    assert "home_id" in docs[0] and "now" in docs[0]


def test_receiver_drains_and_refuses_a_request_over_8_mib(tmp_path: Path) -> None:
    code, docs, _ = run_receiver(tmp_path, b" " * (8 * 1024 * 1024 + 1))
    assert code == 0 and len(docs) == 1
    assert docs[0]["failure"] == "request exceeds 8388608 bytes"
    assert docs[0]["failure_kind"] == "request" and docs[0]["operation"] == ""


def test_receiver_refusal_with_empty_operation_reaches_the_caller(sshd: SshMachines, server: SshMachine) -> None:
    """A peer that could not parse the request answers with an empty operation: a refusal, not a mismatch."""
    body = f"cat >/dev/null; printf '%s\\n' {document(operation='', failure='bad request', failure_kind='request')}\n"
    response = call_fake(sshd, server, body)
    assert (response.failure, response.failure_kind) == ("bad request", "request")


# --- before connecting -----------------------------------------------------------------------


def test_invalid_request_and_unknown_machine_fail_before_connecting(sshd: SshMachines) -> None:
    nobody = load_config(sshd.write_wb_config("nobody", {"m1": {"host": "127.0.0.1", "port": free_port("127.0.0.1")}}))
    with pytest.raises(UsageError, match='invalid agent run ID "agt-X"'):
        client.call(nobody, "m1", RemoteRequest(schema_version=1, operation="status", agent_id="agt-X"))
    with pytest.raises(UsageError, match='unknown machine "m9": configured machines: m1'):
        client.call(nobody, "m9", VERSION)


# --- connection failures -----------------------------------------------------------------------


def test_unknown_host_key_is_refused_with_its_remedy(sshd: SshMachines) -> None:
    stranger = sshd.start("127.0.0.1", remember_key=False)
    with pytest.raises(HostKeyUnknown) as caught:
        client.call(config_for(sshd, stranger), "m1", VERSION)
    error = caught.value
    assert error.exit_code == 255 and error.cause == "unknown host key"
    assert error.message.startswith(f"m1 (127.0.0.1:{stranger.port}): the host key is unknown")
    assert f"ssh -p {stranger.port} 127.0.0.1" in error.message
    assert "ssh-keygen -R" not in error.message


def test_changed_host_key_is_refused_with_a_different_remedy(
    sshd: SshMachines, server: SshMachine, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = keygen(sshd.base / f"impostor{next(_names)}")
    known = sshd.base / f"known_changed{next(_names)}"
    known.write_text(f"[127.0.0.1]:{server.port} {' '.join(other.split()[:2])}\n")
    monkeypatch.setenv(ssh.CONFIG_ENV, str(sshd.write_client_config(f"cc{next(_names)}", known_hosts=known)))
    with pytest.raises(HostKeyChanged) as caught:
        client.call(config_for(sshd, server), "m1", VERSION)
    error = caught.value
    assert error.exit_code == 255 and error.cause == "changed host key"
    assert "host key has CHANGED" in error.message and error.message.startswith("m1 (127.0.0.1:")
    assert f"ssh-keygen -R '[127.0.0.1]:{server.port}' -f {known}" in error.message


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ("UserKnownHostsFile none", "disables host-key verification"),
        ("UserKnownHostsFile /dev/null", "UserKnownHostsFile to /dev/null"),
    ],
)
def test_a_config_that_disables_verification_is_refused(
    sshd: SshMachines, server: SshMachine, monkeypatch: pytest.MonkeyPatch, setting: str, expected: str
) -> None:
    path = sshd.base / f"cc{next(_names)}"
    path.write_text(f"Host *\n  {setting}\n  StrictHostKeyChecking no\n  IdentityFile {sshd.client_key}\n")
    monkeypatch.setenv(ssh.CONFIG_ENV, str(path))
    with pytest.raises(HostKeyConfigRefused) as caught:
        client.call(config_for(sshd, server), "m1", VERSION)
    assert expected in caught.value.message and caught.value.message.startswith("m1: ")
    assert "StrictHostKeyChecking in the ssh config is not honoured" in caught.value.message
    assert caught.value.exit_code == 255


def test_strict_host_key_checking_no_does_not_accept_an_unknown_key(
    sshd: SshMachines, monkeypatch: pytest.MonkeyPatch
) -> None:
    stranger = sshd.start("127.0.0.1", remember_key=False)
    monkeypatch.setenv(ssh.CONFIG_ENV, str(sshd.write_client_config(f"cc{next(_names)}", "StrictHostKeyChecking no\n")))
    with pytest.raises(HostKeyUnknown, match="StrictHostKeyChecking in the ssh config is not honoured"):
        client.call(config_for(sshd, stranger), "m1", VERSION)


def test_a_key_the_server_does_not_accept_is_an_auth_failure(
    sshd: SshMachines, server: SshMachine, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrong = sshd.base / f"wrong_key{next(_names)}"
    keygen(wrong)
    path = sshd.write_client_config(f"cc{next(_names)}")
    path.write_text(path.read_text().replace(str(sshd.client_key), str(wrong)))
    monkeypatch.setenv(ssh.CONFIG_ENV, str(path))
    with pytest.raises(AuthFailed) as caught:
        client.call(config_for(sshd, server), "m1", VERSION)
    assert caught.value.message.startswith(f"m1 (127.0.0.1:{server.port}): authentication as root was refused")
    assert caught.value.cause == "auth" and caught.value.exit_code == 255


def test_no_sshd_listening_is_a_connect_failure_naming_the_machine(sshd: SshMachines) -> None:
    port = free_port("127.0.0.1")
    config = load_config(sshd.write_wb_config(f"wb{next(_names)}", {"gpu-box": {"host": "127.0.0.1", "port": port}}))
    with pytest.raises(ConnectFailed) as caught:
        client.call(config, "gpu-box", VERSION)
    assert caught.value.message == (
        f"gpu-box (127.0.0.1:{port}): connection refused: is sshd running there on port {port}?"
    )
    assert caught.value.cause == "refused" and caught.value.exit_code == 255


# --- the remote command ---------------------------------------------------------------------------


def test_wb_path_pointing_nowhere_says_how_to_fix_it(sshd: SshMachines, server: SshMachine) -> None:
    config = config_for(sshd, server, "gpu-box", wb_path="/nonexistent/bin/wb")
    with pytest.raises(RemoteWbMissing) as caught:
        client.call(config, "gpu-box", VERSION)
    assert caught.value.message == (
        "wb is not installed on gpu-box (or not on the PATH of a non-interactive shell); "
        "set session_move.targets.gpu-box.ssh.wb_path"
    )
    assert caught.value.exit_code == 255


def test_wb_path_not_executable_is_exit_126(sshd: SshMachines, server: SshMachine) -> None:
    script = server.script(f"noexec{next(_names)}", "exit 0\n")
    script.chmod(0o644)
    with pytest.raises(TransportError, match=f"{script} is not executable") as caught:
        client.call(config_for(sshd, server, wb_path=str(script)), "m1", VERSION)
    assert caught.value.exit_code == 255


def test_a_crashing_remote_gives_a_one_line_stderr_excerpt(sshd: SshMachines, server: SshMachine) -> None:
    with pytest.raises(TransportError) as caught:
        call_fake(sshd, server, "cat >/dev/null; echo 'Traceback:' >&2; printf 'Boom\\033[2J\\n' >&2; exit 3\n")
    assert caught.value.message.startswith("m1: the remote")
    assert caught.value.message.endswith("exited with status 3: Traceback: Boom [2J")
    assert caught.value.cause == "remote crashed" and caught.value.exit_code == 255


def test_shell_noise_before_the_document_is_tolerated(sshd: SshMachines, server: SshMachine) -> None:
    body = f"echo 'Welcome to gpu-box!'; echo '{{ motd in braces'; exec {REAL_WB} \"$@\"\n"
    response = call_fake(sshd, server, body)
    assert response.wb_version == __version__ and response.failure == ""


def test_the_task_travels_on_stdin_never_on_the_command_line(sshd: SshMachines, server: SshMachine) -> None:
    marker = f"secret-task-text-{next(_names)}"
    record = server.root / f"argv{next(_names)}"
    body = (
        f'cat > {record}.stdin\nprintf \'%s\\n\' "$0" "$@" > {record}\n'
        f'ps -o args= -p $$ >> {record}.ps\nexec {REAL_WB} "$@" < {record}.stdin\n'
    )
    request = RemoteRequest(
        schema_version=1,
        operation="dispatch",
        mode="new",
        worktree="w1",
        profile="fast",
        task=marker,
        repository="acme/widget",
        timeout_ms=60_000,
        agent_id=RUN_ID,
    )
    response = call_fake(sshd, server, body, request)
    assert response.operation == "dispatch" and response.failure  # refused remotely: no such profile there
    argv = record.read_text().splitlines()
    assert argv[1:] == ["--wb-internal-agent-remote"]
    assert marker not in record.read_text() and marker not in Path(f"{record}.ps").read_text()
    assert json.loads(Path(f"{record}.stdin").read_bytes())["task"] == marker


def test_request_tty_and_forward_agent_in_the_config_are_not_honoured(
    sshd: SshMachines, server: SshMachine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No PTY and no agent forwarding whatever the user's config says; the JSON stays intact."""
    agent_dir = sshd.base / f"agent{next(_names)}"
    agent_dir.mkdir(mode=0o700)
    sock = agent_dir / "sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        env = {**os.environ, "SSH_AUTH_SOCK": str(sock)}
        for _ in range(200):
            if subprocess.run(["ssh-add", str(sshd.client_key)], env=env, capture_output=True).returncode == 0:
                break
            asyncio.run(asyncio.sleep(0.02))  # the agent's socket appears shortly after it starts
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        config_path = sshd.write_client_config(f"cc{next(_names)}", "RequestTTY force\nForwardAgent yes\n")
        monkeypatch.setenv(ssh.CONFIG_ENV, str(config_path))
        record = server.root / f"tty{next(_names)}"
        body = (
            f"if [ -t 0 ] || [ -t 1 ]; then echo tty > {record}; else echo notty > {record}; fi\n"
            f'echo "agent=${{SSH_AUTH_SOCK:-}}" >> {record}\nexec {REAL_WB} "$@"\n'
        )
        log_before = len(server.log())
        response = call_fake(sshd, server, body)
    finally:
        agent.terminate()
        agent.wait(timeout=10)
    assert response.wb_version == __version__
    assert record.read_text().splitlines() == ["notty", "agent="]
    session_log = server.log()[log_before:]
    assert "request exec" in session_log
    assert "pty-req" not in session_log and "auth-agent-req" not in session_log


# --- hostile and broken replies ------------------------------------------------------------------

HOSTILE = [
    ("garbage", "cat >/dev/null; echo 'hello world'\n", "no reply document found (it is not a JSON object)"),
    ("empty", "cat >/dev/null\n", "the reply is empty"),
    ("trailing", f"cat >/dev/null; printf '%s trailing\\n' {document()}\n", "trailing garbage"),
    ("nested", "cat >/dev/null; head -c 100000 /dev/zero | tr '\\0' '['\n", "not a JSON object"),
    (
        "nested-in-object",
        "cat >/dev/null; printf '{\"schema_version\":1,\"x\":'; head -c 100000 /dev/zero | tr '\\0' '['; echo\n",
        "nested deeper than 64 levels",
    ),
    ("huge-integer", f'cat >/dev/null; printf \'{{"schema_version":1,"n":%s}}\\n\' {"7" * 5000}\n', "5000 digits"),
    ("nan", 'cat >/dev/null; echo \'{"schema_version":1,"operation":"version","x":NaN}\'\n', "NaN"),
    ("mismatch", f"cat >/dev/null; printf '%s\\n' {document(operation='list')}\n", 'answered operation "list"'),
]


@pytest.mark.parametrize(("body", "expected"), [(b, e) for _, b, e in HOSTILE], ids=[n for n, _, _ in HOSTILE])
def test_a_hostile_or_broken_reply_is_untrusted(
    sshd: SshMachines, server: SshMachine, body: str, expected: str
) -> None:
    with pytest.raises(ReplyUntrusted) as caught:
        call_fake(sshd, server, body)
    assert caught.value.message.startswith("m1: ")
    assert expected in caught.value.message
    assert caught.value.exit_code == 255


@pytest.mark.parametrize(("version", "remedy"), [(0, "upgrade wb on m1"), (2, "upgrade wb here")])
def test_schema_skew_names_who_must_upgrade(sshd: SshMachines, server: SshMachine, version: int, remedy: str) -> None:
    doc = shlex.quote(json.dumps({"schema_version": version, "operation": "version"}))
    with pytest.raises(SchemaSkew) as caught:
        call_fake(sshd, server, f"cat >/dev/null; printf '%s\\n' {doc}\n")
    assert caught.value.message == f"m1 speaks protocol schema {version}, this wb speaks 1: {remedy}"
    assert caught.value.exit_code == 255


def test_a_reply_over_4_mib_is_cut_off(sshd: SshMachines, server: SshMachine) -> None:
    with pytest.raises(ReplyUntrusted, match="the reply exceeds 4194304 bytes"):
        call_fake(sshd, server, "cat >/dev/null; head -c 5242880 /dev/zero | tr '\\0' 'a'\n")


def test_an_endless_reply_is_cut_off_without_hanging(sshd: SshMachines, server: SshMachine) -> None:
    with pytest.raises(ReplyUntrusted, match="the reply exceeds 4194304 bytes"):
        call_fake(sshd, server, "cat >/dev/null; exec yes '{\"schema_version\":1}'\n", timeout_s=60)


def test_endless_stderr_is_cut_off(sshd: SshMachines, server: SshMachine) -> None:
    with pytest.raises(ReplyUntrusted, match="more than 65536 bytes on stderr"):
        call_fake(sshd, server, "cat >/dev/null; exec yes noise >&2\n", timeout_s=60)


def test_a_result_with_a_path_for_an_agent_id_is_untrusted(sshd: SshMachines, server: SshMachine) -> None:
    result = {
        "agent_id": "../x",
        "state": "completed",
        "profile": "p",
        "repository": "a/b",
        "worktree_mode": "new",
        "worktree": "w1",
        "started_at": "2026-01-02T03:04:05Z",
        "resolved": {
            "profile": "p",
            "harness": "codex",
            "provider": "x",
            "model": "m",
            "routing": {"base_url": "https://x", "wire_api": "responses"},
        },
    }
    doc = shlex.quote(json.dumps({"schema_version": 1, "operation": "status", "result": result}))
    request = RemoteRequest(schema_version=1, operation="status", agent_id=RUN_ID)
    with pytest.raises(ReplyUntrusted, match=re.escape('invalid agent run ID "../x"')):
        call_fake(sshd, server, f"cat >/dev/null; printf '%s\\n' {doc}\n", request)


# --- losing the peer mid-call ------------------------------------------------------------------------


def _session_sshd_of_script(pid_file: Path) -> tuple[psutil.Process, psutil.Process]:
    script = psutil.Process(int(pid_file.read_text()))
    parent = script.parent()
    assert parent is not None and "sshd" in parent.name()
    return script, parent


def _quietly(action: Callable[..., None], *args: Any) -> None:
    """Signal a process that may already have exited (its session ended with the connection)."""
    with contextlib.suppress(psutil.NoSuchProcess):
        action(*args)


async def _when_file_appears(path: Path, task: asyncio.Task[Any]) -> None:
    while not (path.exists() and path.read_text().strip()):
        if task.done():
            task.result()
            raise AssertionError("the call finished before the remote started")
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("ssh_tier", ["openssh"], indirect=True)
def test_the_session_sshd_killed_mid_call_is_a_lost_connection(sshd: SshMachines, server: SshMachine) -> None:
    """OpenSSH only: the process killed is the session's own sshd, the parent of the remote command."""
    pid_file = server.root / f"pid{next(_names)}"
    script = server.script(
        f"hang{next(_names)}", f"echo $$ > {pid_file}.tmp; mv {pid_file}.tmp {pid_file}; exec sleep 120\n"
    )
    config = config_for(sshd, server, wb_path=str(script))

    async def scenario() -> BaseException | None:
        task = asyncio.ensure_future(client.call_async(config, "m1", VERSION, timeout_s=60))
        await _when_file_appears(pid_file, task)
        sleeper, session = _session_sshd_of_script(pid_file)
        session.kill()
        try:
            await task
        except TransportError as exc:
            return exc
        finally:
            _quietly(sleeper.kill)
        return None

    error = asyncio.run(scenario())
    assert isinstance(error, ConnectionLost), error
    assert error.message.startswith(f"m1 (127.0.0.1:{server.port}): ")
    assert error.exit_code == 255


@pytest.mark.parametrize("ssh_tier", ["openssh"], indirect=True)
def test_a_frozen_session_is_detected_by_keepalive(
    sshd: SshMachines, server: SshMachine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenSSH only: the session's sshd processes are frozen (SIGSTOP), a thing no in-process server can be."""
    monkeypatch.setenv(ssh.KEEPALIVE_ENV, "0.5")
    pid_file = server.root / f"pid{next(_names)}"
    script = server.script(
        f"hang{next(_names)}", f"echo $$ > {pid_file}.tmp; mv {pid_file}.tmp {pid_file}; exec sleep 120\n"
    )
    config = config_for(sshd, server, wb_path=str(script))

    async def scenario() -> tuple[BaseException | None, float]:
        task = asyncio.ensure_future(client.call_async(config, "m1", VERSION, timeout_s=60))
        await _when_file_appears(pid_file, task)
        sleeper, session = _session_sshd_of_script(pid_file)
        frozen = [session, *[p for p in server.session_processes() if p.pid != session.pid and "sshd" in p.name()]]
        for process in frozen:
            _quietly(process.send_signal, signal.SIGSTOP)
        started = asyncio.get_running_loop().time()
        try:
            await task
        except TransportError as exc:
            return exc, asyncio.get_running_loop().time() - started
        finally:
            for process in frozen:
                _quietly(process.send_signal, signal.SIGCONT)
                _quietly(process.kill)
            _quietly(sleeper.kill)
        return None, 0.0

    error, elapsed = asyncio.run(scenario())
    assert isinstance(error, ConnectionLost), error
    assert "stopped answering keepalives" in error.message
    assert elapsed < 30


def test_the_whole_call_is_bounded(sshd: SshMachines, server: SshMachine) -> None:
    with pytest.raises(CallTimedOut) as caught:
        call_fake(sshd, server, "exec sleep 60\n", timeout_s=1.5)
    assert caught.value.message.startswith("m1 (127.0.0.1:") and "within 1.5s" in caught.value.message
    assert caught.value.cause == "timeout"
