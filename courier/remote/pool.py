"""One connection per host for a fan-out (docs/cli.md, wb agent list): calls to one resolved host share it, a few
channels at a time.

Inside `pooled()`, `client.call_async` runs each call as one more session of the
connection its endpoint resolves to (aliases of one host:port and user share one), so a
fleet of aliases costs sshd one handshake instead of one per alias (OpenSSH's MaxStartups
drops handshakes beyond 10 at a time). Connections that cannot be shared but reach one
address hand-shake one at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextvars import ContextVar

from courier.errors import TransportError
from courier.remote import ssh
from protocol import limits

# A session refused while none of ours is open is asked again this many times, pausing
# 50 ms, 100 ms, … (a session that just ended may not be released by the server yet).
_REFUSED_ALONE_TRIES = 6
_REFUSED_PAUSE_S = 0.05


class _Shared:
    """One connection being opened or open, the machine it was opened for, and its session slots.

    At most `limit` sessions are open at once: 8, below OpenSSH's default MaxSessions, and
    lowered to what the server held when it refuses one (a stricter MaxSessions).
    """

    def __init__(self, machine: str, opening: asyncio.Future[ssh.Connection]) -> None:
        self.machine = machine
        self.opening = opening
        self.limit = limits.SSH_CHANNELS_PER_CONNECTION_MAX
        self.open = 0
        self.gate = asyncio.Condition()

    async def session(self, connection: ssh.Connection, command: str, stdin: bytes) -> ssh.Outcome:
        """One command as one session; a server that allows fewer sessions than we open gets fewer."""
        pause_s = _REFUSED_PAUSE_S
        alone_refusals = 0
        while True:
            async with self.gate:
                await self.gate.wait_for(lambda: self.open < self.limit)
                self.open += 1
            others = 0
            try:
                return await connection.run(command, stdin)
            except ssh.SessionRefused:
                others = self.open - 1
                self.limit = max(1, min(self.limit, others))
                if others == 0:
                    alone_refusals += 1
                    if alone_refusals >= _REFUSED_ALONE_TRIES:
                        raise
            finally:
                async with self.gate:
                    self.open -= 1
                    self.gate.notify_all()
            if others == 0:  # the server may not have released a session that just ended on our side
                await asyncio.sleep(pause_s)
                pause_s *= 2


class Pool:
    def __init__(self) -> None:
        self._shared: dict[str, _Shared] = {}
        self._handshakes: dict[str, asyncio.Lock] = {}

    async def run(self, endpoint: ssh.Endpoint, command: str, stdin: bytes) -> ssh.Outcome:
        """Run one command over the shared connection for `endpoint`; errors name `endpoint.machine`."""
        address, key = ssh.connection_key(endpoint)
        shared = self._shared.get(key)
        if shared is None:
            shared = _Shared(endpoint.machine, asyncio.ensure_future(self._open(endpoint, address)))
            self._shared[key] = shared
        try:
            # Shielded: one caller's deadline must not cancel the handshake the others wait on.
            connection = await asyncio.shield(shared.opening)
            return await shared.session(connection, command, stdin)
        except TransportError as exc:
            raise _renamed(exc, shared.machine, endpoint.machine) from None

    async def _open(self, endpoint: ssh.Endpoint, address: str) -> ssh.Connection:
        async with self._handshakes.setdefault(address, asyncio.Lock()):
            return await ssh.connect(endpoint)

    async def close(self) -> None:
        for shared in self._shared.values():
            if not shared.opening.done():
                shared.opening.cancel()
            with contextlib.suppress(BaseException):
                await (await shared.opening).close()
        self._shared.clear()


def _renamed(exc: TransportError, opened_for: str, machine: str) -> TransportError:
    """The error as the caller's own machine would have seen it (the shared one names the first machine)."""
    message, rest = exc.message, exc.message[len(opened_for) :]
    if opened_for != machine and message.startswith(opened_for) and rest[:1] in (" ", ":"):
        message = machine + rest
    return type(exc)(message, cause=exc.cause)


_active: ContextVar[Pool | None] = ContextVar("wb_ssh_pool", default=None)


def active() -> Pool | None:
    """The pool of the enclosing fan-out, if any."""
    return _active.get()


@contextlib.asynccontextmanager
async def pooled() -> AsyncIterator[Pool]:
    """Share connections per host for every call made within (tasks created inside inherit it)."""
    pool = Pool()
    token = _active.set(pool)
    try:
        yield pool
    finally:
        _active.reset(token)
        await pool.close()
