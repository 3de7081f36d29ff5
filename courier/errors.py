"""One error tree; each class carries its exit code (docs/cli.md#exit-codes).

WbError (1)
├── UsageError (2)            the invocation, request or configuration is invalid
├── Finding (1)               a fact about the machine's state
│   ├── NotFound (1)          unknown run
│   ├── RecordUnreadable (1)  a record that exists but cannot be trusted
│   └── NotStartable (1)      clone missing, worktree busy, credential unusable, …
│       └── GitFailed (1)     a git command the answer needs failed
├── TransportError (255)      the machine could not be asked or its answer not trusted
│   ├── before sending:       HostKeyUnknown, HostKeyChanged, HostKeyConfigRefused, ConnectFailed, AuthFailed
│   └── after (maybe sent):   ConnectionLost, CallTimedOut, ReplyUntrusted, SchemaSkew, RemoteWbMissing
└── Interrupted (130)         Ctrl-C

`request_maybe_sent` says whether the request may have reached the machine when the error
happened: a dispatch that fails that way names the reference it intended (docs/cli.md#wb-agent-dispatch).
"""

from __future__ import annotations

from protocol import limits


class WbError(Exception):
    exit_code = 1
    failure_kind = "failed"
    request_maybe_sent = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UsageError(WbError):
    exit_code = limits.EXIT_USAGE
    failure_kind = "request"


class Finding(WbError):
    exit_code = 1
    failure_kind = "failed"


class NotFound(Finding):
    failure_kind = "not_found"


class NotStartable(Finding):
    pass


class NeedsNewLogin(Finding):
    """A serve session's environment lacks what a run needs (its harness on PATH): a one-call session, which
    starts with the environment a new login gets now, may have it (docs/courier.md, "Environment")."""

    failure_kind = "new_login"


class RecordUnreadable(Finding):
    """A record that exists but cannot be trusted (corrupt, symlinked, unreadable)."""


class GitFailed(NotStartable):
    """A git command needed for an answer (not just a summary) failed: the run cannot start (exit 1)."""


class TransportError(WbError):
    """`cause` is a short classification for fleet views ("auth", "timeout", "unknown host key", …)."""

    exit_code = limits.EXIT_TRANSPORT
    cause = "transport"
    request_maybe_sent = True

    def __init__(self, message: str, *, cause: str | None = None) -> None:
        super().__init__(message)
        if cause is not None:
            self.cause = cause


class HostKeyUnknown(TransportError):
    cause = "unknown host key"
    request_maybe_sent = False


class HostKeyChanged(TransportError):
    cause = "changed host key"
    request_maybe_sent = False


class HostKeyConfigRefused(TransportError):
    cause = "host key verification disabled"
    request_maybe_sent = False


class ConnectFailed(TransportError):
    cause = "refused"
    request_maybe_sent = False


class AuthFailed(TransportError):
    cause = "auth"
    request_maybe_sent = False


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
    exit_code = limits.EXIT_INTERRUPTED


def error_for_failure_kind(kind: str | None) -> type[WbError]:
    """Map a peer's `failure_kind` to this program's class (absent or unknown → a finding)."""
    if kind == "request":
        return UsageError
    if kind == "not_found":
        return NotFound
    return Finding
