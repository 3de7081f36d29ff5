"""The `exec` channel (docs/cli.md#exec-targets): any local command that reaches a machine.

`session_move.targets.box.exec.argv` is run as wb's own child, `argv + [wb_path,
"--wb-internal-agent-remote"]`, with no shell (each element is one argument; nothing from
a request is ever in it) and the caller's environment. The request goes to its stdin,
then EOF; stdout and stderr are read within their caps, exactly as over SSH. What the
command does to get there (`docker exec -i`, `kubectl exec -i POD --`, `ssh -T host`)
is its business: wb checks no host key and performs no authentication on this channel.

The courier keeps one `argv + [wb_path, "--wb-internal-agent-serve"]` per exec machine
whose peer lists `serve` (`ExecPeer`); one process per call otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from typing import Any, ClassVar

from courier.channels import exec_early
from courier.channels.channel import DEFAULT_BOUNDS, Bounds, Channel, Outcome, WarmState
from courier.channels.exits import first_stderr_line
from courier.channels.serve_lines import ServeChannel
from courier.channels.warm_peer import WarmPeer, WarmPeers
from courier.config import ExecTarget
from courier.errors import ConnectFailed, ConnectionLost, RemoteWbMissing, TransportError
from courier.text import sanitize
from protocol import limits
from protocol.entry import REMOTE_ARGUMENT, SERVE_ARGUMENT
from protocol.reply import BadReply, find_reply

_READ_CHUNK = limits.SSH_READ_CHUNK_BYTES
SERVE_PREPARE_WAIT_S = 10.0  # the longest a call waits for a serve process being prepared
USAGE_EXIT = 2  # the exit of a command that refused its command line (wb's, click's, a shell's)
END_WAIT_S = 2.0  # the longest a call waits to reap a child it killed and whose pipes it closed


class _Overflow(Exception):
    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.stream = stream


class ExecChannel(Channel):
    kind = "exec"
    target: ExecTarget
    target_model: ClassVar[type[ExecTarget]] = ExecTarget

    # The child's environment: None is this process's own (cold, or a command the courier runs,
    # whose os.environ is the caller's); in the courier itself, the caller's, sent with the call.
    env: dict[str, str] | None = None

    @property
    def where(self) -> str:
        return f'exec "{self.target.argv[0]}"'

    def spec(self) -> dict[str, Any]:
        return {**super().spec(), "env": dict(os.environ)}  # the exec child gets the caller's environment

    def restore(self, spec: dict[str, Any]) -> None:
        env = spec.get("env")
        if isinstance(env, dict):
            self.env = {str(key): str(value) for key, value in env.items()}

    def machines_row(self) -> dict[str, Any]:
        return {**super().machines_row(), "argv": self.target.argv}  # the command stands where a host would

    def classify_exit(self, outcome: Outcome) -> None:
        """An exec command's exit (docs/cli.md#exec-targets): a reply on stdout wins; else its code, named."""
        if outcome.exit_status == 0:
            return
        try:
            find_reply(outcome.stdout)
            return  # the command (docker, kubectl) exited non-zero after wb answered: the answer stands
        except BadReply:
            pass
        program = sanitize(self.target.argv[0])[:128]
        if outcome.exit_status == 127:
            raise RemoteWbMissing(f"wb was not found on {self.machine}: set {self.setting('wb_path')}")
        if outcome.exit_signal is not None:
            how = f"was killed by signal {sanitize(outcome.exit_signal)[:32]}"
        else:
            how = f"exited with status {outcome.exit_status}"
        said = f'"{program}" {how} without a reply: {first_stderr_line(outcome.stderr)}'
        last = self.target.argv[-1]
        if last.rsplit("/", 1)[-1] == "wb":
            # `[docker, exec, -i, box, wb]`: the far wb was given wb_path as its command and refused
            # it (`No such command 'wb'`) before reading the request.
            raise ConnectFailed(
                f'machine {self.machine}: its exec.argv ends in "{sanitize(last)[:128]}", but wb appends '
                f"wb_path itself; drop it from {self.setting('argv')} ({said})",
                cause="exec argv ends in wb",
            )
        if outcome.exit_status == USAGE_EXIT:
            # A refused command line (wb's own, click's, a shell's): it stopped before reading any
            # request, so nothing was started there (a dispatch says so instead of "may have started").
            raise ConnectFailed(f"machine {self.machine}: {said}", cause="command refused")
        raise TransportError(f"machine {self.machine}: {said}", cause="remote crashed")

    def argv(self, tail: list[str]) -> list[str]:
        return [*self.target.argv, *tail]

    async def start(self, tail: list[str]) -> asyncio.subprocess.Process:
        """The child `argv + tail`, its three stdio piped; a command that cannot start names the setting."""
        program = self.target.argv[0]
        try:
            return await asyncio.create_subprocess_exec(
                *self.argv(tail),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self.env,
            )
        except FileNotFoundError:
            why = "not found"
        except PermissionError:
            why = "not executable"
        except OSError as exc:
            why = exc.strerror or type(exc).__name__
        raise ConnectFailed(
            f'machine {self.machine}: cannot run "{program}": {why} ({self.setting("argv")})', cause="exec failed"
        )

    async def run(self, tail: list[str], stdin: bytes, bounds: Bounds = DEFAULT_BOUNDS) -> Outcome:
        early = exec_early.take(self.argv(tail), self.env)  # started before this command's imports
        process: Child | None = await AdoptedProcess.adopt(early) if early is not None else None
        if process is None:
            process = await self.start(tail)
        try:
            return await _exchange(process, stdin, bounds)
        finally:
            await end_process(process)

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
        pool = state.part(self.kind, ExecPool)
        assert isinstance(pool, ExecPool)
        key = (tuple(self.target.argv), tuple(tail), max_sessions)
        peer = pool.peers.get(key)
        if peer is not None and peer.channel.env != self.env:
            # Its serve process has another caller's environment: one process per machine, this caller's now.
            pool.retire(peer)
            peer = None
        if peer is None:
            peer = pool.peers[key] = ExecPeer(self, tail, max_sessions)
        return await peer.call(stdin, operation, bounds, serve_dispatch)


