"""The operation table (docs/protocol.md#the-request; docs/cli.md#the-supervisors-loop): one entry per operation, read
by every side.

An entry holds what the operation takes (`fields`, `check`) and what its reply carries
(`reply`). The validator, the receiver and the caller's reply checks all read this table;
who answers an operation on the receiving machine is the courier's business (its handler
registry, courier/operations.py), so this package stays a leaf that names no courier module.
Adding an operation is one entry here, its handler and registry line, its CLI command and
its tests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from protocol import limits
from protocol.models import WORKTREE_MODES, RemoteRequest
from protocol.refs import check_repository, check_run_id, check_worktree_name
from protocol.rules import RequestRefused, check_ref_text, check_task, check_timeout_ms

# What a reply carries besides the envelope: one Result, a list of Results, transcript text
# (with a follow call, also the run's Result), stop's own three-field result, a diff, a prune
# summary, or nothing.
Reply = Literal["result", "results", "logs", "stop", "diff", "prune", "none"]


@dataclass(frozen=True)
class Operation:
    name: str
    reply: Reply
    fields: tuple[str, ...] = ()  # the request fields it reads, besides schema_version and operation
    needs_agent_id: bool = False
    check: Callable[[RemoteRequest], None] | None = None
    # An optional feature of Part two: used with a peer only when its `version` lists it.
    capability: str | None = None


def _check_dispatch(request: RemoteRequest) -> None:
    if request.mode not in WORKTREE_MODES:
        raise RequestRefused(f'dispatch mode must be "new" or "existing", not "{request.mode[:32]}"')
    if not request.worktree:
        raise RequestRefused("dispatch needs worktree")
    check_worktree_name(request.worktree)
    if not request.profile.strip():
        raise RequestRefused("dispatch needs profile")
    if not request.profile.isprintable() or len(request.profile) > limits.PROFILE_NAME_MAX_CHARS:
        raise RequestRefused(f"profile must be a printable name of at most {limits.PROFILE_NAME_MAX_CHARS} characters")
    check_task(request.task)
    if request.mode == "new" and not request.repository:
        raise RequestRefused("dispatch with mode new needs repository (OWNER/REPO)")
    if request.repository:
        check_repository(request.repository)
    if request.branch:
        if request.mode != "new":
            raise RequestRefused("branch applies only to mode new (a new worktree)")
        check_ref_text(request.branch, "branch")
    if request.base:
        check_ref_text(request.base, "base")
    check_timeout_ms(request.timeout_ms)
    if request.agent_id:
        check_run_id(request.agent_id)
    if request.max_running < 0:
        raise RequestRefused("max_running must be >= 0 (0 means no bound)")


def _check_version(request: RemoteRequest) -> None:
    if request.repository:
        check_repository(request.repository)


def _check_await(request: RemoteRequest) -> None:
    if request.wait_timeout_ms < 0:
        raise RequestRefused("wait_timeout_ms must be >= 0 (0 means no bound)")


def _check_logs(request: RemoteRequest) -> None:
    if request.tail < 0:
        raise RequestRefused(f"tail must be >= 0 (0 means the default of {limits.LOGS_TAIL_DEFAULT})")
    if not 0 <= request.follow_from <= limits.BYTE_OFFSET_MAX:
        raise RequestRefused("follow_from must be a byte offset of events.jsonl, 0 <= n < 2^63")
    if request.wait_timeout_ms < 0:
        raise RequestRefused("wait_timeout_ms must be >= 0")
    if request.follow and request.wait_timeout_ms > limits.FOLLOW_WAIT_MAX_MS:
        raise RequestRefused(
            f"a follow call waits at most {limits.FOLLOW_WAIT_MAX_MS} ms ({limits.FOLLOW_WAIT_MAX_TEXT}); "
            "repeat the call from next_offset"
        )


def _check_continue(request: RemoteRequest) -> None:
    check_task(request.task)
    if request.profile and (not request.profile.isprintable() or len(request.profile) > limits.PROFILE_NAME_MAX_CHARS):
        raise RequestRefused(f"profile must be a printable name of at most {limits.PROFILE_NAME_MAX_CHARS} characters")
    check_timeout_ms(request.timeout_ms)
    if request.new_agent_id:
        check_run_id(request.new_agent_id)


def _check_prune(request: RemoteRequest) -> None:
    if request.older_than_ms < 0:
        raise RequestRefused("older_than_ms must be >= 0")


def _check_watch(request: RemoteRequest) -> None:
    if not 0 <= request.wait_timeout_ms <= limits.FOLLOW_WAIT_MAX_MS:
        raise RequestRefused(
            f"a watch call waits at most {limits.FOLLOW_WAIT_MAX_MS} ms ({limits.FOLLOW_WAIT_MAX_TEXT}); "
            "repeat the call with the reply's watch_cursor"
        )
    if len(request.watch_cursor) > limits.WATCH_CURSOR_MAX_BYTES:
        raise RequestRefused(f"watch_cursor is longer than {limits.WATCH_CURSOR_MAX_BYTES} bytes")


TABLE: dict[str, Operation] = {
    op.name: op
    for op in (
        Operation(
            "dispatch",
            "result",
            (
                "mode",
                "worktree",
                "profile",
                "task",
                "repository",
                "branch",
                "base",
                "timeout_ms",
                "agent_id",
                "max_running",
            ),
            check=_check_dispatch,
        ),
        Operation("status", "result", ("agent_id",), needs_agent_id=True),
        Operation(
            "await",
            "result",
            ("agent_id", "wait_timeout_ms"),
            needs_agent_id=True,
            check=_check_await,
        ),
        Operation("list", "results"),
        Operation(
            "logs",
            "logs",
            ("agent_id", "raw", "tail", "follow", "follow_from", "wait_timeout_ms"),
            needs_agent_id=True,
            check=_check_logs,
        ),
        Operation("stop", "stop", ("agent_id",), needs_agent_id=True),
        Operation("version", "none", ("placement", "repository"), check=_check_version),
        # The supervisor's loop (docs/cli.md#the-supervisors-loop).
        Operation("diff", "diff", ("agent_id", "stat"), needs_agent_id=True, capability="diff"),
        Operation(
            "continue",
            "result",
            ("agent_id", "task", "profile", "timeout_ms", "new_agent_id"),
            needs_agent_id=True,
            check=_check_continue,
            capability="continue",
        ),
        Operation("prune", "prune", ("older_than_ms", "dry_run"), check=_check_prune, capability="prune"),
        # docs/protocol.md, watch: one long-poll per machine for wb agent watch.
        Operation("watch", "results", ("watch_cursor", "wait_timeout_ms"), check=_check_watch, capability="watch"),
    )
}

OPERATIONS = tuple(TABLE)


def operation(name: str) -> Operation:
    """The table entry for `name`; an unknown operation is a refusal naming the known ones."""
    entry = TABLE.get(name)
    if entry is None:
        raise RequestRefused(f'unknown operation "{name[:64]}": expected one of {", ".join(OPERATIONS)}')
    return entry
