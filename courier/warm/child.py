"""One command in a child forked by the courier: the caller's stdio, environment, directory, umask.

After the fork the child becomes, as far as the command can tell, the process the thin
client would have been: fds 0-2 are the caller's (so isatty, `--task-file -` and a
closed stdout behave as cold), os.environ is the caller's, and so are the current
directory and the umask. Its remote calls go back to the courier (one pooled connection or
serve process per machine) through `courier.channels.courier.CourierChannel`. The command
line itself is run by the `runner` the courier's entry module passed down (`courier.cli.run`):
nothing here imports the CLI.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import io
import locale
import os
import signal
import socket
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NoReturn

from courier import stage_trace
from protocol import limits

_PR_SET_PDEATHSIG = 1
_C_LOCALES = ("C", "POSIX", "")


@dataclass
class Command:
    """What the thin client sent: everything the cold process would have had."""

    cwd: str
    umask: int
    stdio: list[int]  # which of 0, 1, 2 were passed (an fd the caller had closed stays closed)
    argv0: str
    argv: list[str]
    env: dict[str, str]
    client_pid: int = 0  # the thin client's process, which the user started (0: unknown)

    @classmethod
    def parse(cls, fields: list[bytes]) -> Command:
        if len(fields) < 7 or fields[0] != b"run" or fields[1] != b"1":
            raise ValueError("not a run request of protocol 1")
        count = int(fields[6])
        argv_end = 7 + count
        if count < 0 or argv_end > len(fields):
            raise ValueError("argv count out of range")
        env: dict[str, str] = {}
        for item in fields[argv_end:]:
            key, sep, value = item.partition(b"=")
            if sep:
                env[os.fsdecode(key)] = os.fsdecode(value)
        return cls(
            cwd=os.fsdecode(fields[2]),
            umask=int(fields[3]) & 0o777,
            stdio=[int(chr(c)) for c in fields[4] if chr(c) in "012"],
            argv0=os.fsdecode(fields[5]),
            argv=[os.fsdecode(arg) for arg in fields[7:argv_end]],
            env=env,
        )


def run_child(
    command: Command,
    passed: list[int],
    close: Iterable[socket.socket],
    socket_path: str,
    runner: Callable[[list[str]], int],
) -> NoReturn:
    """Become the command and run it; never returns."""
    code = 1
    # What the courier's loop left as garbage when it forked (a finished call's task, transport or
    # pipe) is never finalized here: its finalizers would print asyncio's complaints (`Task was
    # destroyed but it is pending!`) on the user's stderr, which this child now holds.
    gc.freeze()
    try:
        parent = os.getppid()
        _reset_signals()
        _die_with(parent)
        for sock in close:
            with contextlib.suppress(OSError):
                sock.close()
        _install_stdio(command.stdio, passed)
        os.environ.clear()
        os.environ.update(command.env)
        stage_trace.from_environment()  # the caller's WB_STAGE_TRACE, not the courier's (docs/benchmarks.md)
        stage_trace.mark("courier.child")
        os.umask(command.umask)
        try:
            os.chdir(command.cwd)
        except OSError as exc:
            sys.stderr.write(f"error: cannot enter the current directory {command.cwd}: {exc.strerror}\n")
            os._exit(1)
        sys.argv = [command.argv0, *command.argv]
        _reset_stdio_objects(command.env)
        from courier.channels.courier import through_courier
        from courier.channels.registry import carry_through
        from courier.runs import process

        process.command_started_by(command.client_pid)  # a bound the user gave counts from their start

        carry_through(through_courier(socket_path))
        code = runner(command.argv)
        _flush()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
        _flush()
    except KeyboardInterrupt:
        code = limits.EXIT_INTERRUPTED
    except BaseException as exc:  # never a traceback (docs/cli.md#conventions-shared-by-every-command)
        with contextlib.suppress(Exception):
            sys.stderr.write(f"error: internal: {type(exc).__name__}: {exc}\n")
            sys.stderr.flush()
        code = 1
    finally:
        os._exit(code)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        if stream is None:
            continue
        try:
            stream.flush()
        except BrokenPipeError:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, stream.fileno())
            os._exit(limits.EXIT_STDOUT_CLOSED)
        except (OSError, ValueError):
            pass


def _reset_signals() -> None:
    """The signal dispositions of a freshly started wb, not the courier's."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as Python itself sets it at start-up
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def _die_with(parent: int) -> None:
    """End with the courier: a command must never outlive the process that reports its exit."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def _install_stdio(stdio: list[int], passed: list[int]) -> None:
    mapping = dict(zip(stdio, passed, strict=False))
    for target in (0, 1, 2):
        source = mapping.get(target)
        if source is None:
            with contextlib.suppress(OSError):
                os.close(target)
        else:
            os.dup2(source, target)
    for source in passed:
        if source > 2:
            with contextlib.suppress(OSError):
                os.close(source)


def _io_encoding(env: dict[str, str]) -> tuple[str, str]:
    """The encoding and error handler Python would pick for stdin/stdout at start-up in `env`."""
    requested, _, handler = env.get("PYTHONIOENCODING", "").partition(":")
    locale_name = env.get("LC_ALL") or env.get("LC_CTYPE") or env.get("LANG") or ""
    c_locale = locale_name in _C_LOCALES
    utf8_mode = env.get("PYTHONUTF8") == "1" or (env.get("PYTHONUTF8") != "0" and c_locale)
    encoding = requested
    if not encoding:
        if utf8_mode:
            encoding = "utf-8"
        else:
            with contextlib.suppress(locale.Error):
                locale.setlocale(locale.LC_CTYPE, "")
            encoding = locale.getpreferredencoding(False) or "utf-8"
    return encoding, handler or ("surrogateescape" if utf8_mode or c_locale else "strict")


def _stream(fd: int, write: bool, encoding: str, errors_: str, line_buffering: bool) -> io.TextIOWrapper | None:
    try:
        os.fstat(fd)
    except OSError:
        return None
    raw = open(fd, "wb" if write else "rb", closefd=False)  # noqa: SIM115 - stdio lives as long as the process
    return io.TextIOWrapper(raw, encoding=encoding, errors=errors_, newline="\n", line_buffering=line_buffering)


def _reset_stdio_objects(env: dict[str, str]) -> None:
    encoding, handler = _io_encoding(env)
    stdin = _stream(0, False, encoding, handler, False)
    stdout = _stream(1, True, encoding, handler, os.isatty(1) if _open(1) else False)
    stderr = _stream(2, True, encoding, "backslashreplace", True)
    sys.stdin = sys.__stdin__ = stdin  # type: ignore[misc]
    sys.stdout = sys.__stdout__ = stdout  # type: ignore[misc]
    sys.stderr = sys.__stderr__ = stderr  # type: ignore[misc]


def _open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True
