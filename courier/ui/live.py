"""The live parts (docs/ui.md, "Live"): server-sent events fed by `wb agent watch` and `logs --follow`.

`Changes` runs one `courier.client.watching.Watch` for the server's machines (one pending call per
machine, as `wb agent watch` keeps) and hands each event to every open fleet page, which
then fetches its rows again; it runs the CLI's blocking code on a daemon thread, so Ctrl-C
never waits for a machine that does not answer. The watch starts with the first fleet page
that listens: a `wb ui` nobody has looked at asks no machine anything. `follow_lines` runs
`logs --follow`'s loop (courier/client/following.py) for one run's page on the event loop, so closing
the page cancels it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import threading
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING

from courier.config import Config
from courier.errors import UsageError, WbError
from protocol import limits
from protocol.documents import MachineErrorEvent

if TYPE_CHECKING:
    from courier.client.client import Client

KEEPALIVE_S = 15.0


def sse(data: str, event: str = "") -> str:
    head = f"event: {event}\n" if event else ""
    return head + "".join(f"data: {line}\n" for line in data.split("\n")) + "\n"


class Changes:
    """The watch of the page's machines, fanned out to every subscriber's queue."""

    def __init__(self, config: Config, machines: list[str]) -> None:
        self.config = config
        self.machines = machines
        self.subscribers: set[asyncio.Queue[str]] = set()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stopping = threading.Event()
        self.watch: object = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """The server's loop; the watch itself waits for the first listener (`_watch`)."""
        self.loop = loop

    def _watch(self) -> None:
        from courier.client.watching import Watch

        if self.watch is not None or self.stopping.is_set():
            return
        fleet = Watch(self.config, self.machines, warn=lambda _: None)
        self.watch = fleet
        fleet.start()

        def pump() -> None:
            answered: set[str] = set()
            while not self.stopping.is_set():
                try:
                    machine, events = fleet.events.get(timeout=0.5)
                except queue.Empty:
                    continue
                if machine not in answered:
                    # Its first answer: what changed before the watch had a cursor there is fetched now.
                    answered.add(machine)
                    self._publish(json.dumps({"event": "watching", "machine": machine}))
                for event in events:
                    if isinstance(event, MachineErrorEvent):
                        body = {"event": event.event, "machine": event.machine}
                    else:
                        body = {"event": event.event, "ref": event.ref, "state": event.state}
                    self._publish(json.dumps(body))
            fleet.stop()

        threading.Thread(target=pump, daemon=True, name="wb ui watch").start()

    def stop(self) -> None:
        self.stopping.set()

    def _publish(self, data: str) -> None:
        loop = self.loop
        if loop is None:
            return
        def deliver() -> None:
            for subscriber in list(self.subscribers):
                subscriber.put_nowait(data)

        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(deliver)

    async def stream(self) -> AsyncIterator[str]:
        mine: asyncio.Queue[str] = asyncio.Queue()
        self.subscribers.add(mine)
        self._watch()
        try:
            yield ": watching\n\n"
            while True:
                try:
                    data = await asyncio.wait_for(mine.get(), KEEPALIVE_S)
                except TimeoutError:
                    yield ": keepalive\n\n"
                    continue
                yield sse(data, "change")
        finally:
            self.subscribers.discard(mine)


# A follow call to this machine runs on a thread that cannot be cancelled: it waits at most this
# long, so a page that went away leaves no thread behind for longer (docs/ui.md, "Live").
LOCAL_FOLLOW_CHUNK_MS = 2000


async def follow_events(client: Client, machine: str, run_id: str) -> AsyncGenerator[tuple[str, str], None]:
    """`logs --follow`'s loop (courier/client/following.py `follow`) as (kind, text) pairs, on the event loop.

    Each call is awaited here, not on a thread of its own, so when the page goes away (Starlette
    cancels its stream) the pending call is cancelled with it: the exec or SSH child that carries
    it is ended, here and with it the receiver on the far machine. A call to this machine waits at
    most LOCAL_FOLLOW_CHUNK_MS, so its thread ends within that.
    """
    from courier.client.asking import upgrade_message
    from courier.client.following import request, retryable, terminal_line
    from courier.ops.await_ import await_chunk_ms
    from courier.text import sanitize

    offset, failures = 0, 0
    while True:
        chunk_ms = await_chunk_ms() if machine else min(await_chunk_ms(), LOCAL_FOLLOW_CHUNK_MS)
        call = request("logs", agent_id=run_id, follow=True, follow_from=offset, wait_timeout_ms=chunk_ms)
        try:
            response = await client.ask_async(machine, call)
        except WbError as exc:
            if not retryable(exc) or failures >= limits.FOLLOW_RETRIES:
                raise
            failures += 1
            again = f"following again from byte {offset} (attempt {failures} of {limits.FOLLOW_RETRIES})"
            yield "warning", f"{exc.message}; {again}"
            await asyncio.sleep(min(2.0**failures / 4, 5.0))
            continue
        failures = 0
        if response.next_offset is None:
            raise UsageError(upgrade_message(machine, response.wb_version, "logs --follow"))
        times = response.action_times or []
        for index, line in enumerate(sanitize(response.logs or "", keep_newlines=True).splitlines()):
            # logs indents each action; the page does not. Its time, when the machine noted one, goes with it.
            at = times[index] if index < len(times) else None
            yield "action", json.dumps({"at": at, "text": line.removeprefix("  ")}, ensure_ascii=True)
        offset = response.next_offset
        result = response.result_of()
        if result.terminal:
            yield "line", terminal_line(result).rstrip("\n")
            return


async def follow_lines(client: Client, machine: str, run_id: str) -> AsyncIterator[str]:
    """The run's worker actions as `logs --follow` prints them, one event a line; `end` once it is terminal.

    A keepalive comment every KEEPALIVE_S while the machine is silent. When the page goes away,
    Starlette cancels this generator's task: the follow's pending call is cancelled in `finally`
    and nothing of it outlives the page.
    """
    events = follow_events(client, machine, run_id)
    pending: asyncio.Task[tuple[str, str]] | None = None
    try:
        yield ": following\n\n"
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(events))
            done, _ = await asyncio.wait({pending}, timeout=KEEPALIVE_S)
            if not done:
                yield ": keepalive\n\n"
                continue
            task, pending = pending, None
            try:
                kind, text = task.result()
            except StopAsyncIteration:
                yield sse("terminal", "end")
                return
            except WbError as exc:
                yield sse(exc.message, "error")
                yield sse("terminal", "end")
                return
            except Exception as exc:  # shown on the page, as the CLI would print it
                yield sse(f"internal: {type(exc).__name__}: {exc}", "error")
                yield sse("terminal", "end")
                return
            yield sse(text, "" if kind == "line" else kind)
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        with contextlib.suppress(BaseException):
            await events.aclose()
