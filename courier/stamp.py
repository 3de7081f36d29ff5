"""Stamps of what a long-lived process started from, so it notices when that changed under it.

`program_stamp` covers every `.py` file of the `courier` and `protocol` packages (path, size,
mtime, inode): a reinstall, an upgrade or an edit of an editable checkout changes it.
`login_stamp` covers the files a new login on this machine reads to set its environment (PATH
above all): a serve session that runs dispatches keeps the environment it started with, so it
hands a run to a new login once they changed (docs/courier.md, "Environment").
Light on purpose (os, time and contextlib): the remote serve mode and the courier check them between calls.
"""

from __future__ import annotations

import contextlib
import os
import time

_MASK = (1 << 64) - 1  # an order-independent sum: directory order does not matter


def _package_dirs() -> list[str]:
    courier_dir = os.path.dirname(os.path.abspath(__file__))  # .../courier
    protocol_dir = os.path.join(os.path.dirname(courier_dir), "protocol")
    return [courier_dir, protocol_dir]


def program_stamp() -> int:
    """A number that changes when any of wb's source files is replaced, edited, added or removed."""
    total = 0
    stack = _package_dirs()
    while stack:
        directory = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            total = (total + hash((directory, "missing"))) & _MASK
            continue
        for entry in entries:
            name = entry.name
            if name.endswith(".py"):
                try:
                    info = entry.stat()
                except OSError:
                    continue
                total = (total + hash((entry.path, info.st_size, info.st_mtime_ns, info.st_ino))) & _MASK
            elif name != "__pycache__" and not name.startswith(".") and entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
    return total


# What sshd's command sessions and login shells read before they run a command: PAM's environment,
# the shells' system and personal start-up files, sshd's per-user environment. A file that is
# missing counts too: creating one changes the stamp.
_LOGIN_FILES = (
    "/etc/environment",
    "/etc/security/pam_env.conf",
    "/etc/login.defs",
    "/etc/profile",
    "/etc/bash.bashrc",
    "/etc/zsh/zshenv",
    "/etc/zshenv",
    "~/.pam_environment",
    "~/.ssh/environment",
    "~/.profile",
    "~/.bash_profile",
    "~/.bash_login",
    "~/.bashrc",
    "~/.zshenv",
    "~/.zprofile",
    "~/.zshrc",
    "~/.zlogin",
)
_LOGIN_DIRS = ("/etc/profile.d", "~/.config/environment.d")  # every file in them
# Debian's and Ubuntu's ~/.profile put these on PATH only when they exist: a first `pipx install`
# creates ~/.local/bin and edits no file.
_LOGIN_PATH_DIRS = ("~/.local/bin", "~/bin")


def login_stamp() -> int:
    """A number that changes when a file a new login reads is created, edited, replaced or removed."""
    return _login_state()[0]


def _login_state() -> tuple[int, list[int]]:
    """The login stamp, and the mtimes (ns) of the files and directories it covers that are there."""
    paths = [os.path.expanduser(path) for path in _LOGIN_FILES]
    paths += [value for value in (os.environ.get("BASH_ENV"), os.environ.get("ENV")) if value]
    for directory in _LOGIN_DIRS:
        directory = os.path.expanduser(directory)
        paths.append(directory)
        with contextlib.suppress(OSError):
            paths += [entry.path for entry in os.scandir(directory)]
    total = 0
    mtimes: list[int] = []
    for path in paths:
        try:
            info = os.stat(path)
            total = (total + hash((path, info.st_size, info.st_mtime_ns, info.st_ino))) & _MASK
            mtimes.append(info.st_mtime_ns)
        except OSError:
            total = (total + hash((path, "missing"))) & _MASK
    for directory in _LOGIN_PATH_DIRS:
        directory = os.path.expanduser(directory)
        with contextlib.suppress(OSError):
            mtimes.append(os.stat(directory).st_mtime_ns)
        total = (total + hash((directory, os.path.isdir(directory)))) & _MASK
    return total, mtimes


# A file's mtime comes from a coarse clock (up to a jiffy behind), and a process's start time from /proc
# is in clock ticks (10 ms): a file written just after the start may look a little older than the start.
_START_SLACK_NS = 30_000_000
_UNSURE = -1  # never a stamp (stamps are masked to be >= 0): `login_changed` is true from the first check

_watched_login: list[int] = []  # the stamp this process started from, once `watch_login` was called


def process_start_ns() -> int | None:
    """When this process was forked, on the wall clock (ns), from /proc; None where that cannot be read."""
    try:
        with open("/proc/self/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()  # the command name, in parentheses, may hold spaces
        ticks = int(fields[19])  # field 22, `starttime`: clock ticks after boot (fields[0] is field 3)
        clock_hz = os.sysconf("SC_CLK_TCK")
        age_ns = time.clock_gettime_ns(time.CLOCK_BOOTTIME) - ticks * 1_000_000_000 // clock_hz
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return time.time_ns() - age_ns


def watch_login() -> None:
    """Remember the login files as they are now: this process's environment is what they set.

    The shell that started this process read them before it ran wb, and wb takes the stamp only after its
    imports: a file changed in between would be in the stamp but not in the environment. So a file newer
    than this process's start (the shell's, which execs wb; the slack covers the clocks' grain) leaves the
    environment unsure, and `login_changed` says so at once: a run goes to a new login, and the serve
    session ends at its next check, for one started after the change. A file dated after now (a clock
    set back, a copy that kept another machine's times) was not written in between: it would leave
    every session unsure, so it does not count.
    """
    stamp, mtimes = _login_state()
    started = process_start_ns()
    now = time.time_ns() + _START_SLACK_NS
    unsure = started is not None and any(started - _START_SLACK_NS <= mtime <= now for mtime in mtimes)
    _watched_login[:] = [_UNSURE if unsure else stamp]


def login_changed() -> bool:
    """Whether a new login would now read other files than this process's did (False when not watched)."""
    return bool(_watched_login) and login_stamp() != _watched_login[0]
