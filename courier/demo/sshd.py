"""An embedded SSH server for `wb demo`: loopback only, ephemeral keys, one command.

It listens on 127.0.0.1 (an ephemeral port) with a fresh ed25519 host key, accepts exactly
one client key for exactly one user name, and serves exactly one exec request:
`<wb_path> --wb-internal-agent-remote`. That runs this checkout's real receiver
(`python -m courier.main --wb-internal-agent-remote`) as a subprocess with the demo
machine's environment, pipes the channel's stdin to it and its stdout/stderr back, and
returns its exit status. Everything else is refused: shells, other commands, PTYs,
forwarding of any kind, SFTP/SCP, passwords.

The server's event loop runs in a background thread, so the caller can run the real `wb`
CLI as subprocesses (which connect to it over TCP) from ordinary synchronous code.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

import asyncssh

from protocol import limits
from protocol.entry import REMOTE_ARGUMENT

_CHUNK = limits.SSH_READ_CHUNK_BYTES
_STOP_GRACE_S = 3.0
_REFUSED_STATUS = 1


def new_key() -> asyncssh.SSHKey:
    """A fresh ed25519 key pair (kept in memory unless the caller exports it)."""
    return asyncssh.generate_private_key("ssh-ed25519")


def public_line(key: asyncssh.SSHKey) -> str:
    """`ssh-ed25519 AAAA…` without a comment."""
    return " ".join(key.export_public_key("openssh").decode().split()[:2])


def private_openssh(key: asyncssh.SSHKey) -> bytes:
    return bytes(key.export_private_key("openssh"))


class _Server(asyncssh.SSHServer):
    """Public-key auth only, for one user and one key."""

    def __init__(self, user: str, client_key: asyncssh.SSHKey) -> None:
        self._user = user
        self._client_public = client_key.public_data

    def begin_auth(self, username: str) -> bool:
        return True

    def password_auth_supported(self) -> bool:
        return False

    def kbdint_auth_supported(self) -> bool:
        return False

    def host_based_auth_supported(self) -> bool:
        return False

    def public_key_auth_supported(self) -> bool:
        return True

    def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        return username == self._user and key.public_data == self._client_public


class EmbeddedSshd:
    """The demo machine's SSH server. `start()`, then `port` and `host_key_line`; `stop()` ends it all."""

    host = "127.0.0.1"

    def __init__(
        self,
        *,
        user: str,
        client_key: asyncssh.SSHKey,
        wb_path: str,
        env: Mapping[str, str],
        cwd: str,
    ) -> None:
        self._user = user
        self._client_key = client_key
        self._host_key = new_key()
        self._command = f"{wb_path} {REMOTE_ARGUMENT}"
        self._env = dict(env)
        self._cwd = cwd
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._acceptor: asyncssh.SSHAcceptor | None = None
        self._children: set[asyncio.subprocess.Process] = set()
        self._port = 0
        self.refused: list[str] = []  # what was asked and refused, for a diagnostic

    # -- lifecycle (called from the caller's thread)

    def start(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="wb-demo-sshd", daemon=True)
        self._thread.start()
        future: Future[None] = asyncio.run_coroutine_threadsafe(self._listen(), loop)
        try:
            future.result(timeout=30)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        if loop is None:
            return
        if loop.is_running():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=_STOP_GRACE_S + 5)
            loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(timeout=10)
        if not loop.is_running():
            loop.close()

    @property
    def port(self) -> int:
        return self._port

    @property
    def host_key_line(self) -> str:
        """The known_hosts line for this server: `[127.0.0.1]:<port> ssh-ed25519 AAAA…`."""
        return f"[{self.host}]:{self._port} {public_line(self._host_key)}"

    @property
    def host_key_fingerprint(self) -> str:
        return str(self._host_key.get_fingerprint())

    # -- inside the loop

    async def _listen(self) -> None:
        acceptor = await asyncssh.listen(
            self.host,
            0,
            config=None,
            server_factory=lambda: _Server(self._user, self._client_key),
            server_host_keys=[self._host_key],
            process_factory=self._serve,
            encoding=None,
            allow_pty=False,
            x11_forwarding=False,
            agent_forwarding=False,
            allow_scp=False,
            sftp_factory=None,
            gss_host=None,
            rdns_lookup=False,
            login_timeout=30,
        )
        self._acceptor = acceptor
        self._port = acceptor.get_port()

    async def _shutdown(self) -> None:
        if self._acceptor is not None:
            self._acceptor.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._acceptor.wait_closed(), _STOP_GRACE_S)
        for child in list(self._children):
            await _end(child)

    async def _serve(self, process: asyncssh.SSHServerProcess[bytes]) -> None:
        try:
            await self._serve_one(process)
        except Exception as exc:  # a broken session must not take the server down
            with contextlib.suppress(Exception):
                process.stderr.write(f"wb demo sshd: {type(exc).__name__}: {exc}\n".encode())
                process.exit(_REFUSED_STATUS)

    async def _serve_one(self, process: asyncssh.SSHServerProcess[bytes]) -> None:
        command = process.command
        if command != self._command or process.subsystem is not None:
            self.refused.append(repr(command if command is not None else process.subsystem or "shell"))
            process.stderr.write(b"wb demo sshd: this server only runs the wb receiver\n")
            process.exit(_REFUSED_STATUS)
            return
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "courier.main",
            REMOTE_ARGUMENT,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self._env,
            cwd=self._cwd,
            start_new_session=True,
        )
        self._children.add(child)
        try:
            await self._pump(process, child)
        finally:
            self._children.discard(child)
            if child.returncode is None:
                await _end(child)
        status = child.returncode
        if status is not None and status < 0:
            name = signal.Signals(-status).name.removeprefix("SIG")
            process.exit_with_signal(name)
        else:
            process.exit(status if status is not None else _REFUSED_STATUS)

    async def _pump(self, process: asyncssh.SSHServerProcess[bytes], child: asyncio.subprocess.Process) -> None:
        assert child.stdin is not None and child.stdout is not None and child.stderr is not None
        child_stdin = child.stdin

        async def feed() -> None:
            try:
                while True:
                    data = await process.stdin.read(_CHUNK)
                    if not data:
                        break
                    child_stdin.write(data)
                    await child_stdin.drain()
            except (OSError, asyncssh.Error):
                pass
            finally:
                with contextlib.suppress(OSError):
                    child_stdin.close()

        async def copy(reader: asyncio.StreamReader, writer: asyncssh.SSHWriter[bytes]) -> None:
            while True:
                data = await reader.read(_CHUNK)
                if not data:
                    return
                writer.write(data)
                await writer.drain()

        feeder: asyncio.Future[Any] = asyncio.ensure_future(feed())
        outputs: asyncio.Future[Any] = asyncio.ensure_future(
            asyncio.gather(copy(child.stdout, process.stdout), copy(child.stderr, process.stderr))
        )
        closed: asyncio.Future[Any] = asyncio.ensure_future(process.wait_closed())
        try:
            # The client going away first ends the receiver, as sshd closing the session would.
            done, _ = await asyncio.wait({outputs, closed}, return_when=asyncio.FIRST_COMPLETED)
            if outputs in done:
                outputs.result()
                await child.wait()
        finally:
            for task in (feeder, outputs, closed):
                if not task.done():
                    task.cancel()
                with contextlib.suppress(BaseException):
                    await task


async def _end(child: asyncio.subprocess.Process) -> None:
    """SIGTERM, a short grace, then SIGKILL."""
    if child.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        child.terminate()
    try:
        await asyncio.wait_for(child.wait(), _STOP_GRACE_S)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            child.kill()
        await child.wait()
