"""The optional features this machine's receiver supports: the `version` reply's `capabilities`
(docs/protocol.md#optional-features).

One list, built here. An operation of Part two lists itself through its table entry's
`capability` (protocol/operations.py); any other feature (`follow`, `serve`, …) is one line
below. A caller uses an optional feature of a peer only when the peer lists it.
"""

from __future__ import annotations

SERVE = "serve"  # `wb --wb-internal-agent-serve`: JSON lines, concurrent requests (docs/courier.md)
# `prune` with `worktrees` (docs/cli.md, wb agent prune): an older peer would ignore the field and keep them.
PRUNE_WORKTREES = "prune-worktrees"
BUDGET = "budget"  # dispatch/continue honour max_tokens and max_cost_usd (docs/protocol.md#optional-features)
USAGE_WAIT = "usage-wait"  # profiles' on_usage_limit is honoured (docs/protocol.md#optional-features)
# dispatch honours max_running; version answers `placement: true` (docs/cli.md#placement-across-a-fleet)
PLACEMENT = "placement"
# A Ray head (docs/ray.md#cost): its dispatch and continue start no CLI on it (a node's holder
# does), so they may travel over its warm serve session, which keeps its Ray connection.
DISPATCH_IN_SERVE = "dispatch-in-serve"
# Its serve session hands a dispatch or continue to a new login once the machine's login files changed
# (courier/stamp.py), so a caller may send them over it (`courier.dispatch_over_serve`, docs/courier.md).
LOGIN_WATCH = "login-watch"


def capabilities() -> list[str]:
    """This machine's capabilities: optional operations, then `harness:<name>` for each harness it can run."""
    from courier.runs.harness import runnable_harnesses
    from protocol.operations import TABLE

    found = [SERVE]
    found += [entry.capability for entry in TABLE.values() if entry.capability]
    found.append("follow")  # logs --follow (docs/cli.md, wb agent logs): a mode of `logs`, not an operation
    found.append(PRUNE_WORKTREES)
    found += [BUDGET, USAGE_WAIT, PLACEMENT, LOGIN_WATCH]
    found += [f"harness:{name}" for name in runnable_harnesses()]
    return found


def harnesses_of(capabilities: list[str] | None) -> list[str]:
    """The harness names a peer's capabilities list (none when it sent no list)."""
    return [item.removeprefix("harness:") for item in capabilities or [] if item.startswith("harness:")]
