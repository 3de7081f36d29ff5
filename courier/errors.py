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
    exit_code = 255


class HostKeyUnknown(TransportError):
    pass


class HostKeyChanged(TransportError):
    pass


class HostKeyConfigRefused(TransportError):
    pass


class ConnectFailed(TransportError):
    pass


class AuthFailed(TransportError):
    pass


class ConnectionLost(TransportError):
    pass


class CallTimedOut(TransportError):
    pass


class ReplyUntrusted(TransportError):
    pass


class SchemaSkew(TransportError):
    pass


class RemoteWbMissing(TransportError):
    pass


class Interrupted(WbError):
    exit_code = 130


def error_for_failure_kind(kind: str | None) -> type[WbError]:
    """Map a peer's `failure_kind` to this program's class (absent or unknown → a finding)."""
    if kind == "request":
        return UsageError
    if kind == "not_found":
        return NotFound
    return Finding
