"""The transport seam: `ask(request) -> response` for one machine, whatever carries it.

This machine is one more transport (`LocalTransport` runs the operation in-process and keeps
its typed results); another machine is `RemoteTransport`: the one caller
(`courier.call.caller`: encode, run over the machine's channel, decode and validate once),
whatever channel reaches it (ssh, exec, the courier's socket; docs/architecture.md). Tests
use `MockTransport`. The CLI, `route` and `fleet` obtain transports only from `transport_for`.

A transport returns the peer's reply as it came, in-band refusals included; raising them as
errors is `route.raise_failure`'s job. Everything that stops a reply from arriving is a
TransportError (exit 255).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING

import courier.ops  # noqa: F401  the operation registry installs the wire table `validated` reads
from courier.errors import UsageError
from protocol.models import RemoteRequest, RemoteResponse
from protocol.validate import RequestRefused, validate_request

if TYPE_CHECKING:
    from courier.config import Config


class Transport(ABC):
    """One machine's way in. `machine` is "" for this machine."""

    machine: str = ""

    @abstractmethod
    async def ask_async(self, request: RemoteRequest, *, timeout_s: float | None = None) -> RemoteResponse:
        """Send one request and return the peer's validated reply (in-band refusals included)."""

    def ask(self, request: RemoteRequest, *, timeout_s: float | None = None) -> RemoteResponse:
        import asyncio  # here, not above: a call to this machine never needs an event loop

        return asyncio.run(self.ask_async(request, timeout_s=timeout_s))

    def prepare(self) -> None:
        """Pay the one-time costs of a first call now, before a bounded wait starts counting (none here)."""
        return None


def validated(request: RemoteRequest) -> RemoteRequest:
    """The caller's check before anything is sent or run: a refusal is a usage error (exit 2)."""
    try:
        return validate_request(request)
    except RequestRefused as exc:
        raise UsageError(str(exc)) from None


class LocalTransport(Transport):
    """This machine: the operation runs in this process, its results stay typed."""

    def __init__(self, config: Config) -> None:
        self.config = config

    def ask(self, request: RemoteRequest, *, timeout_s: float | None = None) -> RemoteResponse:
        from courier.executor.perform import perform

        return perform(validated(request), config=self.config, in_process=True)

    async def ask_async(self, request: RemoteRequest, *, timeout_s: float | None = None) -> RemoteResponse:
        from courier.daemon_thread import in_thread

        # A fan-out asks this machine beside the others; its own work must not block them. A thread
        # of its own, not asyncio's pool, whose idle threads outlive the call (a closed run page's).
        return await in_thread(lambda: self.ask(request), name="wb local call")


class RemoteTransport(Transport):
    """Another machine, over the channel its target names (docs/protocol.md): validated before, the reply once."""

    def __init__(self, config: Config, machine: str) -> None:
        self.config = config
        self.machine = machine

    def prepare(self) -> None:
        import courier.call.caller  # noqa: F401 - the caller's imports (asyncssh for ssh targets)

    async def ask_async(self, request: RemoteRequest, *, timeout_s: float | None = None) -> RemoteResponse:
        from courier.call.caller import call_async

        return await call_async(self.config, self.machine, request, timeout_s=timeout_s)


SshTransport = RemoteTransport  # the name before channels (an ssh target is one channel of several)


class MockTransport(Transport):
    """For tests of the CLI and the fleet without processes: `handler` answers every request."""

    def __init__(self, machine: str, handler: Callable[[RemoteRequest], RemoteResponse]) -> None:
        self.machine = machine
        self.handler = handler
        self.requests: list[RemoteRequest] = []

    async def ask_async(self, request: RemoteRequest, *, timeout_s: float | None = None) -> RemoteResponse:
        self.requests.append(request)
        return self.handler(validated(request))


_override: Callable[[Config, str], Transport] | None = None


def transport_for(config: Config, machine: str) -> Transport:
    """The transport to `machine` ("" = this machine). An unknown or misconfigured machine is a usage error."""
    if _override is not None:
        return _override(config, machine)
    if not machine:
        return LocalTransport(config)
    config.target(machine)  # refuses an unknown or misconfigured machine before anything else
    return RemoteTransport(config, machine)


@contextlib.asynccontextmanager
async def connections_shared() -> AsyncIterator[None]:
    """Within it, SSH calls to one host share one connection (docs/cli.md, wb agent list): a fan-out's scope."""
    from courier.channels.ssh import pooled

    async with pooled():
        yield


@contextlib.contextmanager
def overridden(factory: Callable[[Config, str], Transport]) -> Iterator[None]:
    """Answer every machine, this one included, with `factory` for the span (tests)."""
    global _override
    previous, _override = _override, factory
    try:
        yield
    finally:
        _override = previous
