"""The one client every front uses (the CLI, its typer-free hot path, the MCP tools, `wb ui`): a method per
operation, bound to one loaded configuration (docs/architecture.md#the-client).

A front parses its own input (flags, tool arguments, a form) with the operation modules' request
builders (courier/ops/), asks here, and renders what comes back; it never reaches a transport
itself. What is the same for every front lives here once: the in-band failure raised as its
error class (courier/client/asking.py), each machine's capabilities learned at most once per
client (a budgeted dispatch placed by `--to auto` asks no `version` again), the one await loop,
and what a failed start says about the run it may have started.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from courier.capabilities import BUDGET
from courier.client import peers
from courier.client.asking import ask, await_result, upgrade_message
from courier.client.peers import Peer
from courier.config import Config
from courier.errors import UsageError, WbError
from courier.stage_trace import mark
from protocol.models import DiffResult, RemoteRequest, RemoteResponse, Result, StopResult
from protocol.refs import format_reference

if TYPE_CHECKING:
    from courier.client.fleet import FleetAnswer, ProbeRow
    from courier.ops.prune import PruneOutcome

BUDGET_FLAGS = "--max-tokens and --max-cost-usd"


class Client:
    """Every operation of every configured machine ("" is this machine), as one object."""

    def __init__(self, config: Config) -> None:
        self.config = config
        # machine -> what it supports: asked by this client, or its last answer kept (courier/client/peers.py).
        self._peers: dict[str, Peer] = {}
        self._asked: set[str] = set()  # the machines whose answer this client has seen itself

    # -- one request --------------------------------------------------------------------------

    def ask(self, machine: str, request: RemoteRequest, *, timeout_s: float | None = None) -> RemoteResponse:
        """The reply to one request; an in-band failure is raised as its error class."""
        response = ask(self.config, machine, request, timeout_s=timeout_s)
        if request.operation == "version":
            self.remember(machine, response)
        return response

    async def ask_async(
        self, machine: str, request: RemoteRequest, *, timeout_s: float | None = None
    ) -> RemoteResponse:
        """One request on the caller's event loop: cancelling it ends the channel's child there and the receiver
        on the far machine (`wb ui`'s live stream, docs/ui.md)."""
        from courier.client.asking import raise_failure
        from courier.client.transport import transport_for

        response = await transport_for(self.config, machine).ask_async(request, timeout_s=timeout_s)
        raise_failure(machine, response, request.operation)
        return response

    def status(self, machine: str, run_id: str, *, timeout_s: float | None = None) -> Result:
        return self.ask(machine, RemoteRequest.of("status", agent_id=run_id), timeout_s=timeout_s).result_of()

    def list_(self, machine: str, *, timeout_s: float | None = None) -> RemoteResponse:
        """One machine's runs (`results_of()`) and the records it could not read (`warnings`)."""
        return self.ask(machine, RemoteRequest.of("list"), timeout_s=timeout_s)

    def logs(self, machine: str, request: RemoteRequest, *, timeout_s: float | None = None) -> RemoteResponse:
        return self.ask(machine, request, timeout_s=timeout_s)

    def stop(self, machine: str, run_id: str, *, timeout_s: float | None = None) -> RemoteResponse:
        """The stop reply: `stop_result_of()`, and the worker's processes that outlived SIGKILL (`warnings`)."""
        return self.ask(machine, RemoteRequest.of("stop", agent_id=run_id), timeout_s=timeout_s)

    def diff(self, machine: str, run_id: str, *, stat: bool = False, timeout_s: float | None = None) -> DiffResult:
        from courier.ops.diff import diff_of

        return diff_of(self.ask(machine, RemoteRequest.of("diff", agent_id=run_id, stat=stat), timeout_s=timeout_s))

    def version(self, machine: str, *, timeout_s: float | None = None) -> RemoteResponse:
        return self.ask(machine, RemoteRequest.of("version"), timeout_s=timeout_s)

    # -- capabilities ---------------------------------------------------------------------------

    def remember(self, machine: str, version: RemoteResponse) -> None:
        """Keep what a `version` reply says the machine supports (asked by this client or a probe of it)."""
        if version.failure or not machine:
            return
        peer = Peer(version.wb_version, tuple(version.capabilities or ()))
        self._peers[machine] = peer
        self._asked.add(machine)
        peers.save(self.config.home, machine, peers.target_key(self.config.target(machine)), peer)

    def capabilities(self, machine: str, *, timeout_s: float | None = None) -> Peer:
        """What `machine` supports: this client's answer, else its last answer kept, else asked now."""
        if machine not in self._peers:
            kept = peers.load(self.config.home, machine, peers.target_key(self.config.target(machine)))
            if kept is not None:
                self._peers[machine] = kept
            else:
                self.version(machine, timeout_s=timeout_s)
        return self._peers.get(machine, Peer(None, ()))

    def require(self, machine: str, capability: str, feature: str) -> None:
        """Exit 2 naming the upgrade when `machine` does not list `capability` (docs/protocol.md#optional-features)."""
        peer = self.capabilities(machine)
        if capability not in peer.capabilities:
            raise UsageError(upgrade_message(machine, peer.wb_version, feature))

    # -- waiting ----------------------------------------------------------------------------------

    def await_(
        self,
        machine: str,
        run_id: str,
        wait_timeout_ms: int,
        *,
        started_at: float | None = None,
    ) -> Result:
        """The run once terminal, or as last observed when the bound passes (the one await loop,
        courier/client/asking.py `AwaitLoop`); the bound counts from `started_at`."""
        return await_result(self.config, machine, run_id, wait_timeout_ms, started_at=started_at)

    # -- starting runs ------------------------------------------------------------------------------

    def start(self, machine: str, starting: RemoteRequest, run_id: str) -> Result:
        """Send a request that starts a run (dispatch, continue); a failure after sending names the run."""
        mark("client.start")  # the CLI has parsed and built the request (docs/benchmarks.md#dispatch-latency)
        budgeted = bool(machine and (starting.max_tokens or starting.max_cost_usd))
        if budgeted:
            # A budget goes only to a peer that honours it (an older one would ignore the fields).
            self.require(machine, BUDGET, BUDGET_FLAGS)
        try:
            response = self.ask(machine, starting)
        except WbError as exc:
            # Before authentication nothing was sent; after it, the run may exist.
            if machine and exc.request_maybe_sent:
                exc.message += (
                    f"\nthe run may have started; ask for it with: wb agent status {format_reference(machine, run_id)}"
                )
            raise
        result = response.result_of()
        if budgeted and machine not in self._asked and response.wb_version != self._peers[machine].wb_version:
            self._recheck_budget(machine, result)
        return result

    def _recheck_budget(self, machine: str, result: Result) -> None:
        """The peer's wb changed since its answer was kept: ask again; one that no longer honours budgets
        must not run unbounded, so the run just started is stopped and the upgrade named (exit 2)."""
        self.version(machine)
        peer = self._peers[machine]
        if BUDGET in peer.capabilities:
            return
        ref = format_reference(machine, result.agent_id)
        try:
            self.stop(machine, result.agent_id)
            done = f"it was stopped: {ref}"
        except WbError as exc:
            done = f"stopping it failed ({exc.message}); stop it with: wb agent stop {ref}"
        upgrade = upgrade_message(machine, peer.wb_version, BUDGET_FLAGS)
        raise UsageError(f"{upgrade}; the run started without a budget and {done}")

    def dispatch(
        self, to: str | None, machine: str, starting: RemoteRequest, machine_timeout_s: float, wait_for_slot_ms: int = 0
    ) -> Result:
        """Start a dispatch: on `machine`, or where `--to auto[:LABEL]` places it
        (docs/cli.md#placement-across-a-fleet), waiting up to `wait_for_slot_ms` for a free slot."""
        from courier.commands import is_auto

        if is_auto(to):
            from courier.client.placement import dispatch_auto

            assert to is not None
            return dispatch_auto(self, to, starting, machine_timeout_s, wait_for_slot_ms)
        return self.start(machine, starting, starting.agent_id)

    # -- across machines ----------------------------------------------------------------------------

    def fleet(self, machine_timeout_s: float, *, stalled_only: bool = False) -> FleetAnswer:
        """`list --all`: this machine and every configured one, each bounded by the deadline."""
        from courier.client.fleet import gather_all

        return gather_all(self.config, machine_timeout_s, stalled_only=stalled_only)

    def fleet_document(self, machine_timeout_s: float, *, stalled_only: bool = False) -> dict[str, Any]:
        """`list --all --json`'s document."""
        return self.fleet(machine_timeout_s, stalled_only=stalled_only).document().to_json()

    def list_all(self, machine_timeout_s: float, *, as_json: bool, stalled_only: bool = False) -> None:
        """`wb agent list --all`: printed, failures on stderr (courier/client/fleet.py)."""
        from courier.client.fleet import list_all

        list_all(self.config, machine_timeout_s, as_json=as_json, stalled_only=stalled_only)

    def probe_machines(self, *, check: bool, machine_timeout_s: float) -> list[ProbeRow]:
        """Every configured machine's row; with `check`, each asked `version`."""
        from courier.client.fleet import probe_machines

        rows = probe_machines(self.config, check=check, machine_timeout_s=machine_timeout_s)
        return rows

    def show_machines(self, *, check: bool, as_json: bool, machine_timeout_s: float) -> None:
        """`wb machines [--check]`: printed."""
        from courier.client.fleet import show_machines

        show_machines(self.config, check=check, as_json=as_json, machine_timeout_s=machine_timeout_s)

    def follow(
        self, machine: str, run_id: str, write: Callable[[str], None], warn: Callable[[str], None], **options: Any
    ) -> Result:
        """`logs --follow` (and `--follow` of dispatch and continue): the actions as they happen, then the run
        (courier/client/following.py)."""
        from courier.client.following import follow

        return follow(self.config, machine, run_id, write, warn, **options)

    def prune(
        self, machines: list[str], older_than_ms: int, dry_run: bool, timeout_s: float, worktrees: bool
    ) -> list[PruneOutcome]:
        """`prune` on each machine ("" is this one), each machine's failure its own outcome."""
        from courier.client.following import prune_machines

        return prune_machines(self.config, machines, older_than_ms, dry_run, timeout_s, worktrees)

    def watch(self, machines: list[str], **options: Any) -> None:
        """`wb agent watch` until interrupted (or idle with `until_idle`): courier/client/watching.py."""
        from courier.client.watching import watch

        watch(self.config, machines, **options)

    def watch_once(self, machines: list[str], cursor: str | None, bound_s: float) -> dict[str, Any]:
        """One watch call's document: the transitions after `cursor` (docs/mcp.md, watch)."""
        from courier.client.watching import watch_once

        return watch_once(self.config, machines, cursor, bound_s, lambda _: None).to_json()

    def stopped(self, machine: str, run_id: str, *, timeout_s: float | None = None) -> tuple[StopResult, list[str]]:
        """The stop's result and its warnings as `wb agent stop` prints them (`<ref>: <warning>`)."""
        response = self.stop(machine, run_id, timeout_s=timeout_s)
        ref = format_reference(machine, run_id)
        return response.stop_result_of(), [f"{ref}: {warning.error}" for warning in response.warnings or []]
