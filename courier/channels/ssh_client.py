"""The one asyncssh module: connect with OpenSSH's strictness, run one command, translate every failure.

Callers never see asyncssh types: each failure leaves this module as a `courier.errors`
TransportError subclass naming the machine, the address and the cause.

Which OpenSSH client config is read: `$WB_SSH_CONFIG` when set (then it is the only one,
which keeps tests and unusual setups away from the real `~/.ssh`), else `~/.ssh/config`
and `/etc/ssh/ssh_config`, each only when it exists. `$WB_SSH_KEEPALIVE_S` overrides the
keepalive interval (a knob for tests that must see a dead peer quickly).
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from courier.channels.asyncssh_import import preload_asyncssh
from courier.channels.channel import Bounds, Outcome
from courier.channels.ssh_endpoint import Endpoint
from courier.errors import (
    AuthFailed,
    CallTimedOut,
    ConnectFailed,
    ConnectionLost,
    HostKeyChanged,
    HostKeyConfigRefused,
    HostKeyUnknown,
    TransportError,
)
from courier.stage_trace import mark
from protocol import limits

preload_asyncssh()  # before asyncssh's first import: no gcc and ld runs (courier/channels/asyncssh_import.py)

import asyncssh  # noqa: E402
from asyncssh.config import SSHClientConfig, SSHConfig  # noqa: E402

CONFIG_ENV = "WB_SSH_CONFIG"
KEEPALIVE_ENV = "WB_SSH_KEEPALIVE_S"
DEFAULT_PORT = 22
_READ_CHUNK = limits.SSH_READ_CHUNK_BYTES
_DEV_NULL = "/dev/null"
_ADDRESS_OPTIONS = frozenset({"Hostname", "Port", "User"})
_STRICT_OPTION = re.compile(r"^\s*StrictHostKeyChecking\b", re.IGNORECASE | re.MULTILINE)


@dataclass
class _Settings:
    """The ssh config as it applies to one endpoint, resolved before connecting."""

    config_paths: list[str]
    hostname: str
    port: int
    user: str
    known_hosts_files: list[str]
    strict_in_config: bool
    connect_timeout_s: float
    keepalive_interval_s: float
    keepalive_count_max: int
    host_key_alias: str | None
    options: str = ""  # every other ssh option that applies, as one comparable text

    @property
    def address(self) -> str:
        return f"{self.hostname}:{self.port}"


Settings = _Settings  # what `resolve` returns, for the pool that passes it along


def config_paths() -> list[str]:
    explicit = os.environ.get(CONFIG_ENV)
    if explicit:
        return [explicit]
    candidates = [Path("~/.ssh/config").expanduser(), Path("/etc/ssh/ssh_config")]
    return [str(path) for path in candidates if path.is_file() and os.access(path, os.R_OK)]


def _positive_float(value: object, default: float) -> float:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return default
    return number if number > 0 else default


def _resolve(endpoint: Endpoint) -> _Settings:
    paths = config_paths()
    local_user = getpass.getuser()
    try:
        config = SSHClientConfig.load(
            None,
            paths,
            False,
            False,
            False,
            local_user,
            endpoint.user if endpoint.user else (),
            endpoint.host,
            endpoint.port if endpoint.port else (),
        )
    except (asyncssh.Error, OSError, ValueError) as exc:
        where = ", ".join(paths)
        raise ConnectFailed(
            f"{endpoint.machine}: cannot use the ssh config ({where}): {exc}", cause="ssh config"
        ) from None
    hostname = str(config.get("Hostname", endpoint.host))
    port = int(endpoint.port or config.get("Port", DEFAULT_PORT))  # type: ignore[call-overload]
    user = str(endpoint.user or config.get("User", local_user))
    strict = any(_mentions_strict(path) for path in paths)
    files = _known_hosts_files(endpoint.machine, config, strict)
    keepalive = _positive_float(config.get("ServerAliveInterval"), limits.SSH_KEEPALIVE_INTERVAL_S)
    keepalive = _positive_float(os.environ.get(KEEPALIVE_ENV), keepalive)
    count_max = config.get("ServerAliveCountMax")
    alias = config.get("HostKeyAlias")
    return _Settings(
        config_paths=paths,
        hostname=hostname,
        port=port,
        user=user,
        known_hosts_files=files,
        strict_in_config=strict,
        connect_timeout_s=_positive_float(config.get("ConnectTimeout"), limits.SSH_CONNECT_TIMEOUT_S),
        keepalive_interval_s=keepalive,
        keepalive_count_max=count_max
        if isinstance(count_max, int) and count_max > 0
        else limits.SSH_KEEPALIVE_COUNT_MAX,
        host_key_alias=alias if isinstance(alias, str) and alias else None,
        options=repr(sorted((k, repr(v)) for k, v in config.get_options(False).items() if k not in _ADDRESS_OPTIONS)),
    )


def connection_key(endpoint: Endpoint, settings: _Settings | None = None) -> tuple[str, str]:
    """(address, key) of an endpoint: endpoints with one key may share a connection (aliases of one host do).

    The key is the user, host and port the ssh config resolves to plus every other option
    that applies (identity, proxy, known hosts, …), so sharing never changes how one connects.
    `settings`: the endpoint already resolved for this call (the courier resolves once per call).
    """
    settings = settings or _resolve(endpoint)
    return settings.address, f"{settings.user}@{settings.address} {settings.config_paths!r} {settings.options}"


def _mentions_strict(path: str) -> bool:
    try:
        return _STRICT_OPTION.search(Path(path).read_text(errors="replace")) is not None
    except OSError:
        return False


def _strict_note(strict: bool) -> str:
    return " (StrictHostKeyChecking in the ssh config is not honoured: wb always verifies host keys)" if strict else ""


def _known_hosts_files(machine: str, config: SSHConfig, strict: bool) -> list[str]:
    """The files whose keys are trusted; a config that turns verification off is refused."""
    user_files = config.get("UserKnownHostsFile")
    global_files = config.get("GlobalKnownHostsFile")
    if user_files == [] or global_files == []:
        raise HostKeyConfigRefused(
            f"{machine}: the ssh config sets UserKnownHostsFile/GlobalKnownHostsFile to none, which disables "
            f"host-key verification; wb refuses to connect without it: remove that setting for this host"
            + _strict_note(strict)
        )
    users = [str(item) for item in user_files] if isinstance(user_files, list) else ["~/.ssh/known_hosts"]
    globals_ = [str(item) for item in global_files] if isinstance(global_files, list) else ["/etc/ssh/ssh_known_hosts"]
    expanded_users = [os.path.expanduser(item) for item in users]
    if all(item == _DEV_NULL for item in expanded_users):
        raise HostKeyConfigRefused(
            f"{machine}: the ssh config sets UserKnownHostsFile to /dev/null, so no host key can be remembered "
            f"or verified; wb refuses to connect that way: point UserKnownHostsFile at a real file "
            f"(e.g. ~/.ssh/known_hosts) and accept the key once with ssh" + _strict_note(strict)
        )
    out: list[str] = []
    for item in expanded_users + [os.path.expanduser(item) for item in globals_]:
        if item != _DEV_NULL and os.path.isfile(item) and item not in out:
            out.append(item)
    return out


def _load_known_hosts(machine: str, files: Sequence[str]) -> asyncssh.SSHKnownHosts:
    try:
        return asyncssh.import_known_hosts("".join(_read_text(path) for path in files))
    except (ValueError, asyncssh.Error) as exc:
        raise HostKeyConfigRefused(
            f"{machine}: cannot read the known-hosts files ({', '.join(files)}): {exc}", cause="host key config"
        ) from None


def _read_text(path: str) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return text if text.endswith("\n") or not text else text + "\n"


@dataclass
class _Rejection:
    host: str
    addr: str
    port: int
    fingerprint: str


@dataclass
class _Verifier:
    """Remembers the key the server presented when it was not trusted, to tell unknown from changed."""

    rejected: list[_Rejection] = field(default_factory=list)


class _Client(asyncssh.SSHClient):
    def __init__(self, verifier: _Verifier) -> None:
        self._verifier = verifier

    def validate_host_public_key(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
        self._verifier.rejected.append(_Rejection(host, addr, port, key.get_fingerprint()))
        return False


class SessionRefused(ConnectionLost):
    """The server refused to open one more session on a live connection (e.g. its MaxSessions)."""

    cause = "session refused"


class _Overflow(Exception):
    """One output stream of the remote command passed its cap."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.stream = stream


