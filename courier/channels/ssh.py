"""The `ssh` channel: the argv tail as one command of a verified SSH connection (docs/protocol.md#the-callers-rules).

Strict host keys, no PTY, no forwarding, both outputs read within their caps (all in
`courier.remote.ssh`). Inside `pooled()` (a fan-out) calls share the pool's connection per
host; otherwise each call opens its own connection and closes it after.
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import AsyncIterator
from contextvars import ContextVar
from typing import ClassVar

from courier.channels.base import DEFAULT_BOUNDS, Bounds, Channel, Outcome, WarmState
from courier.channels.ssh_pool import Pool
from courier.config import Target
from courier.remote import ssh


def command_of(tail: list[str]) -> str:
    """The remote shell's command line: each element quoted, so it is exactly one argument there."""
    return " ".join(shlex.quote(item) for item in tail)


class SshChannel(Channel):
    kind = "ssh"
    target: Target
    target_model: ClassVar[type[Target]] = Target

    @property
    def endpoint(self) -> ssh.Endpoint:
        return ssh.Endpoint(machine=self.machine, host=self.target.host, user=self.target.user, port=self.target.port)

    @property
    def where(self) -> str:
        return f"{self.target.host}:{self.target.port}" if self.target.port else self.target.host

    async def run(self, tail: list[str], stdin: bytes, bounds: Bounds = DEFAULT_BOUNDS) -> Outcome:
        command = command_of(tail)
        shared = _active.get()
        if shared is not None:
            return await shared.call(self.endpoint, command, stdin, bounds=bounds)
        async with await ssh.connect(self.endpoint) as opened:
            return await opened.run(command, stdin, stdout_max=bounds.stdout_max, stderr_max=bounds.stderr_max)

    async def run_warm(
        self, state: WarmState, tail: list[str], stdin: bytes, bounds: Bounds, *, operation: str, max_sessions: int
    ) -> Outcome:
        pool = state.part(self.kind, lambda: Pool(persistent=True))
        assert isinstance(pool, Pool)
        return await pool.call(
            self.endpoint, command_of(tail), stdin, operation=operation, max_sessions=max_sessions, bounds=bounds
        )


_active: ContextVar[Pool | None] = ContextVar("wb_ssh_pool", default=None)


@contextlib.asynccontextmanager
async def pooled() -> AsyncIterator[Pool]:
    """Share connections per host for every SSH call made within (tasks created inside inherit it)."""
    pool = Pool(persistent=False)
    token = _active.set(pool)
    try:
        yield pool
    finally:
        _active.reset(token)
        await pool.close()
