"""The `ssh` channel: the argv tail as one command of a verified SSH connection (docs/protocol.md#the-callers-rules).

Strict host keys, no PTY, no forwarding, both outputs read within their caps (all in
`courier.channels.ssh_client`). Inside `pooled()` (a fan-out) calls share the pool's connection per
host; otherwise each call opens its own connection and closes it after. asyncssh (through
`courier.channels.ssh_client` and the pool) is imported by the first SSH call, not by this module: a
fan-out over exec machines only opens a `pooled()` scope too, and must not pay for it.
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import AsyncIterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, ClassVar

from courier.channels import ssh_carrier
from courier.channels.channel import DEFAULT_BOUNDS, Bounds, Channel, Outcome, WarmState
from courier.channels.ssh_endpoint import Endpoint
from courier.config import Target

if TYPE_CHECKING:
    from courier.channels.ssh_pool import Peer, Pool


def command_of(tail: list[str]) -> str:
    """The remote shell's command line: each element quoted, so it is exactly one argument there."""
    return " ".join(shlex.quote(item) for item in tail)


class SshChannel(Channel):
    kind = "ssh"
    target: Target
    target_model: ClassVar[type[Target]] = Target

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(machine=self.machine, host=self.target.host, user=self.target.user, port=self.target.port)

    @property
    def where(self) -> str:
        return f"{self.target.host}:{self.target.port}" if self.target.port else self.target.host

    def machines_row(self) -> dict[str, Any]:
        return {**super().machines_row(), "host": self.target.host, "user": self.target.user, "port": self.target.port}

    def resolved_address(self) -> tuple[str, int] | None:
        """wb.yaml's user and port, else ~/.ssh/config's, else the defaults: what `connect` uses."""
        from courier.channels import ssh_client as ssh
        from courier.errors import TransportError

        try:
            settings = ssh.resolve(self.endpoint)
        except TransportError:
            return None  # a config that cannot be read: the probe's error says why
        return settings.user, settings.port

    async def run(self, tail: list[str], stdin: bytes, bounds: Bounds = DEFAULT_BOUNDS) -> Outcome:
        command = command_of(tail)
        shared = _active.get()
        carrier = ssh_carrier.current()  # the cold CLI's copy that has asyncssh imported (its module docstring)
        if carrier is not None:
            scope = shared.carried() if shared is not None else None
            return await carrier.call(scope, self.endpoint, command, stdin, bounds)
        if shared is not None:
            return await shared.pool().call(self.endpoint, command, stdin, bounds=bounds)
        from courier.channels import ssh_client as ssh

        return await ssh.run_direct(self.endpoint, command, stdin, bounds)

    async def run_warm(
        self,
        state: WarmState,
        tail: list[str],
        stdin: bytes,
        bounds: Bounds,
        *,
        operation: str,
        max_sessions: int,
        serve_dispatch: bool = True,
    ) -> Outcome:
        from courier.channels.ssh_pool import Pool

        pool = state.part(self.kind, lambda: Pool(persistent=True))
        assert isinstance(pool, Pool)
        return await pool.call(
            self.endpoint,
            command_of(tail),
            stdin,
            operation=operation,
            max_sessions=max_sessions,
            bounds=bounds,
            serve_dispatch=serve_dispatch,
        )


class Shared:
    """A `pooled()` scope: the pool its SSH calls share, made by the first of them (none: no asyncssh), in this
    process or in the SSH carrier's."""

    _scopes = 0

    def __init__(self) -> None:
        self._pool: Pool | None = None
        self._carried: int | None = None

    def carried(self) -> int:
        """This scope's number in the carrier, whose pool for it is made by its first call there."""
        if self._carried is None:
            Shared._scopes += 1
            self._carried = Shared._scopes
        return self._carried

    def pool(self) -> Pool:
        if self._pool is None:
            from courier.channels.ssh_pool import Pool

            self._pool = Pool(persistent=False)
        return self._pool

    @property
    def peers(self) -> dict[object, Peer]:
        return self._pool.peers if self._pool is not None else {}

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
        carrier = ssh_carrier.current()
        if self._carried is not None and carrier is not None:
            await carrier.close_scope(self._carried)


_active: ContextVar[Shared | None] = ContextVar("wb_ssh_pool", default=None)


@contextlib.asynccontextmanager
async def pooled() -> AsyncIterator[Shared]:
    """Share connections per host for every SSH call made within (tasks created inside inherit it)."""
    shared = Shared()
    token = _active.set(shared)
    try:
        yield shared
    finally:
        _active.reset(token)
        await shared.close()
