"""The thin client: hand this command to the courier, or return None to run it in-process (cold).

Imported by `courier.main` on every warm command, before anything heavy, so it imports
nearly nothing: os and sys (loaded by the interpreter anyway), the C modules `_socket` and
`_signal` instead of the `socket` and `signal` packages (their enum set-up costs more than
everything else this module does), zlib for the socket's name, and `select` only when it
starts a courier. The command's stdin, stdout and stderr themselves are passed to the
courier (SCM_RIGHTS), with argv, the environment, the current directory and the umask, so
the forked child that runs it sees what this process would have seen. Whatever goes wrong
before the courier has started the command falls back to the cold path: the courier can
make wb faster, never make it fail.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # no stub; what `signal` wraps in enums
import _socket
import os
import sys
import time

from courier.channels import courier_frames as frames
from courier.channels import courier_socket as place

MODE_ENV = "WB_COURIER"
LOG_ENV = "WB_COURIER_LOG"
OFF_VALUES = ("off", "0", "no", "false")
PROTOCOL = b"1"
START_WAIT_S = 10.0  # the courier imports the whole program once; a loaded machine takes a while
RACE_WAIT_S = 3.0
FORWARDED_SIGNALS: tuple[int, ...] = (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP, _signal.SIGQUIT)
# Commands the client may re-run cold when the courier dies under them: they only read, and
# print only at their end (await), so running again is what the user would do by hand.
_RERUNNABLE = (("agent", "await"),)


def enabled(env: os._Environ[str] | dict[str, str]) -> bool:
    return env.get(MODE_ENV, "").strip().lower() not in OFF_VALUES


def run(argv: list[str]) -> int | None:
    """The command's exit code when the courier ran it; None to run it cold here."""
    if not enabled(os.environ):
        return None
    path = place.socket_path(os.environ)
    if path is None:
        return None
    try:
        cwd = os.getcwd()
    except OSError:
        return None
    for _ in range(2):  # a second round after an upgraded courier stepped aside
        sock = place.connect(path, _socket.socket)
        if sock is None:
            if not _start(path):
                return None
            sock = _connect_soon(path)
            if sock is None:
                return None
        outcome = _session(sock, argv, cwd)
        if outcome == "restart":
            continue
        if outcome == "lost":
            return _lost(argv)
        return outcome if isinstance(outcome, int) else None
    return None


def _connect_soon(path: str) -> _socket.socket | None:
    deadline = time.monotonic() + RACE_WAIT_S
    while True:
        sock = place.connect(path, _socket.socket)
        if sock is not None or time.monotonic() > deadline:
            return sock
        time.sleep(0.01)


def _start(path: str) -> bool:
    """Start a courier for this environment, detached, and wait until it listens (or gave up)."""
    import select  # only here: a courier is started once per idle period

    if not place.ensure_run_dir(path):
        return False
    package_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ready_read, ready_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the forked child
        try:
            os.close(ready_read)
            os.setsid()
            if os.fork():
                os._exit(0)
            null = os.open(os.devnull, os.O_RDWR)
            # Its log (start, stop, reconnects) only when asked for: WB_HOME may be a small disk.
            wanted = os.environ.get(LOG_ENV, "")
            log = os.open(wanted, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600) if wanted else null
            os.dup2(null, 0)
            os.dup2(null, 1)
            os.dup2(log, 2)
            os.set_inheritable(ready_write, True)
            os.chdir(package_parent)
            os.execv(
                sys.executable,
                [sys.executable, "-m", "courier.courier_process", path, str(ready_write)],
            )
        finally:
            os._exit(1)
    os.close(ready_write)
    try:
        os.waitpid(pid, 0)
        # EOF when the courier listens, gave up (another one won the race) or died.
        select.select([ready_read], [], [], START_WAIT_S)
    except OSError:
        return False
    finally:
        os.close(ready_read)
    return True


class _Forwarder:
    """Signals that arrive while the courier runs the command are sent on to that command."""

    def __init__(self, sock: _socket.socket) -> None:
        self.sock = sock
        self.started = False
        self.sending = False
        self.pending: list[int] = []
        self.previous: dict[int, object] = {}

    def install(self) -> None:
        for signum in FORWARDED_SIGNALS:
            if _signal.getsignal(signum) == _signal.SIG_IGN:
                continue  # ignored here (e.g. a background job): the cold process would ignore it too
            try:
                self.previous[signum] = _signal.signal(signum, self._handle)
            except (OSError, ValueError):
                continue

    def restore(self) -> None:
        for signum, handler in self.previous.items():
            try:
                _signal.signal(signum, handler)
            except (OSError, ValueError, TypeError):
                _signal.signal(signum, _signal.SIG_DFL)

    def _handle(self, signum: int, frame: object) -> None:
        if not self.started or self.sending:
            self.pending.append(signum)
            return
        self._send(signum)

    def _send(self, signum: int) -> None:
        try:  # noqa: SIM105 - no contextlib on the thin client's path
            frames.send_frame(self.sock, [b"signal", str(signum).encode()])
        except OSError:
            pass

    def flush(self) -> None:
        while self.pending:
            self._send(self.pending.pop(0))


def _usable_fds() -> list[int]:
    out = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            continue
        out.append(fd)
    return out


def _session(sock: _socket.socket, argv: list[str], cwd: str) -> int | str | None:
    """Run one command through the courier: an exit code, "restart", "lost", or None (run it cold)."""
    umask = os.umask(0o22)
    os.umask(umask)
    fds = _usable_fds()
    fields = [
        b"run",
        PROTOCOL,
        os.fsencode(cwd),
        str(umask).encode(),
        b"".join(str(fd).encode() for fd in fds),
        os.fsencode(sys.argv[0] if sys.argv else "wb"),
        str(len(argv)).encode(),
        *(os.fsencode(arg) for arg in argv),
        *(key + b"=" + value for key, value in os.environb.items()),
    ]
    forwarder = _Forwarder(sock)
    forwarder.install()
    try:
        try:
            forwarder.sending = True
            frames.send_frame(sock, fields, fds)
            forwarder.sending = False
            reply = frames.recv_frame(sock)
        except (OSError, frames.FrameError):
            return None  # nothing was started: the cold path is safe
        if reply[:1] == [b"restart"]:
            return "restart"
        if reply[:1] != [b"started"]:
            return None
        forwarder.started = True
        forwarder.flush()
        while True:
            try:
                reply = frames.recv_frame(sock)
            except (OSError, frames.FrameError):
                return "lost"
            if reply[:1] == [b"exit"] and len(reply) == 2:
                return int(reply[1])
            if reply[:1] == [b"signal"] and len(reply) == 2:
                return _die_like(int(reply[1]), forwarder)
    finally:
        forwarder.restore()
        sock.close()


def _die_like(signum: int, forwarder: _Forwarder) -> int:
    """The command was killed by a signal: end this process the same way, as the cold path would end."""
    forwarder.restore()
    sys.stdout.flush()
    try:
        _signal.signal(signum, _signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    except (OSError, ValueError):
        pass
    return 128 + signum


def _lost(argv: list[str]) -> int | None:
    """The courier ended while it ran the command; report it, and re-run an await cold."""
    if tuple(argv[:2]) in _RERUNNABLE:
        sys.stderr.write("warning: the wb courier ended during this command; waiting without it\n")
        sys.stderr.flush()
        return None
    sys.stderr.write(
        "error: the wb courier ended before this command finished; its outcome is unknown: "
        "check with wb agent status or wb agent list, or set WB_COURIER=off to run without the courier\n"
    )
    return frames.LOST_EXIT