class AdoptedProcess:
    """A child started before the event loop (courier/channels/exec_early.py), with what `_exchange` and
    `end_process` use of `asyncio.subprocess.Process`: its pipes as streams, `wait`, `returncode`, `kill`.
    Its exit is learned from a pidfd (Linux), so asyncio's child watcher never meets it."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._popen = popen
        self.stdin: asyncio.StreamWriter | None = None
        self.stdout: asyncio.StreamReader | None = None
        self.stderr: asyncio.StreamReader | None = None
        self.pipes: list[asyncio.BaseTransport] = []
        self._exited: asyncio.Future[int] | None = None

    @classmethod
    async def adopt(cls, popen: subprocess.Popen[bytes]) -> AdoptedProcess | None:
        """The child on this loop; None when it cannot be watched here (a kernel without pidfds): it is then
        killed and reaped, and the channel starts one of its own."""
        try:
            pidfd = os.pidfd_open(popen.pid)
        except OSError:
            popen.kill()
            popen.communicate()  # reaped, its pipes closed
            return None
        assert popen.stdin is not None and popen.stdout is not None and popen.stderr is not None
        loop = asyncio.get_running_loop()
        adopted = cls(popen)
        adopted.stdout = await adopted._reader(popen.stdout)
        adopted.stderr = await adopted._reader(popen.stderr)
        protocol = asyncio.StreamReaderProtocol(asyncio.StreamReader(loop=loop), loop=loop)
        transport, _ = await loop.connect_write_pipe(lambda: protocol, popen.stdin)
        adopted.pipes.append(transport)
        adopted.stdin = asyncio.StreamWriter(transport, protocol, None, loop)
        adopted._exited = loop.create_future()
        loop.add_reader(pidfd, adopted._on_exit, pidfd)
        return adopted

    async def _reader(self, pipe: Any) -> asyncio.StreamReader:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(loop=loop)
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader, loop=loop), pipe)
        self.pipes.append(transport)
        return reader

    def _on_exit(self, pidfd: int) -> None:
        asyncio.get_running_loop().remove_reader(pidfd)
        os.close(pidfd)
        code = self._popen.wait()  # it has exited: this only reaps it
        if self._exited is not None and not self._exited.done():
            self._exited.set_result(code)

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    def kill(self) -> None:
        self._popen.kill()  # a no-op once it is reaped

    async def wait(self) -> int:
        assert self._exited is not None
        return await asyncio.shield(self._exited)

    def close_pipes(self) -> None:
        for pipe in self.pipes:
            pipe.close()


Child = asyncio.subprocess.Process | AdoptedProcess


async def _exchange(process: Child, stdin: bytes, bounds: Bounds) -> Outcome:
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    outcome = Outcome(stdout=b"", stderr=b"", exit_status=None, exit_signal=None)
    stdout, stderr = bytearray(), bytearray()

    async def feed() -> None:
        # The command may exit without reading (wb missing): a broken stdin is not the story.
        assert process.stdin is not None
        with contextlib.suppress(OSError):
            process.stdin.write(stdin)
            await process.stdin.drain()
        with contextlib.suppress(OSError):
            process.stdin.close()

    async def drain(reader: asyncio.StreamReader, sink: bytearray, cap: int, name: str) -> None:
        while chunk := await reader.read(_READ_CHUNK):
            sink += chunk
            if len(sink) > cap:
                raise _Overflow(name)

    feeder = asyncio.ensure_future(feed())
    readers = [
        asyncio.ensure_future(drain(process.stdout, stdout, bounds.stdout_max, "stdout")),
        asyncio.ensure_future(drain(process.stderr, stderr, bounds.stderr_max, "stderr")),
    ]
    try:
        await asyncio.gather(*readers)
    except _Overflow as exc:
        outcome.overflow = exc.stream  # stop reading both at once: the caller kills the process
    finally:
        for task in [*readers, feeder]:
            task.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.gather(*readers, feeder, return_exceptions=True)
    outcome.stdout = bytes(stdout[: bounds.stdout_max])
    outcome.stderr = bytes(stderr[: bounds.stderr_max])
    if outcome.overflow:
        return outcome
    code = await process.wait()
    if code < 0:
        outcome.exit_signal = _signal_name(-code)
    else:
        outcome.exit_status = code
    return outcome


async def end_process(process: Child) -> None:
    """Kill the child if it still runs, close its pipes, and reap it, within END_WAIT_S.

    Closing the pipes is what makes this prompt: `Process.wait()` returns only once every
    pipe has seen its end (Python 3.11.7 and later), and a pipe whose reading was paused
    (a flooding peer's stdout past its cap) or that a grandchild still holds never does.
    A transport left open is also what asyncio complains about on stderr when it is
    collected after its loop closed (`Exception ignored in: <function
    BaseSubprocessTransport.__del__ …>`), or when its pending wait is (`Task was destroyed
    but it is pending!`).
    """
    if isinstance(process, AdoptedProcess):
        if process.returncode is None:
            process.kill()
        process.close_pipes()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(process.wait(), END_WAIT_S)
        return
    transport = kill_and_close_pipes(process)
    if transport is None:
        return
    with contextlib.suppress(BaseException):  # also a cancellation: the call has already ended
        await asyncio.wait_for(asyncio.shield(process.wait()), END_WAIT_S)
        # One turn of the loop: the pipes finish closing in callbacks it runs (a wait for an exit
        # already known returns at once), and a loop that ended first would leave them open.
        await asyncio.sleep(0)
    # Last, once the exit is known: closing a transport whose exit is not yet known polls (reaps)
    # the child itself, and asyncio's child watcher then warns on stderr that it lost the child.
    transport.close()


def kill_and_close_pipes(process: asyncio.subprocess.Process) -> asyncio.SubprocessTransport | None:
    """Kill the child if it still runs and close its three pipes; its transport, to close once it is reaped."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
    transport = getattr(process, "_transport", None)  # asyncio keeps the process's transport private
    if not isinstance(transport, asyncio.SubprocessTransport):
        return None
    for fd in (0, 1, 2):
        pipe = transport.get_pipe_transport(fd)
        if pipe is not None:
            pipe.close()
    return transport


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name.removeprefix("SIG")
    except ValueError:
        return str(number)


class ProcessStream:
    """A local child's pipes as a serve stream (`courier.channels.serve_lines.Stream`)."""

    def __init__(self, process: asyncio.subprocess.Process, machine: str) -> None:
        self._process = process
        self._machine = machine

    async def write(self, data: bytes) -> None:
        assert self._process.stdin is not None
        try:
            self._process.stdin.write(data)
            await self._process.stdin.drain()
        except OSError as exc:
            raise ConnectionLost(f"{self._machine}: the serve process is gone: {exc.strerror or exc}") from None
        # asyncio drops a write to a pipe it has just found broken without raising (the error reaches the
        # stream only a loop turn later): the request never left, and no reply would ever come.
        if self._process.stdin.is_closing():
            raise ConnectionLost(f"{self._machine}: the serve process is gone: its input is closed")

    async def read(self, size: int) -> bytes:
        assert self._process.stdout is not None
        return await self._process.stdout.read(size)

    async def read_stderr(self, size: int) -> bytes:
        assert self._process.stderr is not None
        return await self._process.stderr.read(size)

    def close(self) -> None:
        if self._process.stdin is not None:
            with contextlib.suppress(OSError):
                self._process.stdin.close()  # EOF: a serve process ends when its input does
        kill_and_close_pipes(self._process)  # its reaping (ExecPeer.close) must not wait on a paused pipe


class ExecPeer(WarmPeer[None]):
    """The courier's state for one exec machine: its serve process, or one process per call (no connection)."""

    kind = "exec"
    # A call arriving while the serve process is being prepared (the version probe, then its
    # start) waits for it, bounded, instead of starting one more process beside it; on a Ray
    # head each such process joins the cluster as a new driver, 1-2 s of CPU (docs/ray.md#cost).
    prepare_wait_s = SERVE_PREPARE_WAIT_S

    def __init__(self, channel: ExecChannel, tail: list[str], max_sessions: int) -> None:
        super().__init__(channel.machine, max_sessions)
        self.channel = channel
        self.tail = tail
        self._process: asyncio.subprocess.Process | None = None

    async def call(self, payload: bytes, operation: str, bounds: Bounds, serve_dispatch: bool = True) -> Outcome:
        """Over the serve process when there is one (a process that ended is replaced once), else one process."""
        return await self.carry(payload, operation, bounds, _no_link, serve_dispatch=serve_dispatch)

    async def _session(self, link: None, payload: bytes, bounds: Bounds, *, or_serve: bool = False) -> Outcome:
        if not await self._take_slot(or_serve=or_serve):
            return await self._ask_serve(payload)
        try:
            return await self.channel.run(self.tail, payload, bounds)
        finally:
            await self._release_slot()

    async def _start_serve(self, link: None) -> ServeChannel | None:
        if self.tail[-1:] != [REMOTE_ARGUMENT]:
            return None
        process = await self.channel.start([*self.tail[:-1], SERVE_ARGUMENT])
        if self.closed:  # closed while it started: nobody would close it later
            ProcessStream(process, self.machine).close()
            return None
        self._process = process
        self.opened_at = time.time()
        serve = ServeChannel(ProcessStream(process, self.machine), self.machine)
        # Bound to this process: the callback may run after a successor took its place.
        serve.when_ended(lambda _: self._reap(process))
        return serve

    @staticmethod
    def _reap(process: asyncio.subprocess.Process) -> None:
        """Kill the serve process whose channel ended (never the one current by then)."""
        kill_and_close_pipes(process)

    async def _release(self) -> None:
        if self._process is not None:
            await end_process(self._process)

    @property
    def connected(self) -> bool:
        return self._serve_ready()  # the serve process is what stays open between calls

    def _open_since(self) -> float | None:
        return self.opened_at if self._serve_ready() else None

    def _address(self) -> dict[str, Any]:
        return {"argv": self.channel.target.argv}  # the command stands where a host would


async def _no_link() -> None:
    """An exec call runs over nothing kept open: each is a process of its own, or a line to the serve process."""


class ExecPool(WarmPeers[ExecPeer]):
    """The courier's exec peers, one per (argv, wb command, session bound)."""

    def __init__(self) -> None:
        super().__init__()
        self._retiring: set[asyncio.Future[None]] = set()

    def retire(self, peer: ExecPeer) -> None:
        """Close a replaced peer's serve process in the background (calls in flight on it may finish)."""
        self._retiring.add(task := asyncio.ensure_future(peer.close()))
        task.add_done_callback(self._retiring.discard)
