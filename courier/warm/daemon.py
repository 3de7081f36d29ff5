"""The courier's event loop: accept, check the peer, fork commands, carry remote calls, keep idle time."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable
from typing import Any

from courier import __version__
from courier.channels import courier_frames as frames
from courier.channels import courier_socket as place
from courier.channels.channel import Bounds, WarmState
from courier.channels.registry import from_spec
from courier.config import load_config
from courier.errors import TransportError, WbError
from courier.stamp import program_stamp
from courier.warm import child
from protocol import limits
from protocol.timestamps import rfc3339, utc_now

_UCRED = struct.Struct("3i")
_RECV_CHUNK = limits.READ_CHUNK_BYTES
_IDLE_CHECK_MAX_S = 5.0


def _log(message: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"{rfc3339(utc_now())} courier {os.getpid()}: {message}\n")
        sys.stderr.flush()


Runner = Callable[[list[str]], int]  # the command line entry (`courier.cli.run`), given by the entry module


class Courier:
    def __init__(self, path: str, lock_fd: int, runner: Runner) -> None:
        self.path = path
        self.runner = runner
        self.lock_fd = lock_fd
        self.started_at = time.time()
        self.stamp = program_stamp()
        self.warm = WarmState()  # per channel kind: the one ssh pool, the exec serve processes
        self.listener: socket.socket | None = None
        self.listener_inode = 0
        self.connections: set[socket.socket] = set()
        self.children: set[int] = set()
        self.busy = 0
        self.last_work = time.monotonic()
        self.stopping = False
        self.commands = 0
        self.idle_s = self._idle_setting()
        self.done = asyncio.Event()
        self.tasks: set[asyncio.Future[None]] = set()

    @staticmethod
    def _idle_setting() -> float:
        try:
            return load_config().courier_idle_ms / limits.MS_PER_SECOND
        except WbError:
            return limits.COURIER_IDLE_DEFAULT_MS / limits.MS_PER_SECOND

    # -- lifecycle ---------------------------------------------------------------------------

    def listen(self) -> None:
        # We hold the lock: any socket file here belongs to a courier that is gone.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        address, dir_fd = place.sun_path(self.path)
        old_umask = os.umask(0o177)
        try:
            listener.bind(address)
        finally:
            os.umask(old_umask)
            if dir_fd is not None:
                os.close(dir_fd)
        listener.listen(128)
        listener.setblocking(False)
        self.listener = listener
        self.listener_inode = os.stat(self.path).st_ino

    def begin_stop(self, why: str) -> None:
        if self.stopping:
            return
        self.stopping = True
        _log(f"stopping: {why}")
        self._unlink_socket()
        if self.lock_fd >= 0:
            # A successor may start at once (the next command, after an upgrade): it needs the lock.
            os.close(self.lock_fd)
            self.lock_fd = -1
        if self.listener is not None:
            asyncio.get_running_loop().remove_reader(self.listener.fileno())
            self.listener.close()
            self.listener = None
        self._maybe_done()

    def _unlink_socket(self) -> None:
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == self.listener_inode:
                os.unlink(self.path)

    def _maybe_done(self) -> None:
        if self.stopping and not self.busy and not self.children:
            self.done.set()

    async def idle_watch(self) -> None:
        while not self.stopping:
            await asyncio.sleep(min(_IDLE_CHECK_MAX_S, max(0.05, self.idle_s / 4)))
            if not self.busy and not self.children and time.monotonic() - self.last_work >= self.idle_s:
                self.begin_stop(f"idle for {self.idle_s:g}s")
            elif not self.stopping and not self._socket_is_ours():
                self.begin_stop("its socket was removed or replaced")

    def _socket_is_ours(self) -> bool:
        try:
            return os.stat(self.path).st_ino == self.listener_inode
        except OSError:
            return False

    # -- connections -------------------------------------------------------------------------

    def on_accept(self) -> None:
        if self.listener is None:
            return
        while True:
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                _log(f"accept failed: {exc}")
                return
            conn.setblocking(False)
            if not self._same_user(conn):
                conn.close()
                continue
            self.connections.add(conn)
            self.tasks.add(task := asyncio.ensure_future(self.handle(conn)))
            task.add_done_callback(self.tasks.discard)

    @staticmethod
    def _same_user(conn: socket.socket) -> bool:
        try:
            _, uid, _ = _UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
        except OSError:
            return False
        if uid != os.getuid():
            _log(f"refused a connection from uid {uid}")
            return False
        return True

    async def handle(self, conn: socket.socket) -> None:
        counted = False
        passed: list[int] = []
        try:
            fields, passed = await _recv_frame(conn, with_fds=True)
            kind = fields[0] if fields else b""
            if kind in (b"run", b"remote"):
                counted = True
                self.busy += 1
            if kind == b"run":
                await self.run_command(conn, fields, passed)
                passed = []
            elif kind == b"remote":
                await self.remote_call(conn, fields)
            elif kind == b"status":
                await _send(conn, [b"status", json.dumps(self.describe()).encode()])
            elif kind == b"stop":
                await _send(conn, [b"stopping", str(os.getpid()).encode()])
                self.begin_stop("wb courier stop")
        except (OSError, frames.FrameError, ValueError) as exc:
            _log(f"connection dropped: {type(exc).__name__}: {exc}")
        finally:
            for fd in passed:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self.connections.discard(conn)
            conn.close()
            if counted:
                self.busy -= 1
                self.last_work = time.monotonic()
            self._maybe_done()

    async def run_command(self, conn: socket.socket, fields: list[bytes], passed: list[int]) -> None:
        try:
            command = child.Command.parse(fields)
        except ValueError:
            for fd in passed:
                os.close(fd)
            await _send(conn, [b"refused"])
            return
        if self.stopping or program_stamp() != self.stamp:
            self.begin_stop("wb was upgraded on disk" if not self.stopping else "already stopping")
            for fd in passed:
                os.close(fd)
            await _send(conn, [b"restart"])
            return
        with contextlib.suppress(OSError):  # the thin client: the process the user started
            credentials = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
            command.client_pid = _UCRED.unpack(credentials)[0]
        closing = [*self.connections, *([self.listener] if self.listener else [])]
        _probe_sandbox(command.env.get("PATH"))
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child never returns
            child.run_child(command, passed, closing, self.path, self.runner)
        for fd in passed:
            os.close(fd)
        self.children.add(pid)
        self.commands += 1
        try:
            await self._supervise(conn, pid)
        finally:
            self.children.discard(pid)

    async def _supervise(self, conn: socket.socket, pid: int) -> None:
        """Report the child's end to the client; forward the client's signals; a vanished client kills it."""
        loop = asyncio.get_running_loop()
        pidfd = os.pidfd_open(pid)
        exited = loop.create_future()
        loop.add_reader(pidfd, _resolve, exited)
        reaped = False
        try:
            await _send(conn, [b"started", str(pid).encode()])
            while True:
                incoming = asyncio.ensure_future(_recv_frame(conn))
                await asyncio.wait({exited, incoming}, return_when=asyncio.FIRST_COMPLETED)
                if exited.done():
                    incoming.cancel()
                    with contextlib.suppress(BaseException):
                        await incoming
                    break
                try:
                    message, _ = incoming.result()
                except (OSError, frames.FrameError):
                    os.kill(pid, signal.SIGKILL)  # the caller is gone, as the cold process would be
                    await exited
                    break
                if message[:1] == [b"signal"] and len(message) == 2:
                    with contextlib.suppress(OSError, ValueError):
                        os.kill(pid, int(message[1]))
            _, status = os.waitpid(pid, 0)
            reaped = True
            if os.WIFSIGNALED(status):
                reply = [b"signal", str(os.WTERMSIG(status)).encode()]
            else:
                reply = [b"exit", str(os.waitstatus_to_exitcode(status)).encode()]
            with contextlib.suppress(OSError):
                await _send(conn, reply)
        finally:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            if not reaped:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)

    async def remote_call(self, conn: socket.socket, fields: list[bytes]) -> None:
        if len(fields) != 3:
            raise frames.FrameError("a remote call has three fields")
        header: dict[str, Any] = json.loads(fields[1])
        channel = from_spec(header["spec"])
        payload = fields[2]
        bounds = Bounds(stdout_max=int(header["stdout_max"]), stderr_max=int(header["stderr_max"]))
        run = channel.run_warm(
            self.warm,
            [str(item) for item in header["tail"]],
            payload,
            bounds,
            operation=_operation_of(payload),
            max_sessions=int(header.get("max_sessions") or 8),
            serve_dispatch=header.get("serve_dispatch") is True,
        )
        call = asyncio.ensure_future(run)
        gone = asyncio.ensure_future(_wait_closed(conn))
        await asyncio.wait({call, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not call.done():  # the command gave up (its bound, Ctrl-C): so does the call
            call.cancel()
            with contextlib.suppress(BaseException):
                await call
            return
        # Finish the cancelled wait before the socket can close: its reader must leave the
        # selector while the fd is still this socket's (a reused number would inherit it).
        gone.cancel()
        with contextlib.suppress(BaseException):
            await gone
        try:
            outcome = call.result()
        except WbError as exc:
            error = {"class": type(exc).__name__, "message": exc.message}
            if isinstance(exc, TransportError):
                error["cause"] = exc.cause
            await _send(conn, [b"error", json.dumps(error).encode()])
            return
        except Exception as exc:
            error = {"class": "TransportError", "message": f"{channel.machine}: courier: {exc}", "cause": "error"}
            await _send(conn, [b"error", json.dumps(error).encode()])
            return
        meta = {"exit_status": outcome.exit_status, "exit_signal": outcome.exit_signal, "overflow": outcome.overflow}
        await _send(conn, [b"outcome", json.dumps(meta).encode(), outcome.stdout, outcome.stderr])

    def describe(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "version": __version__,
            "uptime_s": round(time.time() - self.started_at, 1),
            "socket": self.path,
            "idle_s": self.idle_s,
            "commands": self.commands,
            "running": len(self.children),
            "machines": self.warm.describe(),
        }


def _operation_of(payload: bytes) -> str:
    """The request's operation (the pools route some operations around serve sessions); "" if unreadable."""
    try:
        document = json.loads(payload)
    except ValueError:
        return ""
    operation = document.get("operation") if isinstance(document, dict) else None
    return operation if isinstance(operation, str) else ""


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _readable(sock: socket.socket) -> None:
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    fd = sock.fileno()  # the socket may be closed by the time a cancelled wait cleans up
    loop.add_reader(fd, _resolve, future)
    try:
        await future
    finally:
        loop.remove_reader(fd)


