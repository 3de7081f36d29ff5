"""Where this user's courier listens, and the one way to connect to it (light: os, sys, zlib and `_socket` only).

The socket lives in a 0700 directory owned by the user: `$XDG_RUNTIME_DIR/wb/` when that
is a private directory of the user's, else `<WB_HOME or ~/.wb>/run/`. Its name carries a
key of the environment the courier's SSH connections depend on (HOME, the ssh config
wb reads, the agent socket, WB_HOME, the interpreter and the program's location), so one
courier serves one user's one setup, and a different setup (a test's own HOME, another
checkout of wb) gets its own courier instead of borrowing connections made for another.
"""

from __future__ import annotations

import _socket
import os
import stat
import sys
import zlib

TYPE_CHECKING = False  # typing's own import loads `re`, which the warm path never does
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TypeVar

    Socket = TypeVar("Socket", bound=_socket.socket)

RUN_DIR_NAME = "run"
XDG_SUBDIR = "wb"
# The environment a courier's own SSH connections depend on (docs/courier.md: the caller's
# environment must behave identically, so callers that differ here get their own courier).
KEY_VARIABLES = (
    "HOME",
    "USER",
    "LOGNAME",
    "WB_HOME",
    "WB_SSH_CONFIG",
    "WB_SSH_KEEPALIVE_S",
    "SSH_AUTH_SOCK",
    "XDG_RUNTIME_DIR",
)
# sockaddr_un holds 108 bytes; a longer path is reached through /proc/self/fd/<dir fd>/.
SUN_PATH_MAX = 100


def _private_dir(path: str) -> bool:
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077


def run_dir(env: dict[str, str] | os._Environ[str]) -> str | None:
    """The courier's directory for this environment, or None when it cannot be used.

    A WB_HOME that exists but is not a private directory of the user's is not used (the
    command then runs cold and reports it, docs/config.md#homes); a missing one is created 0700 by
    `ensure_run_dir`, as any wb command creates it.
    """
    xdg = env.get("XDG_RUNTIME_DIR", "")
    if xdg and os.path.isabs(xdg) and _private_dir(xdg):
        return os.path.join(xdg, XDG_SUBDIR)
    home, problem = _usable_home(env)
    return None if problem else os.path.join(home, RUN_DIR_NAME)


def no_run_dir_reason(env: dict[str, str] | os._Environ[str]) -> str:
    """Why `run_dir` found no directory for the courier, in words a user can act on ("" when it did)."""
    return "" if run_dir(env) is not None else _usable_home(env)[1]


def _usable_home(env: dict[str, str] | os._Environ[str]) -> tuple[str, str]:
    """The wb home the courier's directory goes under, and what makes it unusable ("" when nothing)."""
    home = env.get("WB_HOME", "")
    if home:
        home = _expand(home, env)
    else:
        user_home = env.get("HOME", "")
        if not user_home:
            return "", "neither WB_HOME nor HOME is set"
        home = os.path.join(user_home, ".wb")
    if not os.path.isabs(home):
        return home, f"the wb home {home} is not an absolute path"
    if os.path.lexists(home) and not _private_dir(home):
        return home, f"the wb home {home} is not a private directory of yours (chmod 700 {home})"
    return home, ""


def ensure_run_dir(socket: str) -> bool:
    """Create the socket's directory (and a missing WB_HOME above it) 0700; True when both are private."""
    directory = os.path.dirname(socket)
    parent = os.path.dirname(directory)
    if os.path.basename(directory) == RUN_DIR_NAME and not ensure_private_dir(parent):
        return False
    return ensure_private_dir(directory)


def _expand(path: str, env: dict[str, str] | os._Environ[str]) -> str:
    user_home = env.get("HOME", "")
    if path == "~" or path.startswith("~/"):
        return user_home + path[1:] if user_home else path
    return os.path.expanduser(path)


def ensure_private_dir(path: str) -> bool:
    """Create `path` 0700 when missing; True only when it is then a private directory of ours."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return False
    return _private_dir(path)


def environment_key(env: dict[str, str] | os._Environ[str]) -> str:
    text = "\0".join(f"{name}={env.get(name, '')}" for name in KEY_VARIABLES)
    text += f"\0{sys.executable}\0{os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}\0{os.getuid()}"
    data = text.encode("utf-8", "surrogateescape")
    return f"{zlib.crc32(data):08x}{zlib.adler32(data[::-1]):08x}"


def socket_path(env: dict[str, str] | os._Environ[str]) -> str | None:
    directory = run_dir(env)
    if directory is None:
        return None
    return os.path.join(directory, f"courier-{environment_key(env)}.sock")


def lock_path(socket: str) -> str:
    return socket[: -len(".sock")] + ".lock"


def sun_path(path: str) -> tuple[str, int | None]:
    """An address for bind/connect: the path itself, or /proc/self/fd/<dirfd>/name for a long one.

    The caller closes the returned directory fd (when not None) after bind/connect.
    """
    if len(os.fsencode(path)) <= SUN_PATH_MAX:
        return path, None
    directory, name = os.path.split(path)
    try:
        fd = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return path, None  # the directory is missing: connecting fails as it should
    return f"/proc/self/fd/{fd}/{name}", fd


def connect(path: str, make: Callable[[int, int], Socket], timeout: float | None = None) -> Socket | None:
    """A stream socket connected to the courier listening at `path`; None when nobody listens there.

    `make` is the caller's socket class: `_socket.socket` on the thin client's path (the
    `socket` package's enums cost a warm command milliseconds), `socket.socket` elsewhere.
    """
    sock = make(_socket.AF_UNIX, _socket.SOCK_STREAM)
    if timeout is not None:
        sock.settimeout(timeout)
    address, dir_fd = sun_path(path)
    try:
        sock.connect(address)
    except OSError:
        sock.close()
        return None
    finally:
        if dir_fd is not None:
            os.close(dir_fd)
    return sock
