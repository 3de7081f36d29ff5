"""Stamps of what a long-lived process started from, so it notices when that changed under it.

`program_stamp` covers every `.py` file of the `courier` and `protocol` packages (path, size,
mtime, inode): a reinstall, an upgrade or an edit of an editable checkout changes it.
`login_stamp` covers the files a new login on this machine reads to set its environment (PATH
above all): a serve session that runs dispatches keeps the environment it started with, so it
hands a run to a new login once they changed (docs/courier.md, "Environment").
Light on purpose (os and contextlib): the remote serve mode and the courier check them between calls.
"""

from __future__ import annotations

import contextlib
import os

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
    paths = [os.path.expanduser(path) for path in _LOGIN_FILES]
    paths += [value for value in (os.environ.get("BASH_ENV"), os.environ.get("ENV")) if value]
    for directory in _LOGIN_DIRS:
        directory = os.path.expanduser(directory)
        paths.append(directory)
        with contextlib.suppress(OSError):
            paths += [entry.path for entry in os.scandir(directory)]
    total = 0
    for path in paths:
        try:
            info = os.stat(path)
            total = (total + hash((path, info.st_size, info.st_mtime_ns, info.st_ino))) & _MASK
        except OSError:
            total = (total + hash((path, "missing"))) & _MASK
    for directory in _LOGIN_PATH_DIRS:
        total = (total + hash((directory, os.path.isdir(os.path.expanduser(directory))))) & _MASK
    return total


_watched_login: list[int] = []  # the stamp this process started from, once `watch_login` was called


def watch_login() -> None:
    """Remember the login files as they are now: this process's environment is what they set."""
    _watched_login[:] = [login_stamp()]


def login_changed() -> bool:
    """Whether a new login would now read other files than this process's did (False when not watched)."""
    return bool(_watched_login) and login_stamp() != _watched_login[0]