class Connection:
    """One authenticated SSH connection to one machine; reusable for several commands."""

    def __init__(self, endpoint: Endpoint, settings: _Settings, conn: asyncssh.SSHClientConnection) -> None:
        self.endpoint = endpoint
        self._settings = settings
        self._conn = conn

    @property
    def where(self) -> str:
        return f"{self.endpoint.machine} ({self._settings.address})"

    # -- the warm path (docs/courier.md): a pooled connection is re-verified before each call --

    @property
    def closed(self) -> bool:
        return self._conn.is_closed()

    def host_key_still_trusted(self, settings: _Settings) -> bool:
        """Whether the key this server presented is trusted by the known-hosts files as they are now.

        Looked at afresh on every call, so a key removed or changed in known_hosts takes effect
        at once on an already-open connection (stricter than OpenSSH's ControlMaster).
        """
        key = self._conn.get_server_host_key()
        if key is None:
            return False
        known = _known_hosts(settings.known_hosts_files)
        if known is None:
            return False
        peer = self._conn.get_extra_info("peername")
        addr = str(peer[0]) if peer else ""
        port = None if settings.port == DEFAULT_PORT else settings.port
        matched = asyncssh.match_known_hosts(known, settings.host_key_alias or settings.hostname, addr, port)
        trusted, revoked = matched[0], matched[2]
        return key not in revoked and key in trusted

    async def start(self, command: str) -> Stream:
        """A long-lived remote command (no PTY, no forwarding) whose stdio the caller drives."""
        try:
            process = await self._conn.create_process(
                command, encoding=None, request_pty=False, term_type=None, x11_forwarding=False
            )
        except (asyncssh.Error, OSError) as exc:
            raise self._lost(exc) from None
        return Stream(self, process)

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        self._conn.close()
        with contextlib.suppress(Exception):
            await self._conn.wait_closed()

    async def run(
        self,
        command: str,
        stdin: bytes,
        *,
        stdout_max: int = limits.REPLY_STDOUT_MAX_BYTES,
        stderr_max: int = limits.REPLY_STDERR_MAX_BYTES,
    ) -> Outcome:
        """Run one command without a PTY or forwarding: stdin then EOF, both outputs read within their caps."""
        try:
            process = await self._conn.create_process(
                command,
                encoding=None,
                request_pty=False,
                term_type=None,
                x11_forwarding=False,
            )
        except asyncssh.ChannelOpenError as exc:
            raise SessionRefused(
                f"{self.where}: the server refused a new session ({_describe(exc)}); "
                "its MaxSessions may be lower than the sessions wb opens on one connection"
            ) from None
        except (asyncssh.Error, OSError) as exc:
            raise self._lost(exc) from None
        outcome = Outcome(stdout=b"", stderr=b"", exit_status=None, exit_signal=None)
        try:
            await self._exchange(process, stdin, outcome, stdout_max, stderr_max)
        except (asyncssh.Error, OSError) as exc:
            raise self._lost(exc) from None
        finally:
            if process.exit_status is None and process.exit_signal is None:
                _end_far_side(process)  # given up on (the call's bound, Ctrl-C) before it ended
            process.close()
        return outcome

    async def _exchange(
        self,
        process: asyncssh.SSHClientProcess[bytes],
        stdin: bytes,
        outcome: Outcome,
        stdout_max: int,
        stderr_max: int,
    ) -> None:
        stdout = bytearray()
        stderr = bytearray()

        async def feed() -> None:
            # The peer may exit without reading (e.g. wb missing): a broken stdin is not the story.
            with contextlib.suppress(asyncssh.Error, OSError, BrokenPipeError):
                process.stdin.write(stdin)
                process.stdin.write_eof()
                await process.stdin.drain()

        async def drain(reader: asyncssh.SSHReader[bytes], sink: bytearray, cap: int, name: str) -> None:
            while True:
                chunk = await reader.read(_READ_CHUNK)
                if not chunk:
                    return
                sink += chunk
                if len(sink) > cap:
                    raise _Overflow(name)

        feeder = asyncio.ensure_future(feed())
        try:
            readers = asyncio.gather(
                drain(process.stdout, stdout, stdout_max, "stdout"),
                drain(process.stderr, stderr, stderr_max, "stderr"),
            )
            try:
                await readers
            except BaseException as exc:
                readers.cancel()
                with contextlib.suppress(BaseException):
                    await readers
                if not isinstance(exc, _Overflow):
                    raise
                # A peer past its cap may keep the session open (and never send EOF on the other
                # stream): stop reading both at once and drop the channel without waiting for it.
                outcome.overflow = exc.stream
                _end_far_side(process)
                process.channel.abort()
            outcome.stdout = bytes(stdout[:stdout_max])
            outcome.stderr = bytes(stderr[:stderr_max])
            if outcome.overflow:
                return
            await process.wait_closed()
        finally:
            if not feeder.done():
                feeder.cancel()
            with contextlib.suppress(BaseException):
                await feeder
        outcome.exit_status = process.exit_status
        signal = process.exit_signal
        outcome.exit_signal = signal[0] if signal else None
        if outcome.exit_status is None and outcome.exit_signal is None:
            raise ConnectionLost(
                f"{self.where}: the connection closed before the remote command reported an exit status",
            )

    def _lost(self, exc: BaseException) -> TransportError:
        reason = _describe(exc)
        if "keepalive" in reason:
            return ConnectionLost(
                f"{self.where}: the connection was lost: the server stopped answering keepalives "
                f"({self._settings.keepalive_count_max} missed at {self._settings.keepalive_interval_s:g}s intervals)",
                cause="connection lost",
            )
        return ConnectionLost(f"{self.where}: the connection was lost: {reason}")


