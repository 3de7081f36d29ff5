"""Sending a request that starts a run (dispatch, continue), shared by the CLI and the MCP server."""

from __future__ import annotations

from courier.config import Config
from courier.errors import WbError
from courier.route import ask
from protocol.models import RemoteRequest, Result
from protocol.refs import format_reference


def send_starting(config: Config, machine: str, starting: RemoteRequest, run_id: str) -> Result:
    """Send a request that starts a run; a transport failure after sending names the intended reference."""
    try:
        return ask(config, machine, starting).result_of()
    except WbError as exc:
        # Before authentication nothing was sent; after it, the run may exist.
        if machine and exc.request_maybe_sent:
            exc.message += (
                f"\nthe run may have started; ask for it with: wb agent status {format_reference(machine, run_id)}"
            )
        raise
