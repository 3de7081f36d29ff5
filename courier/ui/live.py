"""The live parts (docs/ui.md, "Live"): server-sent events fed by `wb agent watch` and `logs --follow`.

`Changes` runs one `courier.watch.Watch` for the server's machines (one pending call per
machine, as `wb agent watch` keeps) and hands each event to every open fleet page, which
then fetches its rows again. `follow_lines` runs `logs --follow`'s loop (courier/supervise.py)
for one run's page. Both run the CLI's blocking code on daemon threads, so Ctrl-C never
waits for a machine that does not answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import threading
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

from courier.config import Config
from courier.errors import WbError
from protocol.documents import MachineErrorEvent

T = TypeVar("T")
KEEPALIVE_S = 15.0
_END = object()


async def in_thread(work: Callable[[], T]) -> T:
    """`work()` on a daemon thread (asyncio.to_thread's pool would hold up shutdown on a silent machine)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(value: T | None, error: BaseException | None) -> None:
        if done.done():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(value)  # type: ignore[arg-type]

    def run() -> None:
        try:
            value, error = work(), None
        except BaseException as exc:  # handed to the awaiting request, which shows it
            value, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody is waiting any more
            loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(target=run, daemon=True, name="wb ui call").start()
    return await done


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
        from courier.watch import Watch

        self.loop = loop
        fleet = Watch(self.config, self.machines, warn=lambda _: None)
        self.watch = fleet
        fleet.start()

        def pump() -> None:
            while not self.stopping.is_set():
                try:
                    _, events = fleet.events.get(timeout=0.5)
                except queue.Empty:
                    continue
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


class _Gone(Exception):
    """The page went away: the follow thread ends at its next output."""


async def follow_lines(config: Config, machine: str, run_id: str) -> AsyncIterator[str]:
    """The run's worker actions as `logs --follow` prints them, one event a line; `end` once it is terminal."""
    from courier.supervise import follow

    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[tuple[str, str] | object] = asyncio.Queue()
    gone = threading.Event()

    def put(item: object) -> None:
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(lines.put_nowait, item)

    def write(text: str) -> None:
        if gone.is_set():
            raise _Gone
        for line in text.splitlines():
            put(("line", line.removeprefix("  ")))  # logs indents each action; the page does not

    def run() -> None:
        try:
            follow(config, machine, run_id, write, warn=lambda message: put(("warning", message)))
        except _Gone:
            return
        except WbError as exc:
            put(("error", exc.message))
        except Exception as exc:  # shown on the page, as the CLI would print it
            put(("error", f"internal: {type(exc).__name__}: {exc}"))
        put(_END)

    threading.Thread(target=run, daemon=True, name=f"wb ui follow {run_id}").start()
    try:
        yield ": following\n\n"
        while True:
            try:
                item = await asyncio.wait_for(lines.get(), KEEPALIVE_S)
            except TimeoutError:
                yield ": keepalive\n\n"
                continue
            if item is _END:
                yield sse("terminal", "end")
                return
            assert isinstance(item, tuple)
            kind, text = str(item[0]), str(item[1])
            yield sse(text, "" if kind == "line" else kind)
    finally:
        gone.set()
