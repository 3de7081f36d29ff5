"""The caller's side of the supervisor's loop (docs/cli.md#the-supervisors-loop): follow and prune, here or remotely.

Each function asks through `courier/client/asking.py`, so a local and a remote run behave the same; the
CLI only parses flags and prints what these return.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

from courier.client.asking import ask, upgrade_message
from courier.config import Config
from courier.errors import (
    CallTimedOut,
    ConnectFailed,
    ConnectionLost,
    TransportError,
    UsageError,
    WbError,
)
from courier.ops.await_ import await_chunk_ms
from courier.ops.prune import PruneOutcome
from courier.render import ref_of
from courier.text import sanitize
from protocol import limits
from protocol.documents import FollowLine
from protocol.models import PruneResult, RemoteRequest, Result


def request(operation: str, **fields: object) -> RemoteRequest:
    return RemoteRequest.of(operation, **fields)


# -- logs --follow ---------------------------------------------------------------------------

# Failures worth a retry from the same offset: the connection, not the request or the peer's identity.
_RETRYABLE = (ConnectionLost, CallTimedOut, ConnectFailed)


def retryable(exc: WbError) -> bool:
    return isinstance(exc, _RETRYABLE) or (isinstance(exc, TransportError) and exc.cause == "remote crashed")


def terminal_line(result: Result) -> str:
    line = f"{ref_of(result)} {sanitize(result.state)}"
    if result.failure:
        line += f": {sanitize(result.failure)}"
    return line + "\n"


class NoFollow(UsageError):
    """The machine's wb is too old to follow a run (it has no `follow_from`)."""


def follow(
    config: Config,
    machine: str,
    agent_id: str,
    write: Callable[[str], None],
    warn: Callable[[str], None],
    as_json: bool = False,
    bound_ms: int = 0,
    progress: Callable[[Result], None] | None = None,
    chunk_ms: int | None = None,
) -> Result:
    """Print the run's actions as they happen until it is terminal; the terminal state last (with `as_json`, one
    FollowLine document a line: docs/cli.md, wb agent logs). With `bound_ms` (0: none), return the run as it is
    once that long has passed (`dispatch --follow --wait-timeout`). `progress` sees the run after every reply
    that finds it still going; `chunk_ms` shortens each call's wait (at most 5 min) so those come more often.

    Each call waits at most 5 min on the machine holding the run; a dropped connection is
    retried from the same byte offset, so no action is printed twice or lost.
    """
    offset = 0
    failures = 0
    deadline = time.monotonic() + bound_ms / limits.MS_PER_SECOND if bound_ms else None
    while True:
        wait_ms = min(chunk_ms or limits.AWAIT_CHUNK_MS, await_chunk_ms())
        if deadline is not None:
            wait_ms = max(1, min(wait_ms, int((deadline - time.monotonic()) * limits.MS_PER_SECOND)))
        call = request("logs", agent_id=agent_id, follow=True, follow_from=offset, wait_timeout_ms=wait_ms)
        try:
            response = ask(config, machine, call)
        except WbError as exc:
            if not retryable(exc) or failures >= limits.FOLLOW_RETRIES:  # this machine's never are
                raise
            failures += 1
            warn(f"{exc.message}; following again from byte {offset} (attempt {failures} of {limits.FOLLOW_RETRIES})")
            time.sleep(min(2.0**failures / 4, 5.0))
            continue
        failures = 0
        if response.next_offset is None:
            raise NoFollow(upgrade_message(machine, response.wb_version, "logs --follow"))
        if response.logs and as_json:
            write(_json_lines(machine, agent_id, response.logs))
        elif response.logs:
            write(sanitize(response.logs, keep_newlines=True))
        offset = response.next_offset
        result = response.result_of()  # another machine's carries `machine` (stamped by its caller)
        if result.terminal:
            write(_json_end(machine, result) if as_json else terminal_line(result))
            return result
        if deadline is not None and time.monotonic() >= deadline:
            return result
        if progress is not None:
            progress(result)


def _json_lines(machine: str, agent_id: str, logs: str) -> str:
    from courier.ops.logs import actions_of

    return "".join(_line(FollowLine(agent_id=agent_id, machine=machine or None, action=action, state=None,
                                    failure=None)) for action in actions_of(logs))  # fmt: skip


def _json_end(machine: str, result: Result) -> str:
    end = FollowLine(agent_id=result.agent_id, machine=machine or None, action=None, state=result.state,
                     failure=result.failure)  # fmt: skip
    return _line(end)


def _line(document: FollowLine) -> str:
    # ASCII: control, bidirectional and line-separator characters in an action arrive escaped.
    return json.dumps(document.to_json(), ensure_ascii=True, separators=(",", ":")) + "\n"


# -- prune -------------------------------------------------------------------------------------


def prune_on(
    config: Config, machine: str, older_than_ms: int, dry_run: bool, timeout_s: float, worktrees: bool = False
) -> PruneOutcome:
    try:
        if worktrees:  # asked of this machine too: every machine is asked the same way
            _require_prune_worktrees(config, machine, timeout_s)
        call = request("prune", older_than_ms=older_than_ms, dry_run=dry_run, worktrees=worktrees)
        response = ask(config, machine, call, timeout_s=timeout_s)
    except WbError as exc:
        return PruneOutcome(machine, None, exc)
    return PruneOutcome(machine, PruneResult.model_validate(response.result or {}))


def _require_prune_worktrees(config: Config, machine: str, timeout_s: float) -> None:
    """An older peer ignores `worktrees` (and would prune the records, leaving their worktrees
    orphaned): ask its capabilities first, as Part two's optional features require."""
    from courier.capabilities import PRUNE_WORKTREES

    version = ask(config, machine, request("version"), timeout_s=timeout_s)
    if PRUNE_WORKTREES not in (version.capabilities or []):
        raise UsageError(upgrade_message(machine, version.wb_version, "prune --worktrees"))


def prune_machines(
    config: Config, machines: list[str], older_than_ms: int, dry_run: bool, timeout_s: float, worktrees: bool = False
) -> list[PruneOutcome]:
    """Prune on each machine concurrently (at most the fleet fan-out in flight), results in the given order.

    Each machine's call is bounded by `timeout_s` (--machine-timeout).
    """
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, min(limits.FLEET_MAX_IN_FLIGHT, len(machines)))) as pool:
        return list(pool.map(lambda m: prune_on(config, m, older_than_ms, dry_run, timeout_s, worktrees), machines))


def write_bytes(data: bytes) -> None:
    sys.stdout.flush()
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
