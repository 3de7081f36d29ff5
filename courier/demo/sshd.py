"""An embedded SSH server for `wb demo`: loopback only, ephemeral keys, one command.

`LoopbackSshd` is the server itself: it listens on a loopback address (an ephemeral port)
with a fresh ed25519 host key, accepts exactly one client key for exactly one user name,
refuses shells, PTYs, forwarding of any kind, SFTP/SCP and passwords, and hands each exec
request to `_spawn`, which starts the session's process (or refuses it). The channel's stdin
is piped to that process, its stdout/stderr back, and its exit status (or signal) returned.

`EmbeddedSshd` is the demo's machine: it serves exactly one exec request,
`<wb_path> --wb-internal-agent-remote`, by running this checkout's real receiver
(`python -m courier.main --wb-internal-agent-remote`) with the demo machine's environment.
The test suite's in-process machines (tests/integration/inprocess_sshd.py) are another
`LoopbackSshd` that runs any command through `/bin/sh -c`, as sshd does.

The server's event loop runs in a background thread, so the caller can run the real `wb`
CLI as subprocesses (which connect to it over TCP) from ordinary synchronous code.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any, TypeVar

from courier.channels.asyncssh_import import preload_asyncssh
from protocol import limits
from protocol.entry import REMOTE_ARGUMENT

preload_asyncssh()  # the one way asyncssh is first imported (courier/channels/asyncssh_import.py)

import asyncssh  # noqa: E402

_CHUNK = limits.SSH_READ_CHUNK_BYTES
_STOP_GRACE_S = 3.0
_REFUSED_STATUS = 1
_T = TypeVar("_T")


def new_key() -> asyncssh.SSHKey:
    """A fresh ed25519 key pair (kept in memory unless the caller exports it)."""
    return asyncssh.generate_private_key("ssh-ed25519")


def public_line(key: asyncssh.SSHKey) -> str:
    """`ssh-ed25519 AAAA…` without a comment."""
    return " ".join(key.export_public_key("openssh").decode().split()[:2])


def private_openssh(key: asyncssh.SSHKey) -> bytes:
    return bytes(key.export_private_key("openssh"))


class _Server(asyncssh.SSHServer):
    """Public-key auth only, for one user and one key; tells its owner about each connection."""

    def __init__(self, owner: LoopbackSshd) -> None:
        self._owner = owner
        self._conn: asyncssh.SSHServerConnection | None = None
        self._username = ""

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self._conn = conn
        self._owner._connection_made(conn)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._conn is not None:
            self._owner._connections.discard(self._conn)

    def begin_auth(self, username: str) -> bool:
        self._username = username
        return True

    def auth_completed(self) -> None:
        self._owner.note(f"Accepted publickey for {self._username}")

    def password_auth_supported(self) -> bool:
        return False

    def kbdint_auth_supported(self) -> bool:
        return False

    def host_based_auth_supported(self) -> bool:
        return False

    def public_key_auth_supported(self) -> bool:
        return True

    def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        return username == self._owner.user and key.public_data == self._owner._client_public


class LoopbackSshd:
    """An SSH server on loopback. `start()`, then `port` and `host_key_line`; `stop()` ends it all.

    Subclasses implement `_spawn`. `end_on_disconnect` says what happens to a session's process
    when its client goes away first: ended at once (the demo), or, as sshd does for a session
    without a PTY, left running with its pipes closed, to notice that by itself.
    """

    end_on_disconnect = True
    allow_pty = False
    agent_forwarding = False

    def __init__(self, *, user: str, client_key: asyncssh.SSHKey, host: str = "127.0.0.1") -> None:
        self.host = host
        self.user = user
        self._client_public = client_key.public_data
        self._host_key = new_key()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._acceptor: asyncssh.SSHAcceptor | None = None
        self._children: set[asyncio.subprocess.Process] = set()
        self._connections: set[asyncssh.SSHServerConnection] = set()
        self._port = 0
        self.refused: list[str] = []  # what was asked and refused, for a diagnostic

    # -- hooks

    async def _spawn(self, process: asyncssh.SSHServerProcess[bytes]) -> asyncio.subprocess.Process | None:
        """Start the session's process, or refuse the request (write why, `process.exit`) and return None."""
        raise NotImplementedError

    def note(self, line: str) -> None:
        """One event of the server's (a connection, an authentication, a request); the demo keeps none."""

    # -- lifecycle (called from the caller's thread)

    def start(self, port: int = 0) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="wb-loopback-sshd", daemon=True)
        self._thread.start()
        try:
            self.call(self._listen(port), timeout=30)
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

    def call(self, coroutine: Any, timeout: float = 30) -> Any:
        """Run a coroutine on the server's loop from the caller's thread and return its result."""
        assert self._loop is not None, "the server is not running"
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result(timeout=timeout)

    def in_loop(self, function: Callable[[], _T]) -> _T:
        """`function()` run on the server's loop (so it sees a consistent state), its result returned."""

        async def run() -> _T:
            return function()

        return self.call(run())  # type: ignore[no-any-return]

    @property
    def running(self) -> bool:
        return self._loop is not None

    @property
    def port(self) -> int:
        return self._port

    @property
    def host_key_line(self) -> str:
        """The known_hosts line for this server: `[127.0.0.1]:<port> ssh-ed25519 AAAA…`."""
        return f"[{self.host}]:{self._port} {public_line(self._host_key)}"

    @property
    def host_public_key(self) -> str:
        return public_line(self._host_key)

    @property
    def host_key_fingerprint(self) -> str:
        return str(self._host_key.get_fingerprint())

    def child_pids(self) -> list[int]:
        """The sessions' processes that are still running."""
        return self.in_loop(lambda: [child.pid for child in self._children if child.returncode is None])

    def abort_connections(self) -> None:
        """Drop every client connection at once, as a killed per-connection sshd would."""

        def abort_all() -> None:
            for conn in list(self._connections):
                conn.abort()

        self.in_loop(abort_all)

    # -- inside the loop

    def _connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self._connections.add(conn)
        peer = conn.get_extra_info("peername") or ("?", 0)
        self.note(f"Connection from {peer[0]} port {peer[1]}")

    async def _listen(self, port: int) -> None:
        acceptor = await asyncssh.listen(
            self.host,
            port,
            config=None,
            server_factory=lambda: _Server(self),
            server_host_keys=[self._host_key],
            process_factory=self._serve,
            encoding=None,
            allow_pty=self.allow_pty,
            x11_forwarding=False,
            agent_forwarding=self.agent_forwarding,
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
        for conn in list(self._connections):
            conn.abort()
        for child in list(self._children):
            await _end(child)
            _release(child)
        await asyncio.sleep(0)  # let the closed pipes' callbacks run before the loop stops

    async def _serve(self, process: asyncssh.SSHServerProcess[bytes]) -> None:
        try:
            await self._serve_one(process)
        except Exception as exc:  # a broken session must not take the server down
            with contextlib.suppress(Exception):
                process.stderr.write(f"wb loopback sshd: {type(exc).__name__}: {exc}\n".encode())
                process.exit(_REFUSED_STATUS)

    async def _serve_one(self, process: asyncssh.SSHServerProcess[bytes]) -> None:
        child = await self._spawn(process)
        if child is None:
            return
        self._children.add(child)
        try:
            await self._pump(process, child)
        finally:
            if child.returncode is None:
                await _end(child)
            self._children.discard(child)
        status = child.returncode
        with contextlib.suppress(Exception):  # the client may be gone already
            if status is not None and status < 0:
                process.exit_with_signal(signal.Signals(-status).name.removeprefix("SIG"))
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
            done, _ = await asyncio.wait({outputs, closed}, return_when=asyncio.FIRST_COMPLETED)
            # Writing to a channel that closed under it is the client going away too.
            client_gone = closed in done or outputs.exception() is not None
            if not client_gone:
                await child.wait()
            elif not self.end_on_disconnect:
                # As sshd does without a PTY: close the session's pipes and let the process notice.
                _close_pipes(child)
                await child.wait()
            # Otherwise the client going away first ends the process (`_serve_one`'s finally).
        finally:
            for task in (feeder, outputs, closed):
                if not task.done():
                    task.cancel()
                with contextlib.suppress(BaseException):
                    await task


class EmbeddedSshd(LoopbackSshd):
    """The demo machine's SSH server: it runs the real receiver and nothing else."""

    def __init__(
        self,
        *,
        user: str,
        client_key: asyncssh.SSHKey,
        wb_path: str,
        env: Mapping[str, str],
        cwd: str,
    ) -> None:
        super().__init__(user=user, client_key=client_key)
        self._command = f"{wb_path} {REMOTE_ARGUMENT}"
        self._env = dict(env)
        self._cwd = cwd

    async def _spawn(self, process: asyncssh.SSHServerProcess[bytes]) -> asyncio.subprocess.Process | None:
        command = process.command
        if command != self._command or process.subsystem is not None:
            self.refused.append(repr(command if command is not None else process.subsystem or "shell"))
            process.stderr.write(b"wb demo sshd: this server only runs the wb receiver\n")
            process.exit(_REFUSED_STATUS)
            return None
        return await asyncio.create_subprocess_exec(
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


def _close_pipes(child: asyncio.subprocess.Process) -> None:
    """Close the process's three pipes, leaving it running (asyncio's Process cannot close its read ends)."""
    transport = getattr(child, "_transport", None)
    for fd in (0, 1, 2):
        pipe = transport.get_pipe_transport(fd) if transport is not None else None
        if pipe is not None:
            pipe.close()


def _release(child: asyncio.subprocess.Process) -> None:
    """Close an ended process's transport: the loop stops next, and nothing else would."""
    transport = getattr(child, "_transport", None)
    if transport is not None:
        transport.close()


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
