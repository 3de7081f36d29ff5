"""The warm peer's own rules (courier/channels/warm_peer.py), on a channel of test doubles.

Both real channels (ssh's Peer, exec's ExecPeer) are driven end to end elsewhere
(tests/integration/test_courier.py, tests/unit/test_exec_peer.py); here each rule of the
shared part is pinned alone: `version` is asked once and a serve session kept after it, the
operations that need a fresh environment take a session of their own, a call lost under it
is made again once, a closed peer starts nothing, and the status row keeps its fields.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from courier.capabilities import DISPATCH_IN_SERVE, LOGIN_WATCH, SERVE
from courier.channels.channel import DEFAULT_BOUNDS, Bounds, Outcome
from courier.channels.serve_lines import ServeChannel
from courier.channels.warm_peer import WarmPeer
from courier.errors import ConnectionLost

STATUS_ROW = [
    "machine",
    "channel",
    "where",
    "connected",
    "connection_age_s",
    "connected_at",
    "calls",
    "reconnects",
    "mode",
    "channels_in_use",
    "peak_channels",
    "max_sessions",
    "session_limit",
]


def _request(operation: str) -> bytes:
    return json.dumps({"operation": operation, "protocol_version": 1}).encode() + b"\n"


class LineStream:
    """A serve process that answers every request line with `{"via": "serve"}`; `broken`: its input is gone;
    `new_login`: it refuses dispatch and continue as needing a new login's environment."""

    def __init__(self, new_login: bool = False) -> None:
        self.replies: asyncio.Queue[bytes] = asyncio.Queue()
        self.broken = False
        self.new_login = new_login

    async def write(self, data: bytes) -> None:
        if self.broken:
            raise ConnectionLost("box: the serve process is gone")
        document = json.loads(data)
        request_id = document["request_id"]
        if self.new_login and document["operation"] in ("dispatch", "continue"):
            refused = b'"schema_version":1,"operation":"dispatch","failure":"no codex","failure_kind":"new_login"'
            await self.replies.put(b'{"request_id":"%s",%s}\n' % (request_id.encode(), refused))
            return
        await self.replies.put(b'{"request_id":"%s","via":"serve"}\n' % request_id.encode())

    async def read(self, size: int) -> bytes:
        return await self.replies.get()

    async def read_stderr(self, size: int) -> bytes:
        return b""

    def close(self) -> None:
        self.replies.put_nowait(b"")


class DoublePeer(WarmPeer[str]):
    """A channel whose one-call sessions answer `{"via": "session"}` (and `version` with `capabilities`)."""

    kind = "double"

    def __init__(
        self, capabilities: list[str], *, sessions_lost: int = 0, serve_dispatch: bool = True, new_login: bool = False
    ) -> None:
        super().__init__("box", max_sessions=4)
        self.serve_dispatch = serve_dispatch
        self.new_login = new_login
        self.offered = capabilities
        self.sessions_lost = sessions_lost  # this many one-call sessions raise ConnectionLost first
        self.sessions: list[str] = []  # the operation of each one-call session, in order
        self.streams: list[LineStream] = []
        self.lost_links: list[str] = []

    async def _session(self, link: str, payload: bytes, bounds: Bounds, *, or_serve: bool = False) -> Outcome:
        if not await self._take_slot(or_serve=or_serve):
            return await self._ask_serve(payload)
        try:
            operation = json.loads(payload)["operation"]
            self.sessions.append(operation)
            if self.sessions_lost:
                self.sessions_lost -= 1
                raise ConnectionLost("box: the connection dropped")
            reply: dict[str, Any] = {"via": "session"}
            if operation == "version":
                reply = {"schema_version": 1, "ok": True, "capabilities": self.offered, "via": "session"}
            return Outcome(stdout=json.dumps(reply).encode(), stderr=b"", exit_status=0, exit_signal=None)
        finally:
            await self._release_slot()

    async def _start_serve(self, link: str) -> ServeChannel | None:
        self.streams.append(stream := LineStream(self.new_login))
        return ServeChannel(stream, self.machine)

    async def _lost(self, link: str) -> None:
        self.lost_links.append(link)

    @property
    def connected(self) -> bool:
        return True

    def _open_since(self) -> float | None:
        return None

    def _address(self) -> dict[str, Any]:
        return {"where": "here"}

    async def ask(self, operation: str) -> str:
        """The call's answer: "serve" or "session"."""
        request = _request(operation)
        outcome = await self.carry(request, operation, DEFAULT_BOUNDS, self._link, serve_dispatch=self.serve_dispatch)
        return str(json.loads(outcome.stdout)["via"])

    async def _link(self) -> str:
        return "link"

    async def prepared(self) -> None:
        """Wait for the probe and serve start the last call began."""
        if self._side_task is not None:
            await asyncio.wait_for(self._side_task, 10)


def _run(scenario: Any) -> None:
    asyncio.run(scenario())


