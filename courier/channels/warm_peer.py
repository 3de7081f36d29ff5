"""The courier's state for one machine whose channel keeps a serve session (docs/courier.md, "Serve mode")."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, Generic, TypeVar

from courier.capabilities import SERVE
from courier.channels.channel import DEFAULT_BOUNDS, Bounds, Outcome
from courier.channels.serve_lines import (
    ServeChannel,
    capabilities_of,
    needs_fresh_session,
    needs_new_login,
    version_payload,
)
from courier.errors import ConnectionLost, TransportError
from protocol.timestamps import rfc3339, utc_now

# The longest `close` waits for a cancelled preparation to finish being cancelled: one cancelled
# while its serve command starts releases a slot or closes the new child's pipes in callbacks,
# and a loop that ended first would leave them open.
CLOSE_WAIT_S = 2.0
# A peer's serve session is prepared (its `version` probe, the session's start: two receivers started there,
# CPU on the courier's side too) once no call of this courier is in flight, or after this long: during a
# fleet's first fan-out it would compete with the fan-out's own calls (docs/benchmarks.md, fleet).
PREPARE_AFTER_CALLS_S = 10.0
_PREPARE_LOOK_S = 0.05
_calls_in_flight = [0]  # every peer's calls in this process (the courier's one event loop)

Link = TypeVar("Link")  # what a call runs over: SSH's connection; nothing for exec


def _log(message: str) -> None:
    """One line in the courier's log (its stderr): reconnects are worth knowing about afterwards."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"{rfc3339(utc_now())} courier: {message}\n")
        sys.stderr.flush()


