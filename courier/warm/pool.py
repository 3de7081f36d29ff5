"""The courier's SSH connections: one verified connection per machine, bounded channels, serve mode.

Every call re-reads known_hosts and re-checks the key the open connection's server
presented; a key removed or changed there drops the connection, and the fresh connect
that follows reports exactly what a cold call would (changed key, unknown key). A
connection found dropped is re-established once per call, transparently. At most
`max_sessions` channels are open per connection; more concurrent calls queue. With a peer
whose `version` lists `serve` (asked once per connection, after its first call), calls
travel as JSON lines over one long-lived `wb --wb-internal-agent-serve` channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
import time
from dataclasses import dataclass
from typing import Any

from courier.capabilities import SERVE
from courier.errors import ConnectionLost, ReplyUntrusted, TransportError
from courier.remote import ssh
from courier.remote.pool import _renamed as renamed
from courier.remote.reply import BadReply, find_reply
from protocol import limits
from protocol.entry import REMOTE_ARGUMENT, SERVE_ARGUMENT
from protocol.models import RemoteRequest
from protocol.timestamps import rfc3339, utc_now

_READ_CHUNK = limits.SSH_READ_CHUNK_BYTES
_REPLY_ID = re.compile(rb'^\{"request_id":"(r[0-9]{1,12})",')
# A session refused while none of ours is open is asked again this many times, pausing
# 50 ms, 100 ms, … (a session that just ended may not be released by the server yet).
_REFUSED_ALONE_TRIES = 6
_REFUSED_PAUSE_S = 0.05
_VERSION_PAYLOAD = RemoteRequest.of("version").encode()


class ServeEnded(ConnectionLost):
    """The serve process ended (upgraded, crashed, or its channel closed) before this reply came."""


@dataclass(frozen=True)
class CallSpec:
    endpoint: ssh.Endpoint
    command: str  # `<wb> --wb-internal-agent-remote`, exactly as a cold call runs it
    payload: bytes
    operation: str
    max_sessions: int


class ServeChannel:
    """One `wb --wb-internal-agent-serve`: request lines out, reply lines in, matched by request_id."""

    def __init__(self, stream: ssh.Stream, machine: str) -> None:
        self._stream = stream
        self._machine = machine
        self._pending: dict[str, asyncio.Future[bytes]] = {}
        self._next = 0
        self.closed = False
        self._reader = asyncio.ensure_future(self._read_replies())
        self._stderr = asyncio.ensure_future(self._drain_stderr())

    async def ask(self, payload: bytes) -> ssh.Outcome:
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
        return ssh.Outcome(stdout=reply, stderr=b"", exit_status=0, exit_signal=None)

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


class Peer:
    """One machine as one configuration reaches it: its connection, channels and counters."""

    def __init__(self, endpoint: ssh.Endpoint, command: str, max_sessions: int, handshake: asyncio.Lock) -> None:
        self.endpoint = endpoint  # the first machine that reached it (aliases of one host share a peer)
        self._handshake = handshake
        self.command = command
        self.max_sessions = max_sessions
        self.connection: ssh.Connection | None = None
        self.opened_at = 0.0
        self.calls = 0
        self.reconnects = 0
        self.in_use = 0
        self.peak = 0
        self.capabilities: list[str] | None = None  # asked at most once per connection
        self.serve: ServeChannel | None = None
        self._limit = max_sessions  # lowered to what the server held when it refuses a session
        self._gate = asyncio.Condition()
        self._connect_lock = asyncio.Lock()
        self._opening: asyncio.Future[ssh.Connection] | None = None
        self._side_task: asyncio.Task[None] | None = None
        self._releases: set[asyncio.Future[None]] = set()

    @property
    def mode(self) -> str:
        if self.serve is not None and not self.serve.closed:
            return "serve"
        if self.connection is not None and self.capabilities is None:
            return "probing"
        return "session"

    async def call(self, settings: Any, spec: CallSpec) -> ssh.Outcome:
        """One call; a connection (or serve session) lost under it is re-established once (§16)."""
        self.calls += 1
        for attempt in (1, 2):
            connection, _ = await self._connection(settings)
            try:
                serve = self.serve
                if serve is not None and not serve.closed:
                    return await serve.ask(spec.payload)
                outcome = await self._session(connection, spec.command, spec.payload, or_serve=True)
                self._after_call(connection)
                return outcome
            except ConnectionLost as exc:
                _log(f"{self.endpoint.machine}: attempt {attempt} of the {spec.operation} call: {exc.message}")
                if attempt == 2:
                    raise
                # Dropped connection, or a serve process that ended (upgraded, crashed): start afresh.
                self.reconnects += 1
                await self._drop(connection)
        raise AssertionError("unreachable")

    async def _connection(self, settings: Any) -> tuple[ssh.Connection, bool]:
        """The open connection, re-verified; or a new one (concurrent callers share one handshake and its failure)."""
        async with self._connect_lock:
            opening = self._opening
            if opening is None:
                current = self.connection
                if current is not None and (current.closed or not current.host_key_still_trusted(settings)):
                    await self._drop(current)
                    current = None
                if current is not None:
                    return current, False
                opening = self._opening = asyncio.ensure_future(self._open())
                opening.add_done_callback(self._opened)
        # Shielded: one caller's deadline must not cancel the handshake the others wait on.
        return await asyncio.shield(opening), True

    async def _open(self) -> ssh.Connection:
        async with self._handshake:  # one handshake at a time per address (sshd's MaxStartups)
            connection = await ssh.connect(self.endpoint)
        self.connection = connection
        self.opened_at = time.time()
        self.capabilities = None
        self.serve = None
        return connection

    def _opened(self, future: asyncio.Future[ssh.Connection]) -> None:
        if self._opening is future:
            self._opening = None
        if not future.cancelled():
            future.exception()  # retrieved: waiters that gave up must not leave it unobserved

    def _serve_ready(self) -> bool:
        return self.serve is not None and not self.serve.closed

    async def _take_slot(self, *, or_serve: bool = False) -> bool:
        """A channel slot (True); or, with `or_serve`, False as soon as a serve session can take the call."""
        async with self._gate:
            await self._gate.wait_for(lambda: self.in_use < self._limit or (or_serve and self._serve_ready()))
            if or_serve and self._serve_ready():
                return False
            self.in_use += 1
            self.peak = max(self.peak, self.in_use)
            return True

    async def _release_slot(self) -> None:
        async with self._gate:
            self.in_use -= 1
            self._gate.notify_all()

    async def _session(
        self, connection: ssh.Connection, command: str, payload: bytes, *, or_serve: bool = False
    ) -> ssh.Outcome:
        """One command as one channel; a server that allows fewer sessions than we open gets fewer.

        With `or_serve`, a call still waiting for a channel when a serve session starts goes there.
        """
        pause_s = _REFUSED_PAUSE_S
        alone_refusals = 0
        while True:
            if not await self._take_slot(or_serve=or_serve):
                assert self.serve is not None
                return await self.serve.ask(payload)
            others = 0
            try:
                return await connection.run(command, payload)
            except ssh.SessionRefused:
                others = self.in_use - 1
                self._limit = max(1, min(self._limit, others))
                if others == 0:
                    alone_refusals += 1
                    if alone_refusals >= _REFUSED_ALONE_TRIES:
                        raise
            finally:
                await self._release_slot()
            if others == 0:  # the server may not have released a session that just ended on our side
                await asyncio.sleep(pause_s)
                pause_s *= 2

    def _after_call(self, connection: ssh.Connection) -> None:
        """Learn the peer's capabilities once per connection; keep a serve process when it has one."""
        if self._side_task is not None and not self._side_task.done():
            return
        if self.capabilities is None or (SERVE in self.capabilities and (self.serve is None or self.serve.closed)):
            self._side_task = asyncio.ensure_future(self._prepare_serve(connection))

    async def _prepare_serve(self, connection: ssh.Connection) -> None:
        with contextlib.suppress(TransportError, OSError):
            if self.capabilities is None:
                outcome = await self._session(connection, self.command, _VERSION_PAYLOAD)
                self.capabilities = _capabilities(outcome)
            if SERVE not in self.capabilities or connection is not self.connection or connection.closed:
                return
            if not self.command.endswith(REMOTE_ARGUMENT):
                return
            await self._take_slot()  # the serve channel holds one of the slots for its life
            try:
                stream = await connection.start(self.command[: -len(REMOTE_ARGUMENT)] + SERVE_ARGUMENT)
            except BaseException:
                await self._release_slot()
                raise
            channel = ServeChannel(stream, self.endpoint.machine)
            channel._reader.add_done_callback(lambda _: self._release_later())
            self.serve = channel
            async with self._gate:
                self._gate.notify_all()  # calls waiting for a channel can take the serve session now

    def _release_later(self) -> None:
        self._releases.add(task := asyncio.ensure_future(self._release_slot()))
        task.add_done_callback(self._releases.discard)

    async def _drop(self, connection: ssh.Connection) -> None:
        if self.serve is not None:
            self.serve.close()
            self.serve = None
        if self.connection is connection:
            self.connection = None
            self.capabilities = None
        with contextlib.suppress(Exception):
            await connection.close()

    async def close(self) -> None:
        if self._side_task is not None:
            self._side_task.cancel()
        if self.connection is not None:
            await self._drop(self.connection)

    def describe(self) -> dict[str, Any]:
        return {
            "machine": self.endpoint.machine,
            "host": self.endpoint.host,
            "connected": self.connection is not None and not self.connection.closed,
            "connection_age_s": round(time.time() - self.opened_at, 1) if self.connection is not None else None,
            "connected_at": self.opened_at if self.connection is not None else None,
            "calls": self.calls,
            "reconnects": self.reconnects,
            "mode": self.mode,
            "channels_in_use": self.in_use,
            "peak_channels": self.peak,
            "max_sessions": self.max_sessions,
            "session_limit": self._limit,
        }