def _end_far_side(process: asyncssh.SSHClientProcess[bytes]) -> None:
    """Ask the server to kill the command of a session this side gives up on, before its channel closes.

    A session without a PTY gets no SIGHUP when its channel closes, and a command that reads
    nothing more and writes nothing (a silent wb_path) never notices: on a connection the
    courier keeps, it would run on for as long as it likes. OpenSSH's sshd delivers the
    `signal` request to the command's whole process group (a run's owner has left it: setsid);
    a server that refuses it closes the channel all the same.
    """
    with contextlib.suppress(Exception):
        process.kill()


# The parsed known-hosts text per list of files, with each file's identity when it was read
# (device, inode, size, mtime in ns; None for a missing one). Every call stats the files and
# parses them again only when one changed: the courier's warm calls re-check the server's key
# each time, and parsing a large known_hosts on each of 64 calls was most of a fleet listing's
# share in the courier (docs/benchmarks.md, fleet).
_KnownHostsEntry = tuple[tuple[tuple[int, int, int, int] | None, ...], Any]
_known_hosts_cache: dict[tuple[str, ...], _KnownHostsEntry] = {}


def _file_identity(path: str) -> tuple[int, int, int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns


def _known_hosts(files: list[str]) -> Any:
    """asyncssh's parsed known-hosts of `files` as they are on disk now; None when they do not parse."""
    key = tuple(files)
    identity = tuple(_file_identity(path) for path in files)
    cached = _known_hosts_cache.get(key)
    if cached is not None and cached[0] == identity:
        return cached[1]
    try:
        known = asyncssh.import_known_hosts("".join(_read_text(path) for path in files))
    except (ValueError, asyncssh.Error):
        known = None
    _known_hosts_cache[key] = (identity, known)
    return known


class Stream:
    """The stdio of one long-lived remote command (the serve mode); failures are ConnectionLost."""

    def __init__(self, connection: Connection, process: asyncssh.SSHClientProcess[bytes]) -> None:
        self._connection = connection
        self._process = process

    async def write(self, data: bytes) -> None:
        try:
            self._process.stdin.write(data)
            await self._process.stdin.drain()
        except (asyncssh.Error, OSError) as exc:
            raise self._connection._lost(exc) from None

    async def read(self, size: int) -> bytes:
        """Up to `size` bytes of stdout; b"" at its end."""
        try:
            return await self._process.stdout.read(size)
        except (asyncssh.Error, OSError) as exc:
            raise self._connection._lost(exc) from None

    async def read_stderr(self, size: int) -> bytes:
        try:
            return await self._process.stderr.read(size)
        except (asyncssh.Error, OSError):
            return b""

    def close(self) -> None:
        self._process.close()


def resolve(endpoint: Endpoint) -> _Settings:
    """The ssh config as it applies to `endpoint` now (the courier keys its pool on it)."""
    return _resolve(endpoint)


def settings_key(settings: _Settings) -> tuple[object, ...]:
    return (
        tuple(settings.config_paths),
        settings.hostname,
        settings.port,
        settings.user,
        tuple(settings.known_hosts_files),
        settings.connect_timeout_s,
        settings.keepalive_interval_s,
        settings.keepalive_count_max,
        settings.host_key_alias,
    )


def _describe(exc: BaseException) -> str:
    if isinstance(exc, asyncssh.DisconnectError):
        text = exc.reason or type(exc).__name__
    elif isinstance(exc, OSError) and exc.strerror:
        text = exc.strerror
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())[:300]


