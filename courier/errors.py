"""One error tree; each class carries its exit code (contract §3.9).

WbError (1)
├── UsageError (2)            the invocation, request or configuration is invalid
├── Finding (1)               a fact about the machine's state
│   ├── NotFound (1)          unknown run
│   └── NotStartable (1)      clone missing, worktree busy, credential unusable, …
└── TransportError (255)      the machine could not be asked or its answer not trusted
    ├── HostKeyUnknown, HostKeyChanged, HostKeyConfigRefused
    ├── ConnectFailed, AuthFailed, ConnectionLost, CallTimedOut
    └── ReplyUntrusted, SchemaSkew, RemoteWbMissing
"""

from __future__ import annotations


class WbError(Exception):
    exit_code = 1
    failure_kind = "failed"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UsageError(WbError):
    exit_code = 2
    failure_kind = "request"


class Finding(WbError):
    exit_code = 1
    failure_kind = "failed"


class NotFound(Finding):
    failure_kind = "not_found"


class NotStartable(Finding):
    pass


class TransportError(WbError):
    """`cause` is a short classification for fleet views ("auth", "timeout", "unknown host key", …)."""

    exit_code = 255
    cause = "transport"

    def __init__(self, message: str, *, cause: str | None = None) -> None:
        super().__init__(message)
        if cause is not None:
            self.cause = cause


class HostKeyUnknown(TransportError):
    cause = "unknown host key"


class HostKeyChanged(TransportError):
    cause = "changed host key"


class HostKeyConfigRefused(TransportError):
    cause = "host key verification disabled"


class ConnectFailed(TransportError):
    cause = "refused"


class AuthFailed(TransportError):
    cause = "auth"


class ConnectionLost(TransportError):
    cause = "connection lost"


class CallTimedOut(TransportError):
    cause = "timeout"


class ReplyUntrusted(TransportError):
    cause = "untrusted reply"


class SchemaSkew(TransportError):
    cause = "schema skew"


class RemoteWbMissing(TransportError):
    cause = "wb missing"


class Interrupted(WbError):
    exit_code = 130


def error_for_failure_kind(kind: str | None) -> type[WbError]:
    """Map a peer's `failure_kind` to this program's class (absent or unknown → a finding)."""
    if kind == "request":
        return UsageError
    if kind == "not_found":
        return NotFound
    return Finding
