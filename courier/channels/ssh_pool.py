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
  connection, and the fresh connect reports what a cold call would); the rest, the one
  shared by every channel that keeps a serve session (a connection found dropped is
  re-established once per call; with a peer whose `version` lists `serve`, calls travel as
  JSON lines over one long-lived `wb --wb-internal-agent-serve` channel), is `WarmPeer`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from courier.channels import ssh_client as ssh
from courier.channels.channel import DEFAULT_BOUNDS, Bounds, Outcome
from courier.channels.serve_lines import ServeChannel
from courier.channels.ssh_endpoint import Endpoint
from courier.channels.warm_peer import WarmPeer, WarmPeers
from courier.channels.warm_peer import _log as _log  # the pool's log lines are the warm peer's
from courier.errors import TransportError
from protocol import limits
from protocol.entry import REMOTE_ARGUMENT, SERVE_ARGUMENT

# A session refused while none of ours is open is asked again this many times, pausing
# 50 ms, 100 ms, … (a session that just ended may not be released by the server yet).
_REFUSED_ALONE_TRIES = 6
_REFUSED_PAUSE_S = 0.05


class Peer(WarmPeer[ssh.Connection]):
    """One connection (being opened or open), the machine it was opened for, its session slots and serve session.

    At most `max_sessions` sessions are open at once (8 for a fan-out, below OpenSSH's
    default MaxSessions; `courier.max_sessions` for the courier), lowered to what the
    server held when it refuses one. The serve session holds one of them for its life.
    """

    kind = "ssh"

    def __init__(
        self, endpoint: Endpoint, command: str, max_sessions: int, handshake: asyncio.Lock, *, persistent: bool
    ) -> None:
        super().__init__(endpoint.machine, max_sessions)
        self.endpoint = endpoint  # the first machine that reached it (aliases of one host share a peer)
        self._handshake = handshake
        self.persistent = persistent
        self.command = command
        self.connection: ssh.Connection | None = None
        self._connect_lock = asyncio.Lock()
        self._opening: asyncio.Future[ssh.Connection] | None = None
        self._releases: set[asyncio.Future[None]] = set()

    async def call(
        self,
        command: str,
        payload: bytes,
        operation: str,
        bounds: Bounds,
        settings: ssh.Settings,
        serve_dispatch: bool = True,
    ) -> Outcome:
        """One call; for the courier, a connection (or serve session) lost under it is re-established once.

        `settings`: the ssh config as it applies to the caller's machine now (Pool.call resolved it).
        """
        if self.persistent:
            link = lambda: self._connection(settings)  # noqa: E731 - the carry's one way to its connection
            return await self.carry(payload, operation, bounds, link, serve_dispatch=serve_dispatch)
        self.calls += 1
        connection = await self._shared_connection()
        return await self._session(connection, payload, bounds, command=command)

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

    async def _session(
        self,
        link: ssh.Connection,
        payload: bytes,
        bounds: Bounds,
        *,
        or_serve: bool = False,
        command: str | None = None,
    ) -> Outcome:
        """One command as one session; a server that allows fewer sessions than we open gets fewer.

        With `or_serve`, a call still waiting for a slot when a serve session starts goes there.
        `command`: a fan-out's own (aliases with their own wb_path share one connection).
        """
        pause_s = _REFUSED_PAUSE_S
        alone_refusals = 0
        while True:
            if not await self._take_slot(or_serve=or_serve):
                return await self._ask_serve(payload)
            others = 0
            try:
                return await link.run(
                    command or self.command, payload, stdout_max=bounds.stdout_max, stderr_max=bounds.stderr_max
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

    async def _start_serve(self, link: ssh.Connection) -> ServeChannel | None:
        # Not over a connection dropped or replaced while `version` was asked.
        if link is not self.connection or link.closed or not self.command.endswith(REMOTE_ARGUMENT):
            return None
        await self._take_slot()  # the serve session holds one of the slots for its life
        try:
            stream = await link.start(self.command[: -len(REMOTE_ARGUMENT)] + SERVE_ARGUMENT)
        except BaseException:
            await self._release_slot()
            raise
        channel = ServeChannel(stream, self.machine)
        channel.when_ended(lambda _: self._release_later())
        return channel

    def _release_later(self) -> None:
        self._releases.add(task := asyncio.ensure_future(self._release_slot()))
        task.add_done_callback(self._releases.discard)

    async def _lost(self, link: ssh.Connection) -> None:
        await self._drop(link)  # the next attempt connects afresh (and asks `version` again)

    async def _drop(self, connection: ssh.Connection) -> None:
        if self.serve is not None:
            self.serve.close()
            self.serve = None
        if self.connection is connection:
            self.connection = None
            self.capabilities = None
        with contextlib.suppress(Exception):
            await connection.close()

    async def _release(self) -> None:
        opening = self._opening
        if opening is not None and not opening.done():
            opening.cancel()
        if opening is not None:
            with contextlib.suppress(BaseException):
                await opening
        if self.connection is not None:
            await self._drop(self.connection)

    @property
    def connected(self) -> bool:
        return self.connection is not None and not self.connection.closed

    def _open_since(self) -> float | None:
        return self.opened_at if self.connection is not None else None

    @property
    def _can_probe(self) -> bool:
        return self.connection is not None

    def _address(self) -> dict[str, Any]:
        return {"host": self.endpoint.host}


class Pool(WarmPeers[Peer]):
    """Peers keyed by where the ssh config resolves the machine to now (aliases of one host share one).

    The courier's key also holds the resolved settings, the wb command and the session bound:
    a changed ssh config or wb_path means a new peer (its serve session runs that command).
    """

    def __init__(self, *, persistent: bool) -> None:
        super().__init__()
        self.persistent = persistent
        self._handshakes: dict[str, asyncio.Lock] = {}

    async def call(
        self,
        endpoint: Endpoint,
        command: str,
        payload: bytes,
        *,
        operation: str = "",
        max_sessions: int = limits.SSH_CHANNELS_PER_CONNECTION_MAX,
        bounds: Bounds = DEFAULT_BOUNDS,
        serve_dispatch: bool = True,
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
            return await peer.call(command, payload, operation, bounds, settings, serve_dispatch)
        except TransportError as exc:
            raise renamed(exc, peer.endpoint.machine, endpoint.machine) from None


def renamed(exc: TransportError, opened_for: str, machine: str) -> TransportError:
    """The error as the caller's own machine would have seen it (the shared one names the first machine)."""
    message, rest = exc.message, exc.message[len(opened_for) :]
    if opened_for != machine and message.startswith(opened_for) and rest[:1] in (" ", ":"):
        message = machine + rest
    return type(exc)(message, cause=exc.cause)
