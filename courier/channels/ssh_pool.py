"""The one SSH connection pool: one connection per resolved host, bounded sessions, for fan-outs and the courier.

Calls whose endpoints resolve to one connection key (aliases of one host:port and user,
docs/cli.md "fleet") share one connection, a few sessions at a time, so a fleet of aliases
costs sshd one handshake (OpenSSH's MaxStartups drops handshakes beyond 10 at a time);
connections to one address hand-shake one at a time. A server that refuses a session
(a MaxSessions below ours) gets fewer: the refused-session retry loop is `Peer._session`.

Two lives (docs/courier.md):
- a fan-out's pool (`persistent=False`, inside `courier.channels.ssh.pooled()`): opened for one
  command, closed at its end; one handshake per key, its failure shared by every alias.
- the courier's pool (`persistent=True`): every call re-reads known_hosts and re-checks the key
  the open connection's server presented (a key removed or changed there drops the
  connection, and the fresh connect reports what a cold call would); a connection found
  dropped is re-established once per call; with a peer whose `version` lists `serve`, calls
  travel as JSON lines over one long-lived `wb --wb-internal-agent-serve` channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from typing import Any

from courier.capabilities import SERVE
from courier.channels import ssh_client as ssh
from courier.channels.channel import DEFAULT_BOUNDS, Bounds, Outcome
from courier.channels.serve_lines import ServeChannel, capabilities_of, needs_fresh_session, version_payload
from courier.errors import ConnectionLost, TransportError
from protocol import limits
from protocol.entry import REMOTE_ARGUMENT, SERVE_ARGUMENT
from protocol.timestamps import rfc3339, utc_now

# A session refused while none of ours is open is asked again this many times, pausing
# 50 ms, 100 ms, … (a session that just ended may not be released by the server yet).
_REFUSED_ALONE_TRIES = 6
_REFUSED_PAUSE_S = 0.05


class Peer:
    """One connection (being opened or open), the machine it was opened for, its session slots and serve session.

    At most `max_sessions` sessions are open at once (8 for a fan-out, below OpenSSH's
    default MaxSessions; `courier.max_sessions` for the courier), lowered to what the
    server held when it refuses one.
    """

    def __init__(
        self, endpoint: ssh.Endpoint, command: str, max_sessions: int, handshake: asyncio.Lock, *, persistent: bool
    ) -> None:
        self.endpoint = endpoint  # the first machine that reached it (aliases of one host share a peer)
        self._handshake = handshake
        self.persistent = persistent
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
        self._limit = max_sessions
        self._gate = asyncio.Condition()
        self._connect_lock = asyncio.Lock()
        self._opening: asyncio.Future[ssh.Connection] | None = None
        self._side_task: asyncio.Task[None] | None = None
        self._releases: set[asyncio.Future[None]] = set()

    @property
    def mode(self) -> str:
        if self._serve_ready():
            return "serve"
        if self.connection is not None and self.capabilities is None:
            return "probing"
        return "session"

    async def call(
        self, command: str, payload: bytes, operation: str, bounds: Bounds, settings: ssh.Settings
    ) -> Outcome:
        """One call; for the courier, a connection (or serve session) lost under it is re-established once.

        `settings`: the ssh config as it applies to the caller's machine now (Pool.call resolved it).
        """
        self.calls += 1
        if not self.persistent:
            connection = await self._shared_connection()
            return await self._session(connection, command, payload, bounds)
        fresh = needs_fresh_session(operation, self.capabilities)
        for attempt in (1, 2):
            connection = await self._connection(settings)
            try:
                serve = self.serve
                if serve is not None and not serve.closed and not fresh:
                    return await serve.ask(payload)
                outcome = await self._session(connection, command, payload, bounds, or_serve=not fresh)
                self._after_call(connection)
                return outcome
            except ConnectionLost as exc:
                _log(f"{self.endpoint.machine}: attempt {attempt} of the {operation} call: {exc.message}")
                if attempt == 2:
                    raise
                # Dropped connection, or a serve process that ended (upgraded, crashed): start afresh.
                self.reconnects += 1
                await self._drop(connection)
        raise AssertionError("unreachable")

    async def _shared_connection(self) -> ssh.Connection:
        """A fan-out's one connection: opened once, its failure (if any) shared by every caller."""
        if self._opening is None:
            self._opening = asyncio.ensure_future(self._open())
        # Shielded: one caller's deadline must not cancel the handshake the others wait on.
        return await asyncio.shield(self._opening)

    async def _connection(self, settings: ssh.Settings) -> ssh.Connection:
        """The open connection, re-verified; or a new one (concurrent callers share one handshake and its failure)."""
        async with self._connect_lock:
            opening = self._opening
            if opening is None:
                current = self.connection
                if current is not None and (current.closed or not current.host_key_still_trusted(settings)):
                    await self._drop(current)
                    current = None
                if current is not None:
                    return current
                opening = self._opening = asyncio.ensure_future(self._open())
                opening.add_done_callback(self._opened)
        return await asyncio.shield(opening)

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
        """A session slot (True); or, with `or_serve`, False as soon as a serve session can take the call."""
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
        self, connection: ssh.Connection, command: str, payload: bytes, bounds: Bounds, *, or_serve: bool = False
    ) -> Outcome:
        """One command as one session; a server that allows fewer sessions than we open gets fewer.

        With `or_serve`, a call still waiting for a slot when a serve session starts goes there.
        """
        pause_s = _REFUSED_PAUSE_S
        alone_refusals = 0
        while True:
            if not await self._take_slot(or_serve=or_serve):
                assert self.serve is not None
                return await self.serve.ask(payload)
            others = 0
            try:
                return await connection.run(
                    command, payload, stdout_max=bounds.stdout_max, stderr_max=bounds.stderr_max
                )
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
        if self.capabilities is None or (SERVE in self.capabilities and not self._serve_ready()):
            self._side_task = asyncio.ensure_future(self._prepare_serve(connection))

    async def _prepare_serve(self, connection: ssh.Connection) -> None:
        with contextlib.suppress(TransportError, OSError):
            if self.capabilities is None:
                outcome = await self._session(connection, self.command, version_payload(), DEFAULT_BOUNDS)
                self.capabilities = capabilities_of(outcome)
            if SERVE not in self.capabilities or connection is not self.connection or connection.closed:
                return
            if not self.command.endswith(REMOTE_ARGUMENT):
                return
            await self._take_slot()  # the serve session holds one of the slots for its life
            try:
                stream = await connection.start(self.command[: -len(REMOTE_ARGUMENT)] + SERVE_ARGUMENT)
            except BaseException:
                await self._release_slot()
                raise
            channel = ServeChannel(stream, self.endpoint.machine)
            channel.when_ended(lambda _: self._release_later())
            self.serve = channel
            async with self._gate:
                self._gate.notify_all()  # calls waiting for a slot can take the serve session now

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
        opening = self._opening
        if opening is not None and not opening.done():
            opening.cancel()
        if opening is not None:
            with contextlib.suppress(BaseException):
                await opening
        if self.connection is not None:
            await self._drop(self.connection)

    def describe(self) -> dict[str, Any]:
        return {
            "machine": self.endpoint.machine,
            "channel": "ssh",
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


class Pool:
    """Peers keyed by where the ssh config resolves the machine to now (aliases of one host share one).

    The courier's key also holds the resolved settings, the wb command and the session bound:
    a changed ssh config or wb_path means a new peer (its serve session runs that command).
    """

    def __init__(self, *, persistent: bool) -> None:
        self.persistent = persistent
        self.peers: dict[object, Peer] = {}
        self._handshakes: dict[str, asyncio.Lock] = {}

    async def call(
        self,
        endpoint: ssh.Endpoint,
        command: str,
        payload: bytes,
        *,
        operation: str = "",
        max_sessions: int = limits.SSH_CHANNELS_PER_CONNECTION_MAX,
        bounds: Bounds = DEFAULT_BOUNDS,
    ) -> Outcome:
        """Run one command over the shared connection for `endpoint`; errors name `endpoint.machine`."""
        # Resolved once per call (the ssh config parsed once): the pool's key and, for the
        # courier, the known-hosts files the open connection's key is checked against.
        settings = ssh.resolve(endpoint)
        address, connection_key = ssh.connection_key(endpoint, settings)
        key: object = connection_key
        if self.persistent:
            key = (connection_key, ssh.settings_key(settings), command, max_sessions)
        peer = self.peers.get(key)
        if peer is None:
            handshake = self._handshakes.setdefault(address, asyncio.Lock())
            peer = self.peers[key] = Peer(endpoint, command, max_sessions, handshake, persistent=self.persistent)
        try:
            return await peer.call(command, payload, operation, bounds, settings)
        except TransportError as exc:
            raise renamed(exc, peer.endpoint.machine, endpoint.machine) from None

    def describe(self) -> list[dict[str, Any]]:
        return [peer.describe() for peer in self.peers.values()]

    async def close(self) -> None:
        for peer in self.peers.values():
            with contextlib.suppress(Exception):
                await peer.close()
        self.peers.clear()


def renamed(exc: TransportError, opened_for: str, machine: str) -> TransportError:
    """The error as the caller's own machine would have seen it (the shared one names the first machine)."""
    message, rest = exc.message, exc.message[len(opened_for) :]
    if opened_for != machine and message.startswith(opened_for) and rest[:1] in (" ", ":"):
        message = machine + rest
    return type(exc)(message, cause=exc.cause)
