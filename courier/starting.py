"""Sending a request that starts a run (dispatch, continue), shared by the CLI and the MCP server."""

from __future__ import annotations

from courier.capabilities import BUDGET
from courier.commands import is_auto, request
from courier.config import Config
from courier.errors import UsageError, WbError
from courier.route import ask, upgrade_message
from protocol.models import RemoteRequest, Result
from protocol.refs import format_reference


def send_starting(config: Config, machine: str, starting: RemoteRequest, run_id: str) -> Result:
    """Send a request that starts a run; a transport failure after sending names the intended reference."""
    require_budget_support(config, machine, starting)
    try:
        return ask(config, machine, starting).result_of()
    except WbError as exc:
        # Before authentication nothing was sent; after it, the run may exist.
        if machine and exc.request_maybe_sent:
            exc.message += (
                f"\nthe run may have started; ask for it with: wb agent status {format_reference(machine, run_id)}"
            )
        raise


def require_budget_support(config: Config, machine: str, starting: RemoteRequest) -> None:
    """A budget flag goes only to a peer that lists `budget` (an older one would ignore it): else exit 2."""
    if not machine or not (starting.max_tokens or starting.max_cost_usd):
        return
    version = ask(config, machine, request("version"))
    if BUDGET not in (version.capabilities or []):
        raise UsageError(upgrade_message(machine, version.wb_version, "--max-tokens and --max-cost-usd"))


def send_dispatch(
    config: Config,
    to: str | None,
    machine: str,
    starting: RemoteRequest,
    machine_timeout_s: float,
    wait_for_slot_ms: int = 0,
) -> Result:
    """Start a dispatch: on `machine`, or where `--to auto[:LABEL]` places it (docs/cli.md#placement-across-a-fleet),
    waiting up to `wait_for_slot_ms` for a free slot."""
    if is_auto(to):
        from courier.placement import dispatch_auto

        assert to is not None
        return dispatch_auto(config, to, starting, machine_timeout_s, wait_for_slot_ms)
    return send_starting(config, machine, starting, starting.agent_id)
