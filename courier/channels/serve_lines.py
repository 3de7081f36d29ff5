"""One long-lived `wb --wb-internal-agent-serve` (docs/protocol.md, serve mode), over any byte stream.

Request lines out, reply lines in, matched by request_id. The stream is an SSH channel
(`courier.channels.ssh_client.Stream`) or a local child's pipes (`courier.channels.exec.ProcessStream`):
the courier keeps one per machine whose peer lists `serve`.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from typing import Protocol

from courier.channels.channel import Outcome
from courier.errors import ConnectionLost, ReplyUntrusted, TransportError
from protocol import limits

_READ_CHUNK = limits.SSH_READ_CHUNK_BYTES
_REPLY_ID = re.compile(rb'^\{"request_id":"(r[0-9]{1,12})",')


class Stream(Protocol):
    """The stdio of one long-lived command; read/write failures are ConnectionLost."""

    async def write(self, data: bytes) -> None: ...

    async def read(self, size: int) -> bytes: ...

    async def read_stderr(self, size: int) -> bytes: ...

    def close(self) -> None: ...


class ServeEnded(ConnectionLost):
    """The serve process ended (upgraded, crashed, or its channel closed) before this reply came."""


class ServeChannel:
    """One `wb --wb-internal-agent-serve`: request lines out, reply lines in, matched by request_id."""

    def __init__(self, stream: Stream, machine: str) -> None:
        self._stream = stream
        self._machine = machine
        self._pending: dict[str, asyncio.Future[bytes]] = {}
        self._next = 0
        self.closed = False
        self.started_at = time.monotonic()
        self._reader = asyncio.ensure_future(self._read_replies())
        self._stderr = asyncio.ensure_future(self._drain_stderr())

    def when_ended(self, callback: object) -> None:
        self._reader.add_done_callback(callback)  # type: ignore[arg-type]

    async def ask(self, payload: bytes) -> Outcome:
        if self.closed:
            raise ServeEnded(f"{self._machine}: the serve session has ended")
        body = payload.strip()
        if not body.startswith(b"{") or b"\n" in body:
            raise TransportError(f"{self._machine}: internal: the request is not one JSON line")
        self._next += 1
        request_id = f"r{self._next}"
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            line = b'{"request_id":"' + request_id.encode() + b'"' + (b"," if body != b"{}" else b"") + body[1:] + b"\n"
            await self._stream.write(line)
            reply = await future
        finally:
            self._pending.pop(request_id, None)
        return Outcome(stdout=reply, stderr=b"", exit_status=0, exit_signal=None)

    async def _read_replies(self) -> None:
        buffer = bytearray()
        failure: TransportError = ServeEnded(f"{self._machine}: the serve session ended")
        try:
            while True:
                chunk = await self._stream.read(_READ_CHUNK)
                if not chunk:
                    break
                buffer += chunk
                while (end := buffer.find(b"\n")) >= 0:
                    line = bytes(buffer[: end + 1])
                    del buffer[: end + 1]
                    if not self._deliver(line):
                        failure = ReplyUntrusted(f"{self._machine}: the serve session sent a line without a request_id")
                        return
                if len(buffer) > limits.REPLY_STDOUT_MAX_BYTES:
                    failure = ReplyUntrusted(
                        f"{self._machine}: the reply exceeds {limits.REPLY_STDOUT_MAX_BYTES} bytes; "
                        "refused (the channel was closed)"
                    )
                    return
        except TransportError:
            pass
        finally:
            self.close()
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(failure)

    def _deliver(self, line: bytes) -> bool:
        match = _REPLY_ID.match(line)
        if match is None:
            return False
        future = self._pending.get(match.group(1).decode())
        if future is not None and not future.done():
            future.set_result(b"{" + line[match.end() :])
        return True

    async def _drain_stderr(self) -> None:
        # Read and drop: a chatty peer must never stall the channel (nothing here shows it).
        with contextlib.suppress(Exception):
            while await self._stream.read_stderr(_READ_CHUNK):
                pass

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(Exception):
                self._stream.close()


def needs_fresh_session(operation: str, capabilities: list[str] | None, serve_dispatch: bool = True) -> bool:
    """Whether `operation` must run as one call in a new session on a peer with these capabilities.

    An operation that depends on the environment a new login gets now (its `fresh_environment`,
    courier/ops/: PATH above all, which a long-lived serve process keeps from when it started)
    never travels over a serve session: version lists the harnesses found on PATH now (docs/courier.md).
    dispatch and continue start an owner that runs the harness found there: they take the serve
    session on a peer listing `dispatch-in-serve` (a Ray head, whose runs start on its nodes:
    docs/ray.md#cost), and with `serve_dispatch` (`courier.dispatch_over_serve`, on by default) on a
    peer listing `login-watch`, whose session hands a run to a new login once the machine's login files
    changed or when its PATH lacks the harness; else a session of their own.
    """
    from courier.capabilities import DISPATCH_IN_SERVE, LOGIN_WATCH
    from courier.ops import REGISTRY

    op = REGISTRY.get(operation)
    if op is None or not op.fresh_environment:
        return False
    if op.cluster != "place":
        return True
    offered = capabilities or []
    if DISPATCH_IN_SERVE in offered:
        return False
    return not (serve_dispatch and LOGIN_WATCH in offered)


def needs_new_login(outcome: Outcome) -> bool:
    """Whether a serve session refused a run as needing the environment of a new login (`new_login`)."""
    if b'"new_login"' not in outcome.stdout:
        return False
    from protocol.reply import BadReply, find_reply

    try:
        return find_reply(outcome.stdout).get("failure_kind") == "new_login"
    except BadReply:
        return False


def version_payload() -> bytes:
    from protocol.models import RemoteRequest

    return RemoteRequest.of("version").encode()


def capabilities_of(outcome: Outcome) -> list[str]:
    """The capabilities a `version` outcome lists; [] for anything else (an older or failing peer)."""
    from protocol.reply import BadReply, find_reply

    if outcome.exit_status != 0 or outcome.overflow:
        return []
    try:
        document = find_reply(outcome.stdout)
    except BadReply:
        return []
    value = document.get("capabilities")
    if not isinstance(value, list):
        return []
    return [item for item in value if isinstance(item, str)]
