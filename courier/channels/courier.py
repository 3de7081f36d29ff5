"""The courier as a channel (docs/courier.md): a command the courier runs sends its calls' bytes to it.

`CourierChannel` wraps the channel the target names (`ssh`, `exec`) and carries each run
over one unix-socket round trip to the courier, which runs it on its pooled, re-verified
connection or its serve process for that machine. What is sent is the inner channel's
`spec()` (enough to make the same channel there), the argv tail, the bounds and stdin; what
comes back is the Outcome, or the TransportError the courier met. Everything before and
after (validation, the time bound, classification, decoding) is the caller's own code,
the same as cold. When the courier is gone, the run goes the cold way through the inner
channel.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from courier import errors
from courier.channels import courier_frames as frames
from courier.channels import courier_socket as place
from courier.channels.channel import DEFAULT_BOUNDS, Bounds, Channel, Outcome

if TYPE_CHECKING:
    from courier.config import Config

# How long a command whose call lost the courier waits to learn whether the courier died.
COURIER_EXIT_WAIT_S = 2.0


class CourierChannel(Channel):
    def __init__(self, inner: Channel, socket_path: str, max_sessions: int, serve_dispatch: bool = True) -> None:
        super().__init__(inner.machine, inner.target)
        self.inner = inner
        self.kind = inner.kind
        self.socket_path = socket_path
        self.max_sessions = max_sessions
        self.serve_dispatch = serve_dispatch  # courier.dispatch_over_serve (docs/courier.md)
        self.courier_pid = os.getppid()  # built in the command's process, a child of the courier

    @property
    def where(self) -> str:
        return self.inner.where

    def setting(self, key: str) -> str:
        return self.inner.setting(key)

    def classify_exit(self, outcome: Outcome) -> None:
        self.inner.classify_exit(outcome)  # the courier only carried the bytes of the inner channel

    async def run(self, tail: list[str], stdin: bytes, bounds: Bounds = DEFAULT_BOUNDS) -> Outcome:
        sock = place.connect(self.socket_path, socket.socket)
        if sock is None:  # the courier is going away: this call is made the cold way
            return await self.inner.run(tail, stdin, bounds)
        header = {
            "spec": self.inner.spec(),
            "tail": tail,
            "max_sessions": self.max_sessions,
            "serve_dispatch": self.serve_dispatch,
            "stdout_max": bounds.stdout_max,
            "stderr_max": bounds.stderr_max,
        }
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        try:
            writer.write(frames.pack([b"remote", json.dumps(header).encode(), stdin]))
            await writer.drain()
            try:
                (size,) = struct.unpack("!I", await reader.readexactly(4))
                fields = frames.unpack(await reader.readexactly(size))
            except (asyncio.IncompleteReadError, frames.FrameError, OSError):
                _end_quietly_if_the_courier_died(self.courier_pid)
                raise errors.ConnectionLost(f"{self.machine}: the wb courier ended during this call") from None
        finally:
            writer.close()
        return outcome_of(fields)


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
            os._exit(frames.LOST_EXIT)  # nothing flushed: the thin client speaks for this command
        time.sleep(0.01)


def through_courier(socket_path: str) -> Callable[[Config, Channel], Channel]:
    """The wrapper `courier.channels.channel.carry_through` installs in a command the courier runs."""
    return lambda config, inner: CourierChannel(
        inner, socket_path, config.courier_max_sessions, config.courier_dispatch_over_serve
    )


def outcome_of(fields: list[bytes]) -> Outcome:
    """The courier's answer frame as the Outcome (or the error) the inner channel would have given."""
    kind = fields[0] if fields else b""
    if kind == b"outcome" and len(fields) == 4:
        meta = json.loads(fields[1])
        return Outcome(
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
