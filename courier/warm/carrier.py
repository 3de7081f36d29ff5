"""The warm transport (docs/courier.md): a command in the courier sends its remote calls through the courier.

`CourierTransport` is `SshTransport` with one difference: the request's bytes travel over the
courier's pooled, re-verified connection to that machine (one unix-socket round trip to the
courier) instead of a new SSH connection; validation, bounds, decoding and classification
are the cold path's own code (`courier.remote.client.call_async`).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
import time
from collections.abc import Callable

from courier import errors
from courier.config import Config
from courier.remote import ssh
from courier.remote.client import call_async
from courier.transport import SshTransport, Transport
from courier.warm import frames, place
from protocol.models import RemoteRequest, RemoteResponse

# How long a command whose call lost the courier waits to learn whether the courier died.
COURIER_EXIT_WAIT_S = 2.0
LOST_EXIT = 255


class CourierTransport(SshTransport):
    def __init__(self, config: Config, machine: str, runner: CourierRunner) -> None:
        super().__init__(config, machine)
        self.runner = runner

    async def ask_async(self, request: RemoteRequest, *, timeout_s: float | None = None) -> RemoteResponse:
        return await call_async(self.config, self.machine, request, timeout_s=timeout_s, carrier=self.runner)


def courier_transport(socket_path: str) -> Callable[[Config, str], Transport]:
    """The factory `courier.transport.use_remote` installs in a command the courier runs."""
    runner = CourierRunner(socket_path)
    return lambda config, machine: CourierTransport(config, machine, runner)


class CourierRunner:
    """`remote_runner` for a command in the courier: the call travels over the courier's connection."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.courier_pid = os.getppid()  # built in the command's process, a child of the courier

    async def __call__(
        self, config: Config, endpoint: ssh.Endpoint, command: str, payload: bytes, operation: str
    ) -> ssh.Outcome:
        sock = self._connect()
        if sock is None:  # the courier is going away: this call is made the cold way
            async with await ssh.connect(endpoint) as connection:
                return await connection.run(command, payload)
        header = {
            "machine": endpoint.machine,
            "host": endpoint.host,
            "user": endpoint.user,
            "port": endpoint.port,
            "command": command,
            "operation": operation,
            "max_sessions": config.courier_max_sessions,
        }
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        try:
            writer.write(frames.pack([b"remote", json.dumps(header).encode(), payload]))
            await writer.drain()
            try:
                (size,) = struct.unpack("!I", await reader.readexactly(4))
                fields = frames.unpack(await reader.readexactly(size))
            except (asyncio.IncompleteReadError, frames.FrameError, OSError):
                _end_quietly_if_the_courier_died(self.courier_pid)
                raise errors.ConnectionLost(
                    f"{endpoint.machine}: the wb courier ended during the {operation} call"
                ) from None
        finally:
            writer.close()
        return _outcome(fields)

    def _connect(self) -> socket.socket | None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        address, dir_fd = place.sun_path(self.socket_path)
        try:
            sock.connect(address)
        except OSError:
            sock.close()
            return None
        finally:
            if dir_fd is not None:
                os.close(dir_fd)
        return sock


def _end_quietly_if_the_courier_died(courier_pid: int) -> None:
    """A courier that dies closes this call's socket before the kernel ends this command.

    Its exit closes its files first and sends the parent-death signal (courier.warm.child) only
    after; in between this command must print nothing: the thin client reports the courier's
    end itself (and waits on without it for an await). So the command waits for that signal
    or the reparenting, and ends silently; a courier that lives on dropped only this call.
    """
    deadline = time.monotonic() + COURIER_EXIT_WAIT_S
    while time.monotonic() < deadline:
        if os.getppid() != courier_pid:
            os._exit(LOST_EXIT)  # nothing flushed: the thin client speaks for this command
        time.sleep(0.01)


def _outcome(fields: list[bytes]) -> ssh.Outcome:
    kind = fields[0] if fields else b""
    if kind == b"outcome" and len(fields) == 4:
        meta = json.loads(fields[1])
        return ssh.Outcome(
            stdout=fields[2],
            stderr=fields[3],
            exit_status=meta.get("exit_status"),
            exit_signal=meta.get("exit_signal"),
            overflow=meta.get("overflow"),
        )
    if kind == b"error" and len(fields) == 2:
        meta = json.loads(fields[1])
        found = getattr(errors, str(meta.get("class", "")), None)
        message = str(meta.get("message", "the courier failed this call"))
        if isinstance(found, type) and issubclass(found, errors.TransportError):
            raise found(message, cause=meta.get("cause"))
        if isinstance(found, type) and issubclass(found, errors.WbError):
            raise found(message)
        raise errors.TransportError(message, cause=meta.get("cause"))
    raise errors.ReplyUntrusted("the wb courier answered a remote call with something else")
