"""The bodies of `wb agent dispatch`, `continue --wait|--follow` and `await`, without typer: the typer commands
(courier/cli.py) and the typer-free hot path (courier/hot.py) both run them, so a cold dispatch need not
pay for typer's import and its command's build (docs/benchmarks.md#dispatch-latency)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from courier import cli_io
from courier.client.asking import command_started_at
from courier.client.client import Client
from courier.commands import AWAIT_DEFAULT, duration_ms, machine_timeout_s, naming, wait_bound_ms
from courier.config import load_config
from courier.errors import Interrupted, UsageError
from courier.ops.await_ import await_remedy, await_text, still_running
from courier.ops.dispatch import build_dispatch, dispatch_line
from courier.render import to_json
from protocol.refs import format_reference

if TYPE_CHECKING:
    from protocol.models import Result


def dispatch_command(
    *,
    new_worktree: str | None,
    use_worktree: str | None,
    profile: str | None,
    task: str | None,
    task_file: str | None,
    repo: str | None,
    branch: str | None,
    base: str | None,
    to: str | None,
    timeout: str,
    max_tokens: int | None,
    max_cost_usd: float | None,
    machine_timeout: str,
    wait_for_slot: str | None,
    wait: bool,
    follow: bool,
    wait_timeout: str | None,
    as_json: bool,
) -> None:
    """`wb agent dispatch` (docs/cli.md#wb-agent-dispatch): its refusals before anything starts, then the run."""
    bound_ms = then_wait_bound(wait, follow, wait_timeout, as_json)
    slot_ms = slot_wait_ms(wait_for_slot, to)
    machine, request = build_dispatch(
        new_worktree=new_worktree,
        use_worktree=use_worktree,
        profile=profile,
        task=task,
        task_file=task_file,
        repo=repo,
        branch=branch,
        base=base,
        to=to,
        timeout=timeout,
        max_tokens=max_tokens,
        max_cost_usd=max_cost_usd,
    )
    bound_s = machine_timeout_s(machine_timeout)
    result = Client(load_config()).dispatch(to, machine, request, bound_s, slot_ms)
    started(result, bound_ms, follow, as_json)


def awaited(machine: str, run_id: str, bound_ms: int, as_json: bool, follow: bool = False) -> None:
    """Wait for the run (following its actions with `follow`), print its facts, exit as `await` does."""
    ref = format_reference(machine, run_id)
    client = Client(load_config())
    try:
        with naming(await_remedy(ref), always=True):
            if follow:
                result = client.follow(machine, run_id, cli_io.out, cli_io.warn, bound_ms=bound_ms)
            elif not as_json and sys.stderr.isatty():
                from courier.live_line import await_with_line

                result = await_with_line(client, machine, run_id, bound_ms, sys.stderr, cli_io.warn)
            else:
                result = client.await_(machine, run_id, bound_ms, started_at=command_started_at())
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted; the run continues; resume with wb agent await {ref}") from None
    cli_io.out(to_json(result.to_wire()) if as_json else await_text(result))
    if not result.terminal:
        raise still_running(format_reference(machine, result.agent_id))  # the whole ID, not a prefix given


def then_wait_bound(wait: bool, follow: bool, wait_timeout: str | None, as_json: bool) -> int | None:
    """The wait `--wait` or `--follow` asks of dispatch or continue (ms, 0: none), checked before anything
    starts; None without them."""
    if wait and follow:
        raise UsageError("--wait and --follow: give one (--follow waits too)")
    if follow and as_json:
        raise UsageError("--follow prints worker actions as text; with --json use --wait")
    if not (wait or follow):
        if wait_timeout is not None:
            raise UsageError("--wait-timeout bounds --wait or --follow; give one of them")
        return None
    return wait_bound_ms(wait_timeout or AWAIT_DEFAULT)


def slot_wait_ms(wait_for_slot: str | None, to: str | None) -> int:
    if wait_for_slot is None:
        return 0
    from courier.commands import is_auto

    if not is_auto(to):
        raise UsageError("--wait-for-slot waits for a free slot of --to auto[:LABEL]; give --to auto")
    wait_ms = duration_ms(wait_for_slot, "--wait-for-slot")
    if wait_ms <= 0:
        raise UsageError("--wait-for-slot must be more than 0 (e.g. --wait-for-slot 30m)")
    return wait_ms


def started(result: Result, bound_ms: int | None, follow: bool, as_json: bool) -> None:
    """A started run's reference (JSON: its document), then, with --wait or --follow, what `await` prints."""
    if bound_ms is None or not as_json:
        cli_io.out(to_json(result.to_wire()) if as_json else dispatch_line(result))
    if bound_ms is not None:
        awaited(result.machine or "", result.agent_id, bound_ms, as_json, follow)