async def connect(endpoint: Endpoint) -> Connection:
    """Open and authenticate one connection; host keys are always verified."""
    settings = _resolve(endpoint)
    known_hosts = _load_known_hosts(endpoint.machine, settings.known_hosts_files)
    verifier = _Verifier()
    where = f"{endpoint.machine} ({settings.address})"
    options: dict[str, Any] = {}
    if endpoint.port:
        options["port"] = endpoint.port
    if endpoint.user:
        options["username"] = endpoint.user
    try:
        conn = await asyncssh.connect(
            endpoint.host,
            config=settings.config_paths or None,
            client_factory=lambda: _Client(verifier),
            known_hosts=known_hosts,
            connect_timeout=settings.connect_timeout_s,
            keepalive_interval=settings.keepalive_interval_s,
            keepalive_count_max=settings.keepalive_count_max,
            agent_forwarding=False,
            x11_forwarding=False,
            request_pty=False,
            term_type=None,
            **options,
        )
    except asyncssh.HostKeyNotVerifiable:
        raise _host_key_error(endpoint, settings, known_hosts, verifier) from None
    except asyncssh.PermissionDenied as exc:
        raise AuthFailed(
            f"{where}: authentication as {settings.user} was refused ({_describe(exc)}); "
            f"check the key (IdentityFile or ssh-agent) and that it is in the remote authorized_keys"
        ) from None
    except TimeoutError:
        raise CallTimedOut(
            f"{where}: connecting timed out after {settings.connect_timeout_s:g}s (ConnectTimeout)"
        ) from None
    except ConnectionRefusedError:
        raise ConnectFailed(f"{where}: connection refused: is sshd running there on port {settings.port}?") from None
    except OSError as exc:
        raise ConnectFailed(f"{where}: cannot connect: {_describe(exc)}", cause="unreachable") from None
    except asyncssh.ConnectionLost as exc:
        raise ConnectionLost(f"{where}: the connection was lost during the handshake: {_describe(exc)}") from None
    except (asyncssh.Error, ValueError) as exc:
        raise ConnectFailed(f"{where}: ssh handshake failed: {_describe(exc)}", cause="handshake") from None
    return Connection(endpoint, settings, conn)