async def _recv_some(sock: socket.socket, size: int, fds: list[int] | None) -> bytes:
    while True:
        try:
            if fds is not None:
                data, received, _, _ = socket.recv_fds(sock, size, 3)
                fds.extend(received)
                return data
            return sock.recv(size)
        except (BlockingIOError, InterruptedError):
            await _readable(sock)


async def _recv_exact(sock: socket.socket, size: int, fds: list[int] | None) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = await _recv_some(sock, min(size - len(data), _RECV_CHUNK), fds)
        if not chunk:
            raise frames.FrameError("the peer closed the connection")
        data += chunk
    return bytes(data)


async def _recv_frame(sock: socket.socket, *, with_fds: bool = False) -> tuple[list[bytes], list[int]]:
    fds: list[int] = []
    try:
        (size,) = struct.unpack("!I", await _recv_exact(sock, 4, fds if with_fds else None))
        if size > frames.FRAME_MAX_BYTES:
            raise frames.FrameError(f"frame of {size} bytes is over the limit")
        body = await _recv_exact(sock, size, fds if with_fds else None)
        return frames.unpack(body), fds
    except BaseException:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        raise


async def _wait_closed(sock: socket.socket) -> None:
    while await _recv_some(sock, limits.READ_CHUNK_BYTES, None):
        pass


