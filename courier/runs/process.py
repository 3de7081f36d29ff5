"""Process identity (PID + a clock-independent start token), process groups and detaching."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

_IS_LINUX = sys.platform.startswith("linux")
_MAX_FD = 65536  # the end of the descriptor range closed in a detached child
_boot_id_cache: str | None = None


def _boot_id() -> str:
    global _boot_id_cache
    if _boot_id_cache is None:
        try:
            _boot_id_cache = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        except OSError:
            _boot_id_cache = "unknown-boot"
    return _boot_id_cache


def _linux_stat(pid: int) -> list[str] | None:
    # A plain open: `list` checks two processes per record, thousands of times.
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    # The command name may contain spaces and parentheses: split after the last ")".
    tail = raw[raw.rfind(b")") + 2 :].split()
    return [field.decode() for field in tail]


def start_token(pid: int) -> str | None:
    """A token that names this incarnation of `pid`; None when it is gone or a zombie."""
    if pid <= 0:
        return None
    if _IS_LINUX:
        fields = _linux_stat(pid)
        if fields is None or fields[0] in ("Z", "X"):
            return None
        # fields[0] is field 3 (state); start time in clock ticks since boot is field 22.
        return f"linux:{_boot_id()}:{fields[19]}"
    import psutil

    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
        return f"ctime:{process.create_time():.3f}"
    except (psutil.Error, OSError):
        return None


# The process the user started when it is not this one: the courier's thin client (docs/courier.md).
_command_pid = 0


def command_started_by(pid: int) -> None:
    """This process runs the command `pid` was started for (a child of the courier): count from its start."""
    global _command_pid
    _command_pid = pid


def command_age_s() -> float:
    """How long ago the user's command started, its start-up and imports included; 0.0 when unknown.

    From the kernel's record of the process the user started (this one, or the courier's thin
    client), so a bound the user gave (await's) covers the whole command.
    """
    if _command_pid > 0:
        age = _age_s(_command_pid)
        if age is not None:
            return age
    return _age_s(os.getpid()) or 0.0


def _age_s(pid: int) -> float | None:
    try:
        if _IS_LINUX:
            fields = _linux_stat(pid)
            if fields is None:
                return None
            started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # clock ticks since boot
            return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
        import psutil

        return max(0.0, time.time() - psutil.Process(pid).create_time())
    except (OSError, ValueError, ImportError):
        return None


def same_process(pid: int | None, token: str | None) -> bool:
    """Is `pid` still the process whose start token we recorded (and not a zombie)?"""
    if not pid or not token:
        return False
    current = start_token(pid)
    if current is None:
        return False
    if current.startswith("ctime:") and token.startswith("ctime:"):
        return abs(float(current[6:]) - float(token[6:])) <= 2.0
    return current == token


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is `pgid`."""
    members: list[int] = []
    if _IS_LINUX:
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            fields = _linux_stat(int(entry.name))
            if fields and fields[0] not in ("Z", "X") and fields[2] == str(pgid):
                members.append(int(entry.name))
        return members
    import psutil

    for process in psutil.process_iter(["pid", "status"]):
        with contextlib.suppress(psutil.Error, OSError):
            if process.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(process.pid) == pgid:
                members.append(process.pid)
    return members


def group_empty(pgid: int) -> bool:
    """Whether no live process has `pgid` as its process group.

    One signal-0 to the group answers most calls: ESRCH means nobody is in it. Only a group that
    answers (it may hold nothing but zombies) is looked for in /proc, which costs a read per
    process on the machine: a run's end asks this of its worker's group.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # a member of another user's: look
    return not group_members(pgid)


def signal_group(pgid: int, signum: int) -> bool:
    try:
        os.killpg(pgid, signum)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def wait_until(predicate: object, timeout: float, interval: float = 0.02) -> bool:
    """Poll `predicate()` until it is true or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():  # type: ignore[operator]
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def terminate_group(pgid: int, grace: float) -> int:
    """SIGTERM the group, wait `grace`, then SIGKILL what is left; returns how many were found."""
    if group_empty(pgid):
        return 0
    found = len(group_members(pgid))
    if not found:
        return 0
    signal_group(pgid, signal.SIGTERM)
    if not wait_until(lambda: group_empty(pgid), grace):
        signal_group(pgid, signal.SIGKILL)
        wait_until(lambda: group_empty(pgid), 2.0)
    return found


def alone_in_process() -> bool:
    """Whether this process runs one thread only, counting threads Python does not know (Ray's, a C library's):
    forking it is then safe, no lock of another thread is held in the copy (Linux; elsewhere: never assumed)."""
    if not _IS_LINUX:
        return False
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


def command_line_holds(text: str) -> bool:
    """Whether this process's command line carries `text` as an argument of its own (a task given as
    `--task TEXT` or `--task=TEXT`): a copy of the process would show it for as long as the copy lives.
    Unknown counts as carrying it."""
    needle = text.encode("utf-8", "surrogateescape")
    try:
        with open("/proc/self/cmdline", "rb") as handle:
            arguments = handle.read().split(b"\0")
    except OSError:
        return True
    return any(argument == needle or argument.endswith(b"=" + needle) for argument in arguments)


def retitle(title: str) -> None:
    """Write `title` over this process's command line as `ps` and /proc/PID/cmdline show it (the memory the
    kernel reads them from, which Python never uses again after start), cut to fit; OSError when it cannot."""
    import ctypes

    with open("/proc/self/stat", "rb") as handle:
        fields = handle.read().rsplit(b")", 1)[1].split()
    # Fields 48 and 49 of proc(5), arg_start and arg_end; `fields` starts at field 3 (after the name).
    start, end = int(fields[45]), int(fields[46])
    if end <= start:
        raise OSError("this kernel does not say where the command line is")
    text = title.encode("utf-8", "replace")[: end - start - 1]
    ctypes.memmove(start, text + b"\0" * (end - start - len(text)), end - start)


def fork_detached(
    run: Callable[[], int], *, title: str = "", hidden: str = "", otherwise: list[str] | None = None
) -> None:
    """Run `run()` in a copy of this process, in its own session, stdio on /dev/null, reparented away from us
    (double fork), its code already loaded: what `spawn_detached` does without a new interpreter's start.

    The copy's command line becomes `title`; when `hidden` (a task) would still show there, the copy starts
    `otherwise` instead (a new interpreter, from the same detached place).

    Only for a process that runs one thread (`alone_in_process`). The copy keeps none of this process's
    descriptors: its objects are frozen out of the collector's reach first (none is ever finalized, so
    none closes a descriptor number the copy reuses later), then every descriptor from 3 up is closed.
    Signals are back to a new interpreter's dispositions and unblocked; the copy ends with os._exit, so
    no atexit handler of this process runs in it.
    """
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the forked child
        code = 127
        try:
            os.setsid()
            if os.fork() != 0:
                os._exit(0)
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            gc.freeze()  # before the descriptors go: no finalizer of an object of ours closes a number reused later
            os.closerange(3, _MAX_FD)
            _fresh_signals()
            if title:
                with contextlib.suppress(OSError, ValueError, IndexError):
                    retitle(title)
            if hidden and command_line_holds(hidden):
                assert otherwise is not None
                os.execv(otherwise[0], otherwise)
            code = run()
        finally:
            os._exit(code)
    os.waitpid(child, 0)


def _fresh_signals() -> None:
    """The dispositions a new interpreter starts with: SIGPIPE and SIGXFSZ ignored (a write to a pipe whose
    reader left is an error, not the end of the process), SIGINT Python's, every other signal the default,
    none blocked."""
    for number in range(1, signal.NSIG):
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            signal.signal(number, signal.SIG_DFL)
    for name in ("SIGPIPE", "SIGXFSZ"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.set_wakeup_fd(-1)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def spawn_detached(argv: list[str], env: dict[str, str]) -> None:
    """Start argv in its own session with stdio on /dev/null, reparented away from us (double fork)."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the forked child
        try:
            os.close(read_end)
            os.setsid()
            if os.fork() != 0:
                os._exit(0)
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.closerange(3, write_end)
            os.set_inheritable(write_end, False)
            os.closerange(write_end + 1, _MAX_FD)
            os.execve(argv[0], argv, env)
        except BaseException:
            os.write(write_end, b"x")
        finally:
            os._exit(127)
    os.close(write_end)
    os.waitpid(child, 0)
    # The pipe is close-on-exec: EOF with no byte means the exec succeeded.
    failed = os.read(read_end, 1)
    os.close(read_end)
    if failed:
        raise OSError(f"could not start {argv[0]}")