def test_version_is_asked_once_and_a_serve_session_kept_after_the_first_call() -> None:
    async def scenario() -> None:
        peer = DoublePeer([SERVE])
        assert peer.mode == "probing"
        assert await peer.ask("list") == "session"
        await peer.prepared()
        assert peer.mode == "serve" and peer.capabilities == [SERVE]
        assert [await peer.ask("list") for _ in range(3)] == ["serve"] * 3
        assert peer.sessions == ["list", "version"] and len(peer.streams) == 1
        await peer.close()

    _run(scenario)


def test_a_peer_without_serve_is_used_one_call_per_session() -> None:
    async def scenario() -> None:
        peer = DoublePeer([])
        for _ in range(3):
            assert await peer.ask("status") == "session"
            await peer.prepared()
        assert peer.mode == "session" and not peer.streams
        assert peer.sessions == ["status", "version", "status", "status"]  # asked once: [] is an answer
        await peer.close()

    _run(scenario)


@pytest.mark.parametrize(
    ("offered", "serve_dispatch", "on_a_session_of_their_own"),
    [
        ([SERVE, LOGIN_WATCH], True, {"version"}),  # the default (docs/courier.md, "Environment")
        ([SERVE, LOGIN_WATCH], False, {"dispatch", "continue", "version"}),  # courier.dispatch_over_serve: false
        ([SERVE], True, {"dispatch", "continue", "version"}),  # an older peer does not watch its login files
        ([SERVE, DISPATCH_IN_SERVE], False, {"version"}),  # a Ray head (docs/ray.md#cost)
    ],
)
def test_operations_that_need_a_fresh_environment_never_travel_over_the_serve_session(
    offered: list[str], serve_dispatch: bool, on_a_session_of_their_own: set[str]
) -> None:
    async def scenario() -> None:
        peer = DoublePeer(offered, serve_dispatch=serve_dispatch)
        await peer.ask("list")
        await peer.prepared()
        for operation in ("dispatch", "continue", "version", "status", "await", "list", "logs"):
            expected = "session" if operation in on_a_session_of_their_own else "serve"
            assert await peer.ask(operation) == expected, operation
        await peer.close()

    _run(scenario)


def test_a_call_whose_serve_session_was_lost_is_made_again_once_as_a_session_and_the_serve_session_replaced() -> None:
    async def scenario() -> None:
        peer = DoublePeer([SERVE])
        await peer.ask("list")
        await peer.prepared()
        first = peer.serve
        peer.streams[0].broken = True  # upgraded or crashed: the next request line cannot be written
        assert await peer.ask("status") == "session"
        assert peer.reconnects == 1 and peer.lost_links == ["link"]
        assert first is not None and first.closed
        await peer.prepared()
        assert peer.mode == "serve" and peer.serve is not first and len(peer.streams) == 2
        assert await peer.ask("status") == "serve"
        assert peer.describe()["reconnects"] == 1
        await peer.close()

    _run(scenario)


def test_a_call_lost_twice_fails_with_the_second_loss() -> None:
    async def scenario() -> None:
        peer = DoublePeer([SERVE], sessions_lost=2)
        with pytest.raises(ConnectionLost, match="dropped"):
            await peer.ask("list")
        assert peer.reconnects == 1 and peer.sessions == ["list", "list"] and peer.lost_links == ["link"]
        assert peer._side_task is None  # nothing is prepared after a call that failed
        await peer.close()

    _run(scenario)


def test_a_closed_peer_prepares_nothing_after_a_call_still_in_flight() -> None:
    async def scenario() -> None:
        peer = DoublePeer([SERVE])
        await peer.close()  # retired (another caller's environment) or the courier stopping
        assert await peer.ask("list") == "session"
        assert peer._side_task is None and not peer.streams and peer.sessions == ["list"]

    _run(scenario)


def test_the_status_row_has_its_thirteen_fields_in_order() -> None:
    async def scenario() -> None:
        peer = DoublePeer([SERVE])
        await peer.ask("list")
        await peer.prepared()
        row = peer.describe()
        assert list(row) == STATUS_ROW
        assert row["channel"] == "double" and row["mode"] == "serve" and row["calls"] == 1
        assert row["max_sessions"] == row["session_limit"] == 4 and row["peak_channels"] == 1
        await peer.close()

    _run(scenario)


def test_with_dispatch_over_serve_dispatch_and_continue_take_the_serve_session() -> None:
    """`courier.dispatch_over_serve` (on by default, docs/courier.md, "Environment"): only `version` needs a new
    login then."""

    async def scenario() -> None:
        peer = DoublePeer([SERVE, LOGIN_WATCH])
        await peer.ask("list")
        await peer.prepared()
        for operation in ("dispatch", "continue", "version", "status"):
            assert await peer.ask(operation) == ("session" if operation == "version" else "serve"), operation
        await peer.close()

    _run(scenario)


def test_a_run_the_serve_session_refuses_as_needing_a_new_login_is_asked_again_on_a_session_of_its_own() -> None:
    async def scenario() -> None:
        peer = DoublePeer([SERVE, LOGIN_WATCH], new_login=True)
        await peer.ask("list")
        await peer.prepared()
        assert await peer.ask("dispatch") == "session"
        assert peer.sessions[-1] == "dispatch" and await peer.ask("status") == "serve"
        await peer.close()

    _run(scenario)
