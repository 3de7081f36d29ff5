"""The cold CLI's SSH calls, made by a copy of it that imports asyncssh meanwhile
(docs/courier.md#the-ssh-carrier-a-cold-command).

A cold command that reaches a machine over SSH imported pydantic, read wb.yaml and validated
its request (about 150 ms), and only then imported asyncssh and cryptography (about 125 ms),
one after the other on one core. `start` forks the command at its start, before either: the
copy imports asyncssh on another core, then waits. Each SSH call the command makes is handed
to it as (endpoint, command, stdin, bounds) and answered with the Outcome, or the
TransportError, that the same code (`courier.channels.ssh_client.run_direct`, the fan-out's
pool) gives in the command's own process. The copy connects only when it is handed a call, and a
call is handed over only once the request is validated: nothing reaches a machine sooner than
before, and a refused request never opens a connection.

The two talk over an anonymous socket pair, in pickled frames: both ends are the same program,
and no other process can reach the pair. The copy ignores ^C (the command handles it) and ends
when the command does: at the command's exit `finish` closes the pair and reaps the copy (killed
if it was never handed a call, or does not exit within WIND_DOWN_S), and if the command dies
first, its end of the pair closes and the copy exits. `WB_SSH_CARRIER=off` makes every SSH call
in the command's own process.
"""

from __future__ import annotations

import os
import socket

# Imported before the fork, so as little as can be: typing (and the `re` it loads), contextlib and signal
# come later, where they are used.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import asyncio
    from typing import Any

    from courier.channels.channel import Bounds, Outcome
    from courier.channels.ssh_endpoint import Endpoint

ENV = "WB_SSH_CARRIER"
# How long the command waits for the copy to end a given-up call's far side, and to exit.
WIND_DOWN_S = 2.0
_HEADER_BYTES = 4  # each frame: its length, big-endian, then the pickle


class Gone(Exception):
    """The carrier ended before it answered."""