class WarmPeer(ABC, Generic[Link]):
    """One machine's warm state: capabilities, serve session, session slots, counters.

    What every channel with a serve session shares: the peer's capabilities, asked once with
    `version`; one long-lived `wb --wb-internal-agent-serve` when the peer lists `serve`, else
    one call per session; the operations that need a fresh environment always on a one-call
    session (`needs_fresh_session`); a call whose serve session or connection was lost under it
    made again once; the `wb courier status` row. A channel supplies what is its own (its link,
    how one call runs as a session of its own, how a serve session starts): SSH's
    `courier.channels.ssh_pool.Peer` (a pooled connection whose host key is re-verified before
    each call), exec's `courier.channels.exec.ExecPeer` (local child processes, no connection).

    At most `max_sessions` one-call sessions run at once (the serve session's requests do not
    count: it answers them concurrently); a channel may lower `_limit` below it (SSH, to what a
    server refusing one more session held).
    """

    kind: ClassVar[str]  # the `channel` of its status row: "ssh", "exec"
    # How long a call arriving while the serve session is being prepared waits for it, instead of
    # running as one more session beside it (0: it does not wait).
    prepare_wait_s: ClassVar[float] = 0.0

    def __init__(self, machine: str, max_sessions: int) -> None:
        self.machine = machine
        self.max_sessions = max_sessions
        self.opened_at = 0.0  # when the link (SSH) or the serve process (exec) the row shows was opened
        self.calls = 0
        self.reconnects = 0
        self.in_use = 0
        self.peak = 0
        self.capabilities: list[str] | None = None  # asked at most once per link
        self.serve: ServeChannel | None = None
        self.closed = False  # retired or the courier stopping: a call still in flight starts nothing after it
        self._limit = max_sessions
        self._gate = asyncio.Condition()
        self._side_task: asyncio.Task[None] | None = None

    # -- what a channel supplies -----------------------------------------------------------

    @abstractmethod
    async def _session(self, link: Link, payload: bytes, bounds: Bounds, *, or_serve: bool = False) -> Outcome:
        """One call as a session of its own (an SSH channel, a child process), in a slot.

        With `or_serve`, a call still waiting for a slot when a serve session starts goes there.
        """

    @abstractmethod
    async def _start_serve(self, link: Link) -> ServeChannel | None:
        """A new serve session over `link`; None when none can start (its command is not wb's remote entry)."""

    async def _lost(self, link: Link) -> None:
        """Let go of what a call found lost under it (the serve session that failed is closed already)."""
        del link

    async def _release(self) -> None:
        """At `close`, end what the peer holds beyond its serve session (a connection, a process)."""

    @property
    @abstractmethod
    def connected(self) -> bool:
        """The status row's `connected`."""

    @abstractmethod
    def _open_since(self) -> float | None:
        """When what the status row's age counts from was opened; None while there is none."""

    @abstractmethod
    def _address(self) -> dict[str, Any]:
        """The status row's field that says where the machine is (`host`, `argv`)."""

    @property
    def _can_probe(self) -> bool:
        """Whether there is a link to ask `version` over (the row says `probing` only then)."""
        return True

    # -- the call ----------------------------------------------------------------------------

    def _serve_ready(self) -> bool:
        return self.serve is not None and not self.serve.closed

    @property
    def mode(self) -> str:
        if self._serve_ready():
            return "serve"
        if self._can_probe and self.capabilities is None:
            return "probing"
        return "session"

    async def carry(
        self,
        payload: bytes,
        operation: str,
        bounds: Bounds,
        link: Callable[[], Awaitable[Link]],
        *,
        serve_dispatch: bool = True,
    ) -> Outcome:
        """One call over the serve session, or as a session of its own; made again once when it was lost.

        `link` makes ready what this attempt runs over (SSH: the open connection, its host key
        re-verified against known_hosts as they are now, or a new connection).
        """
        self.calls += 1
        side = self._side_task
        if self.prepare_wait_s and side is not None and not side.done():
            await asyncio.wait({side}, timeout=self.prepare_wait_s)
        fresh = needs_fresh_session(operation, self.capabilities, serve_dispatch)
        _calls_in_flight[0] += 1
        try:
            return await self._carry(payload, operation, bounds, link, fresh)
        finally:
            _calls_in_flight[0] -= 1

    async def _carry(
        self, payload: bytes, operation: str, bounds: Bounds, link: Callable[[], Awaitable[Link]], fresh: bool
    ) -> Outcome:
        for attempt in (1, 2):
            current = await link()
            try:
                serve = self.serve
                if serve is not None and not serve.closed and not fresh:
                    outcome = await self._ask(serve, payload)
                    if not needs_new_login(outcome):
                        return outcome
                    # The serve session's environment lacks the run's harness: a session of its own has
                    # the environment a new login gets now (docs/courier.md, "Environment").
                    current = await link()
                    outcome = await self._session(current, payload, bounds, or_serve=False)
                    self._after_call(current)
                    return outcome
                outcome = await self._session(current, payload, bounds, or_serve=not fresh)
                self._after_call(current)
                return outcome
            except ConnectionLost as exc:
                _log(f"{self.machine}: attempt {attempt} of the {operation} call: {exc.message}")
                if attempt == 2:
                    raise
                # A dropped connection, or a serve process that ended (upgraded, crashed): the
                # second attempt runs as one call (on a new connection), a new serve session after it.
                self.reconnects += 1
                await self._lost(current)
        raise AssertionError("unreachable")

    async def _ask(self, serve: ServeChannel, payload: bytes) -> Outcome:
        try:
            return await serve.ask(payload)
        except ConnectionLost:
            serve.close()  # its input broke, but its output may stay open (a child holding it): not ready
            raise

    async def _ask_serve(self, payload: bytes) -> Outcome:
        """A call that waited for a slot, on the serve session that started meanwhile."""
        assert self.serve is not None
        return await self._ask(self.serve, payload)

    # -- session slots -----------------------------------------------------------------------

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

    # -- the serve session's preparation -----------------------------------------------------

    def _after_call(self, link: Link) -> None:
        """Learn the peer's capabilities once per link; keep a serve session when it has one."""
        if self.closed:
            return
        if self._side_task is not None and not self._side_task.done():
            return
        if self.capabilities is None or (SERVE in self.capabilities and not self._serve_ready()):
            self._side_task = asyncio.ensure_future(self._prepare_serve(link))

    async def _prepare_serve(self, link: Link) -> None:
        await _after_the_calls_in_flight()
        with contextlib.suppress(TransportError, OSError):
            if self.capabilities is None:
                self.capabilities = capabilities_of(await self._session(link, version_payload(), DEFAULT_BOUNDS))
            if SERVE not in self.capabilities or self.closed:
                return
            serve = await self._start_serve(link)
            if serve is None:
                return
            self.serve = serve
            async with self._gate:
                self._gate.notify_all()  # calls waiting for a slot can take the serve session now

    # -- the end and the status row ----------------------------------------------------------

    async def close(self) -> None:
        self.closed = True
        if self._side_task is not None:
            self._side_task.cancel()
            await asyncio.wait({self._side_task}, timeout=CLOSE_WAIT_S)
        if self.serve is not None:
            self.serve.close()
        await self._release()

    def describe(self) -> dict[str, Any]:
        """This machine's row of `wb courier status` (docs/courier.md, "Settings")."""
        since = self._open_since()
        return {
            "machine": self.machine,
            "channel": self.kind,
            **self._address(),
            "connected": self.connected,
            "connection_age_s": round(time.time() - since, 1) if since is not None else None,
            "connected_at": since,
            "calls": self.calls,
            "reconnects": self.reconnects,
            "mode": self.mode,
            "channels_in_use": self.in_use,
            "peak_channels": self.peak,
            "max_sessions": self.max_sessions,
            "session_limit": self._limit,
        }


PeerT = TypeVar("PeerT", bound=WarmPeer[Any])


class WarmPeers(Generic[PeerT]):
    """One channel kind's peers, keyed by what lets calls share one (in the courier, that kind's `WarmPart`)."""

    def __init__(self) -> None:
        self.peers: dict[Any, PeerT] = {}

    def describe(self) -> list[dict[str, Any]]:
        return [peer.describe() for peer in self.peers.values()]

    async def close(self) -> None:
        for peer in self.peers.values():
            with contextlib.suppress(Exception):
                await peer.close()
        self.peers.clear()


async def _after_the_calls_in_flight() -> None:
    """Return once no call of this process is in flight, or after PREPARE_AFTER_CALLS_S."""
    deadline = asyncio.get_running_loop().time() + PREPARE_AFTER_CALLS_S
    while _calls_in_flight[0] > 0 and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(_PREPARE_LOOK_S)
