"""Flag checks and request helpers shared by the CLI, the MCP server and the operation modules (one way to refuse).

Nothing here writes to stdout: the MCP server's stdout carries only the protocol.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from courier.config import AUTO
from courier.errors import TransportError, UsageError
from protocol import limits
from protocol.durations import BadDuration, default_duration, parse_duration_ms
from protocol.models import RemoteRequest
from protocol.refs import BadName, check_machine_name, split_reference
from protocol.rules import cost_bound_ok, token_bound_ok

TIMEOUT_DEFAULT = default_duration(limits.TIMEOUT_DEFAULT_MS)
AWAIT_DEFAULT = default_duration(limits.AWAIT_DEFAULT_MS)
MACHINE_TIMEOUT_DEFAULT = default_duration(limits.MACHINE_TIMEOUT_DEFAULT_MS)
PLACEMENT_TIMEOUT_DEFAULT = default_duration(limits.PLACEMENT_TIMEOUT_DEFAULT_MS)
EXEC_TIMEOUT_DEFAULT = default_duration(limits.WATCH_EXEC_TIMEOUT_DEFAULT_MS)


def duration_ms(text: str, flag: str) -> int:
    try:
        return parse_duration_ms(text)
    except BadDuration as exc:
        raise UsageError(f"{flag}: {exc}") from None


def target(reference: str | None, to: str | None) -> tuple[str, str]:
    """(machine, run ID) from a reference and --to; both naming different machines is a usage error."""
    machine = ""
    run_id = ""
    try:
        if to is not None:
            check_machine_name(to)
        if reference is not None:
            machine, run_id = split_reference(reference)
    except BadName as exc:
        raise UsageError(str(exc)) from None
    if to and machine and to != machine:
        raise UsageError(f'--to {to} and the reference\'s machine "{machine}" disagree; pass one of them')
    return (machine or to or ""), run_id


def request(operation: str, **fields: Any) -> RemoteRequest:
    return RemoteRequest.of(operation, **fields)


def read_task(task: str | None, task_file: str | None, stdin: BinaryIO | None = None) -> str:
    """The task text, checked: exactly one source, at most 1 MiB, UTF-8, not blank (docs/cli.md#wb-agent-dispatch)."""
    if (task is None) == (task_file is None):
        raise UsageError("pass exactly one of --task TEXT and --task-file PATH")
    if task is not None:
        raw = task.encode("utf-8", "surrogateescape")
    else:
        assert task_file is not None
        try:
            if task_file == "-":
                raw = (stdin or sys.stdin.buffer).read(limits.TASK_MAX_BYTES + 1)
            else:
                with open(task_file, "rb") as handle:
                    raw = handle.read(limits.TASK_MAX_BYTES + 1)
        except OSError as exc:
            raise UsageError(f"--task-file {task_file}: cannot read it: {exc.strerror or exc}") from None
    if len(raw) > limits.TASK_MAX_BYTES:
        raise UsageError(f"the task is larger than {limits.TASK_MAX_BYTES} bytes ({limits.TASK_MAX_TEXT}); shorten it")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"the task is not valid UTF-8 (bad byte at offset {exc.start}); save it as UTF-8") from None
    if not text.strip():
        source = "stdin" if task_file == "-" else (task_file or "--task")
        raise UsageError(f"the task from {source} is blank; give the worker something to do")
    return text


def repository(repo: str | None) -> str:
    if repo:
        return repo
    from courier.runs.worktrees import origin_repository

    found = origin_repository(Path.cwd())
    if not found:
        raise UsageError("cannot tell which repository to use: pass --repo OWNER/REPO")
    return found


def timeout_ms(text: str) -> int:
    value = duration_ms(text, "--timeout")
    if value <= 0 or value > limits.TIMEOUT_MAX_MS:
        raise UsageError(f"--timeout must be more than 0 and at most {limits.TIMEOUT_MAX_TEXT}")
    return value


def budget_flags(max_tokens: int | None, max_cost_usd: float | None) -> dict[str, int | float]:
    """The request fields of --max-tokens and --max-cost-usd (docs/cli.md#budgets), checked."""
    fields: dict[str, int | float] = {}
    if max_tokens is not None:
        if not token_bound_ok(max_tokens):
            raise UsageError("--max-tokens must be a whole number of at least 1")
        fields["max_tokens"] = max_tokens
    if max_cost_usd is not None:
        if not cost_bound_ok(max_cost_usd):
            raise UsageError("--max-cost-usd must be a number of dollars above 0 (e.g. 0.50)")
        fields["max_cost_usd"] = float(max_cost_usd)
    return fields


_LABEL = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")  # a target label (docs/config.md#targets)


def is_auto(to: str | None) -> bool:
    """`--to auto` or `--to auto:LABEL`: a placement, not a machine name (config refuses a machine named auto)."""
    return to is not None and (to == AUTO or to.startswith(AUTO + ":"))


def label_of(to: str) -> str | None:
    """The LABEL of `auto:LABEL` (None for plain `auto`); a malformed one is a usage error."""
    if to == AUTO:
        return None
    label = to.removeprefix(AUTO + ":")
    if not _LABEL.fullmatch(label):
        raise UsageError(
            f'--to {to[:80]}: expected auto or auto:LABEL, a label of 1-32 lowercase letters, digits, "_" or "-"'
        )
    return label


@contextlib.contextmanager
def naming(remedy: str, *, always: bool = False) -> Iterator[None]:
    """A transport failure after the request may have been sent says how to retry (the reference is in `remedy`).

    `always`: also when nothing was sent, for a call that is always safe to repeat (await). A
    call lost mid-wait may surface as a refused reconnect (the courier reconnects once), which
    sent nothing, yet the user must learn how to resume the same.
    """
    try:
        yield
    except TransportError as exc:
        if always or exc.request_maybe_sent:
            exc.message += f"\n{remedy}"
        raise


def wait_bound_ms(text: str) -> int:
    bound = duration_ms(text, "--wait-timeout")
    if bound < 0:
        raise UsageError("--wait-timeout must not be negative (0 means no bound)")
    return bound


def machine_timeout_s(text: str) -> float:
    value = duration_ms(text, "--machine-timeout")
    if value <= 0:
        raise UsageError("--machine-timeout must be more than 0")
    return value / limits.MS_PER_SECOND


def check_list_scope(to: str | None, all_machines: bool) -> None:
    if to is not None and all_machines:
        raise UsageError("pass either --to MACHINE or --all, not both")