def _log(message: str) -> None:
    """One line in the courier's log (its stderr): reconnects are worth knowing about afterwards."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"{rfc3339(utc_now())} courier: {message}\n")
        sys.stderr.flush()


def _capabilities(outcome: ssh.Outcome) -> list[str]:
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


class Pool:
    """Peers keyed by where the ssh config resolves the machine to now (aliases of one host share
    one, contract §8.1), the wb command and the channel bound; a changed ssh config means a new one."""

    def __init__(self) -> None:
        self.peers: dict[tuple[object, ...], Peer] = {}
        self._handshakes: dict[str, asyncio.Lock] = {}

    async def call(self, spec: CallSpec) -> ssh.Outcome:
        address, connection_key = ssh.connection_key(spec.endpoint)
        settings = ssh.resolve(spec.endpoint)
        key = (connection_key, ssh.settings_key(settings), spec.command, spec.max_sessions)
        peer = self.peers.get(key)
        if peer is None:
            handshake = self._handshakes.setdefault(address, asyncio.Lock())
            peer = self.peers[key] = Peer(spec.endpoint, spec.command, spec.max_sessions, handshake)
        try:
            return await peer.call(settings, spec)
        except TransportError as exc:
            raise renamed(exc, peer.endpoint.machine, spec.endpoint.machine) from None

    def describe(self) -> list[dict[str, Any]]:
        return sorted((peer.describe() for peer in self.peers.values()), key=lambda row: str(row["machine"]))

    async def close(self) -> None:
        for peer in self.peers.values():
            with contextlib.suppress(Exception):
                await peer.close()