class Carrier:
    """The command's side: hands calls to the copy and waits for their answers.

    Each event loop that calls (a command may run several, one after another or, as `watch` does,
    at once in threads) gets a stream of its own: a new socket pair whose far end is passed to the
    copy over the control socket. A loop's calls and fan-out scopes live on its stream, and end
    with it.
    """

    def __init__(self, pid: int, control: socket.socket) -> None:
        import threading

        self.pid = pid
        # The process that forked the copy: a process forked from it later (a run's owner) inherits this object,
        # and must neither use the copy nor end it, whose pid may by then be another process's.
        self.parent = os.getpid()
        self._control = control
        self._guard = threading.Lock()  # the control socket and the table below, shared by every thread
        self._links: dict[int, asyncio.Task[_Link]] = {}  # by id(loop); a loop's entry is its own
        self._next = 0
        self._handed = False  # a stream was passed: the copy may hold a call's far side to end

    async def _current_link(self) -> _Link:
        import asyncio

        loop = asyncio.get_running_loop()
        with self._guard:
            opening = self._links.get(id(loop))
            if opening is None or opening.get_loop() is not loop:
                opening = self._links[id(loop)] = loop.create_task(self._open(loop))
        # Every call of the loop waits for the one stream; a call given up on must not cancel its opening.
        return await asyncio.shield(opening)

    async def _open(self, loop: asyncio.AbstractEventLoop) -> _Link:
        import asyncio

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with self._guard:
                self._handed = True
                socket.send_fds(self._control, [b"s"], [theirs.fileno()])
        except OSError:
            ours.close()
            raise Gone from None
        finally:
            theirs.close()
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        return _Link(loop, reader, writer)

    def _ident(self) -> int:
        with self._guard:
            self._next += 1
            return self._next

    async def call(self, scope: int | None, endpoint: Endpoint, command: str, stdin: bytes, bounds: Bounds) -> Outcome:
        """One SSH call made by the copy: alone (`scope` None) or on the fan-out `scope`'s shared connections."""
        from courier.errors import ConnectionLost

        ident = self._ident()
        try:
            link = await self._current_link()
            outcome: Outcome = await link.ask(ident, ("call", ident, scope, endpoint, command, stdin, bounds))
        except Gone:
            raise ConnectionLost(
                f"{endpoint.machine}: the connection ended: wb's SSH process stopped before the reply "
                f"(set {ENV}=off to make SSH calls in the command's own process)"
            ) from None
        return outcome

    async def close_scope(self, scope: int) -> None:
        """Close the fan-out `scope`'s connections, as the pool's close does in-process."""
        import contextlib

        ident = self._ident()
        with contextlib.suppress(Gone):
            link = await self._current_link()
            await link.ask(ident, ("close", ident, scope))

    def finish(self) -> None:
        """End the copy (the command is ending): it sees the control socket close, drops what is left and exits;
        one that has not within WIND_DOWN_S, or was never handed a call, is killed. Either way it is reaped before
        the command exits."""
        import contextlib
        import signal

        with contextlib.suppress(OSError):
            self._control.shutdown(socket.SHUT_RDWR)
        # A copy never handed a call (a refused request, an exec machine after all) has nothing to end, and may
        # still be importing: it is not waited for.
        if not (self._handed and _exits_within(self.pid, WIND_DOWN_S)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        self._control.close()


def _exits_within(pid: int, seconds: float) -> bool:
    """True once the child `pid` has exited, waiting at most `seconds` (no polling: its pidfd)."""
    import select

    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd (macOS, an old kernel): not waited for
        return False
    try:
        ready, _, _ = select.select([fd], [], [], seconds)
    finally:
        os.close(fd)
    return bool(ready)


class _Link:
    """One event loop's stream to the copy: the frames out, a reader task matching answers to calls."""

    def __init__(self, loop: asyncio.AbstractEventLoop, reader: asyncio.StreamReader, writer: Any) -> None:
        self.loop = loop
        self.writer = writer
        self.waiting: dict[int, asyncio.Future[Any]] = {}
        self.gone = False
        self.task = loop.create_task(self._read(reader))

    async def ask(self, ident: int, message: tuple[Any, ...]) -> Any:
        import asyncio
        import contextlib

        if self.gone:
            raise Gone
        answer: asyncio.Future[Any] = self.loop.create_future()
        self.waiting[ident] = answer
        try:
            self.writer.write(_frame(message))
            await self.writer.drain()
            ok, value = await answer
        except asyncio.CancelledError:
            if not self.gone and not answer.done():
                # Given up on (the call's bound, ^C): the copy ends the far side's command and closes the
                # connection, as this process would have before going on, and says when it has.
                with contextlib.suppress(Exception):
                    self.writer.write(_frame(("cancel", ident)))
                    await asyncio.wait_for(asyncio.shield(answer), WIND_DOWN_S)
            self.waiting.pop(ident, None)
            raise
        except OSError:
            self.waiting.pop(ident, None)
            raise Gone from None
        if not ok:
            raise value
        return value

    async def _read(self, reader: asyncio.StreamReader) -> None:
        import asyncio
        import pickle

        try:
            while True:
                size = int.from_bytes(await reader.readexactly(_HEADER_BYTES), "big")
                ident, ok, value = pickle.loads(await reader.readexactly(size))
                answer = self.waiting.pop(ident, None)
                if answer is not None and not answer.done():
                    answer.set_result((ok, value))
        except (asyncio.IncompleteReadError, OSError, ValueError, EOFError):
            pass
        finally:
            self.gone = True
            for answer in self.waiting.values():
                if not answer.done():
                    answer.set_exception(Gone())
            self.waiting.clear()


def _frame(message: object) -> bytes:
    import pickle

    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return len(body).to_bytes(_HEADER_BYTES, "big") + body


_carrier: Carrier | None = None


def current() -> Carrier | None:
    """This command's carrier, when `start` made one in this very process (not in one it was forked from)."""
    return _carrier if _carrier is not None and _carrier.parent == os.getpid() else None


def start() -> Carrier | None:
    """Fork the carrier (once per process); None where it cannot be or is switched off."""
    global _carrier
    if current() is not None or os.environ.get(ENV) == "off" or not hasattr(os, "fork"):
        return current()
    try:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError:
        return None
    try:
        pid = os.fork()
    except OSError:
        ours.close()
        theirs.close()
        return None
    if pid == 0:  # the copy: never returns into the command
        ours.close()
        code = 1
        try:
            code = _serve(theirs)
        finally:
            os._exit(code)
    theirs.close()
    ours.set_inheritable(False)
    _carrier = Carrier(pid, ours)
    import atexit

    atexit.register(finish)  # a command that ends with sys.exit; exit_now (courier/main.py) calls finish itself
    return _carrier


def finish() -> None:
    """At the command's exit: end the carrier, if any (courier/main.py: exit_now, and atexit)."""
    global _carrier
    carrier, _carrier = current(), None
    if carrier is not None:
        carrier.finish()


def _serve(end: socket.socket) -> int:
    """The copy's life: its stdio off the terminal, asyncssh imported, then every call it is handed."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    import asyncio

    from courier.channels import ssh_client, ssh_pool  # the point of the copy: imported while the command works
    from courier.stage_trace import mark  # loaded already: the command marked its start

    mark("carrier.ready")  # beside the command's call.send (docs/benchmarks.md#dispatch-latency)

    asyncio.run(_answer_calls(end, ssh_client, ssh_pool))
    return 0


async def _answer_calls(control: socket.socket, ssh_client: Any, ssh_pool: Any) -> None:
    """Serve each stream the command passes over `control` until `control` closes; then drop what is left."""
    import asyncio

    loop = asyncio.get_running_loop()
    streams: set[asyncio.Task[None]] = set()
    closed = loop.create_future()

    def accept() -> None:
        try:
            _, fds, _, _ = socket.recv_fds(control, 1, 1)
        except BlockingIOError:
            return
        except OSError:
            fds = []
        if not fds:  # the command has ended
            loop.remove_reader(control.fileno())
            if not closed.done():
                closed.set_result(None)
            return
        stream = loop.create_task(_answer_stream(socket.socket(fileno=fds[0]), ssh_client, ssh_pool))
        streams.add(stream)
        stream.add_done_callback(streams.discard)

    control.setblocking(False)
    loop.add_reader(control.fileno(), accept)
    await closed
    # Each far side still waited for is told, as a given-up call's is (run_direct's and the pool's cleanup).
    left = list(streams)
    for stream in left:
        stream.cancel()
    await asyncio.gather(*left, return_exceptions=True)


async def _answer_stream(end: socket.socket, ssh_client: Any, ssh_pool: Any) -> None:
    """One event loop's calls, each in its own task, as the command's own process would run them."""
    import asyncio
    import contextlib
    import pickle

    reader, writer = await asyncio.open_unix_connection(sock=end)
    calls: dict[int, asyncio.Task[None]] = {}
    pools: dict[int, Any] = {}

    def answer(ident: int, ok: bool, value: object) -> None:
        try:
            frame = _frame((ident, ok, value))
        except Exception:  # an error that does not pickle: its text, as the class the caller expects
            from courier.errors import TransportError

            frame = _frame((ident, False, TransportError(f"{type(value).__name__}: {value}"[:2000])))
        writer.write(frame)

    async def run_call(ident: int, scope: int | None, endpoint: Any, command: str, stdin: bytes, bounds: Any) -> None:
        try:
            if scope is None:
                outcome = await ssh_client.run_direct(endpoint, command, stdin, bounds)
            else:
                pool = pools.get(scope) or pools.setdefault(scope, ssh_pool.Pool(persistent=False))
                outcome = await pool.call(endpoint, command, stdin, bounds=bounds)
        except asyncio.CancelledError:
            answer(ident, True, None)  # the far side has been told and the connection closed (run_direct's cleanup)
            raise
        except Exception as exc:
            answer(ident, False, exc)
        else:
            answer(ident, True, outcome)
        finally:
            calls.pop(ident, None)

    async def close_pool(ident: int, scope: int) -> None:
        pool = pools.pop(scope, None)
        try:
            if pool is not None:
                await pool.close()
        finally:
            calls.pop(ident, None)
        answer(ident, True, None)

    try:
        while True:
            try:
                size = int.from_bytes(await reader.readexactly(_HEADER_BYTES), "big")
                message = pickle.loads(await reader.readexactly(size))
            except (asyncio.IncompleteReadError, OSError):
                break
            kind, ident = message[0], message[1]
            if kind == "call":
                calls[ident] = asyncio.ensure_future(run_call(ident, *message[2:]))
            elif kind == "cancel" and ident in calls:
                calls.pop(ident).cancel()
            elif kind == "close":
                calls[ident] = asyncio.ensure_future(close_pool(ident, message[2]))
    finally:
        # The stream's loop has ended (or the command has): what it still waited for is dropped.
        left = list(calls.values())
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)
        for pool in pools.values():
            with contextlib.suppress(Exception):
                await pool.close()
        writer.close()
