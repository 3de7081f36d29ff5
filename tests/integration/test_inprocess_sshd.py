"""The in-process SSH machines behave as an sshd machine does where the remote suites rely on it.

A plain asyncssh client (not wb's) checks what tests/integration/inprocess_sshd.py promises:
host and client keys verified, a command run by `sh -c` with the machine's own environment,
its exit status or signal reported, and, when the client goes away, the command left running
with its pipes closed (as sshd does without a PTY) until it notices.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncssh
import pytest
from conftest import pid_alive, wait_for

from tests.integration.inprocess_sshd import InProcessServer, InProcessSshdFactory
from tests.ssh_tiers import TIERS_ENV, selected_tiers

pytestmark = pytest.mark.courier_independent(cold=True)  # a plain asyncssh client: no wb command


@pytest.fixture(scope="module")
def factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessSshdFactory]:
    made = InProcessSshdFactory(tmp_path_factory.mktemp("inprocess"))
    try:
        yield made
    finally:
        made.close()


@pytest.fixture(scope="module")
def server(factory: InProcessSshdFactory) -> InProcessServer:
    return factory.start("127.0.0.7")


def _connect(factory: InProcessSshdFactory, server: InProcessServer, **kwargs: object) -> Any:
    options: dict[str, Any] = {
        "username": "root",
        "client_keys": [str(factory.client_key)],
        "known_hosts": str(factory.known_hosts),
        "config": None,
        "agent_path": None,
        **kwargs,
    }
    return asyncssh.connect(server.host, server.port, **options)


def _run(factory: InProcessSshdFactory, server: InProcessServer, command: str, stdin: str = "") -> Any:
    async def go() -> Any:
        async with _connect(factory, server) as conn:
            return await conn.run(command, input=stdin, check=False)

    return asyncio.run(go())


def test_a_command_runs_by_sh_with_the_machines_own_environment(
    factory: InProcessSshdFactory, server: InProcessServer
) -> None:
    done = _run(factory, server, 'read line; echo "$line|$WB_HOME|$WB_PROJECTS_ROOT|$HOME|${PATH%%:*}"; exit 3', "hi\n")
    assert done.exit_status == 3
    root = server.root
    assert done.stdout == f"hi|{root / 'wbhome'}|{root / 'projects'}|{root / 'home'}|{root / 'bin'}\n"
    assert "session: request exec: read line;" in server.log()


def test_a_signal_ending_the_command_is_reported_as_an_exit_signal(
    factory: InProcessSshdFactory, server: InProcessServer
) -> None:
    done = _run(factory, server, "kill -TERM $$")
    assert done.exit_signal is not None and done.exit_signal[0] == "TERM"


def test_an_unknown_host_key_and_a_foreign_client_key_are_refused(
    factory: InProcessSshdFactory, server: InProcessServer, tmp_path: Path
) -> None:
    stranger = factory.start("127.0.0.7", remember_key=False)

    async def unknown() -> None:
        async with _connect(factory, stranger):
            pass

    with pytest.raises(asyncssh.HostKeyNotVerifiable):
        asyncio.run(unknown())

    async def foreign() -> None:
        async with _connect(factory, server, client_keys=[asyncssh.generate_private_key("ssh-ed25519")]):
            pass

    with pytest.raises(asyncssh.PermissionDenied):
        asyncio.run(foreign())


def test_a_client_gone_leaves_the_command_running_with_its_pipes_closed(
    factory: InProcessSshdFactory, server: InProcessServer
) -> None:
    """As sshd without a PTY: no signal, the pipes close; a command that writes then fails (EPIPE)."""
    marker = server.root / "still-running"
    command = f"echo $$ > {marker}.pid; echo ready; sleep 1; echo alive > {marker}; while echo tick; do sleep 0.2; done"

    async def go() -> int:
        async with _connect(factory, server) as conn:
            process = await conn.create_process(command)
            await process.stdout.readline()
            return int(Path(f"{marker}.pid").read_text())

    pid = asyncio.run(go())
    assert wait_for(marker.exists, 30), "the command was ended with its client"
    assert wait_for(lambda: not pid_alive(pid), 30), "writing to the closed pipe did not end it"


def test_kill_sessions_drops_every_connection(factory: InProcessSshdFactory, server: InProcessServer) -> None:
    async def go() -> tuple[object, object]:
        async with _connect(factory, server) as conn:
            process = await conn.create_process("echo up; exec sleep 60")
            await process.stdout.readline()
            assert server.session_processes()
            await asyncio.get_running_loop().run_in_executor(None, server.kill_sessions)
            await asyncio.wait_for(conn.wait_closed(), 30)  # dropped, while the command still runs
            return process.exit_status, process.exit_signal

    assert asyncio.run(go()) == (None, None)  # no exit status: the connection went, not the command
    for process in server.session_processes():
        os.kill(process.pid, signal.SIGKILL)


def test_an_unknown_tier_name_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TIERS_ENV, "inprocess,telnet")
    with pytest.raises(pytest.UsageError, match="unknown tier 'telnet'"):
        selected_tiers()
    monkeypatch.setenv(TIERS_ENV, "inprocess")
    assert selected_tiers() == ("inprocess",)
