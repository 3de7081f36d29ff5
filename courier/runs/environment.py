"""The worker's environment: an allowlist plus the provider's one credential
(docs/runs.md#environment-and-credentials); the harness adds its home."""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from courier.config import ALLOWLISTED_ENV, Provider
from courier.errors import NotStartable
from protocol import limits

FILE_CREDENTIAL_ENV = "WB_AGENT_PROVIDER_CREDENTIAL"


@dataclass(frozen=True)
class Credential:
    env_name: str  # the variable the harness reads
    value: str = ""

    def __repr__(self) -> str:  # never let a value reach a log or a traceback
        return f"Credential(env_name={self.env_name!r}, value=<redacted>)"


def resolve_credential(provider_name: str, provider: Provider, environ: dict[str, str] | None = None) -> Credential:
    environ = dict(os.environ) if environ is None else environ
    if provider.credential_env:
        value = environ.get(provider.credential_env, "").strip()
        if not value:
            raise NotStartable(
                f"provider {provider_name}: the credential variable {provider.credential_env} is not set "
                "in this environment (on a remote machine prefer credential_file)"
            )
        _check_length(value, f"provider {provider_name}: the credential variable {provider.credential_env}")
        return Credential(provider.credential_env, value)
    assert provider.credential_file is not None
    return Credential(FILE_CREDENTIAL_ENV, read_credential_file(provider_name, Path(provider.credential_file)))


def read_credential_file(provider_name: str, path: Path) -> str:
    """Open without following links or blocking, then check the open descriptor itself."""
    where = f"provider {provider_name}: credential_file {path}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise NotStartable(f"{where} does not exist") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # the last component is a symlink
            raise NotStartable(f"{where} is a symlink; point credential_file at the real file") from None
        raise NotStartable(f"{where} cannot be opened: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = "a FIFO" if stat.S_ISFIFO(info.st_mode) else "not a regular file"
            raise NotStartable(f"{where} is {kind}")
        if info.st_uid != os.getuid():
            raise NotStartable(f"{where} is not owned by you")
        if info.st_mode & 0o077:
            raise NotStartable(f"{where} is readable or writable by group/others; run chmod 600 {path}")
        if info.st_size == 0:
            raise NotStartable(f"{where} is empty")
        if info.st_size > limits.CREDENTIAL_FILE_MAX_BYTES:
            raise NotStartable(f"{where} is larger than {limits.CREDENTIAL_FILE_MAX_BYTES} bytes")
        parent = os.stat(path.parent)
        if parent.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise NotStartable(f"{where}: its directory {path.parent} is writable by group/others")
        raw = os.read(fd, limits.CREDENTIAL_FILE_MAX_BYTES + 1)
    finally:
        os.close(fd)
    try:
        value = raw.decode().strip()
    except UnicodeDecodeError:
        raise NotStartable(f"{where} is not UTF-8 text") from None
    if not value:
        raise NotStartable(f"{where} is empty")
    _check_length(value, where)
    return value


def _check_length(value: str, where: str) -> None:
    """A credential shorter than 8 bytes is refused: its mask would rewrite ordinary text (docs/cli.md)."""
    if len(value.encode()) < limits.CREDENTIAL_MIN_BYTES:
        raise NotStartable(
            f"{where} holds a credential shorter than {limits.CREDENTIAL_MIN_BYTES} bytes, "
            "too short to be kept out of what the run stores; use the real credential"
        )


def worker_environment(credential: Credential | None, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The allowlisted variables, then the one credential (none for a harness without a provider)."""
    environ = dict(os.environ) if environ is None else environ
    env = {name: environ[name] for name in ALLOWLISTED_ENV if name in environ}
    if credential is not None:
        env[credential.env_name] = credential.value
    return env