def _host_key_error(
    endpoint: Endpoint, settings: _Settings, known: asyncssh.SSHKnownHosts, verifier: _Verifier
) -> TransportError:
    where = f"{endpoint.machine} ({settings.address})"
    note = _strict_note(settings.strict_in_config)
    name = settings.host_key_alias or settings.hostname
    addr = verifier.rejected[0].addr if verifier.rejected else ""
    fingerprint = verifier.rejected[0].fingerprint if verifier.rejected else "unknown"
    lookup_port = None if settings.port == DEFAULT_PORT else settings.port
    trusted = asyncssh.match_known_hosts(known, name, addr, lookup_port)[0]
    entry = name if lookup_port is None else f"[{name}]:{settings.port}"
    if trusted:
        holder = _file_holding(settings.known_hosts_files, name, addr, lookup_port)
        file_option = (
            f" -f {shlex.quote(holder)}" if holder and holder != os.path.expanduser("~/.ssh/known_hosts") else ""
        )
        return HostKeyChanged(
            f"{where}: the host key has CHANGED (the server now presents {fingerprint}, which does not match "
            f"the key recorded for {entry}{' in ' + holder if holder else ''}); this may be an attack. "
            f"If the change is expected, remove the old key with ssh-keygen -R {shlex.quote(entry)}{file_option} "
            f"and accept the new one once with ssh -p {settings.port} {endpoint.host}" + note
        )
    searched = ", ".join(settings.known_hosts_files) or "none of the known-hosts files exist"
    return HostKeyUnknown(
        f"{where}: the host key is unknown (the server presents {fingerprint}; searched: {searched}); "
        f"connect once with ssh -p {settings.port} {endpoint.host} to check and accept it" + note
    )


def _file_holding(files: Sequence[str], name: str, addr: str, port: int | None) -> str | None:
    for path in files:
        with contextlib.suppress(ValueError, asyncssh.Error):
            if asyncssh.match_known_hosts(asyncssh.import_known_hosts(_read_text(path)), name, addr, port)[0]:
                return path
    return None


async def run_direct(endpoint: Endpoint, command: str, stdin: bytes, bounds: Bounds) -> Outcome:
    """One call on a connection of its own, closed after it (a call outside a fan-out)."""
    mark("ssh.connect")  # asyncssh imported (docs/benchmarks.md#dispatch-latency)
    async with await connect(endpoint) as opened:
        mark("ssh.connected")
        return await opened.run(command, stdin, stdout_max=bounds.stdout_max, stderr_max=bounds.stderr_max)