async def _send(sock: socket.socket, fields: list[bytes]) -> None:
    await asyncio.get_running_loop().sock_sendall(sock, frames.pack(fields))


async def _main(path: str, ready_fd: int, lock_fd: int, runner: Runner) -> int:
    loop = asyncio.get_running_loop()
    server = Courier(path, lock_fd, runner)
    server.listen()
    if ready_fd >= 0:
        os.close(ready_fd)  # the starting client stops waiting: we listen
    assert server.listener is not None
    loop.add_reader(server.listener.fileno(), server.on_accept)
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, server.begin_stop, f"signal {signum}")
    loop.add_signal_handler(signal.SIGHUP, lambda: None)
    _log(f"listening on {path} (wb {__version__}, idle {server.idle_s:g}s)")
    watcher = asyncio.ensure_future(server.idle_watch())
    await server.done.wait()
    watcher.cancel()
    await server.warm.close()
    _log("stopped")
    return 0


def serve_forever(path: str, ready_fd: int, lock_fd: int, runner: Runner) -> int:
    """Serve until stopped; `runner` runs one command line in a forked child (the entry module passes it in)."""
    return asyncio.run(_main(path, ready_fd, lock_fd, runner))


def _probe_sandbox(path_env: str | None) -> None:
    """Whether bubblewrap can confine a run, asked once per caller's PATH here, before the command's child is
    forked: the child, and a run's owner copied from it, start with the answer (docs/runs.md#the-owner)."""
    from courier.runs import bwrap_probe

    with contextlib.suppress(Exception):
        bwrap_probe.usable(path_env)
