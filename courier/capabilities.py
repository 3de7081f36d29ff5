"""The optional features this machine's receiver supports: the `version` reply's `capabilities` (contract Part two).

One list, built here. An operation of Part two lists itself through its table entry's
`capability` (protocol/operations.py); any other feature (`follow`, `serve`, …) is one line
below. A caller uses an optional feature of a peer only when the peer lists it.
"""

from __future__ import annotations

SERVE = "serve"  # `wb --wb-internal-agent-serve`: JSON lines, concurrent requests (contract §16)
BUDGET = "budget"  # dispatch/continue honour max_tokens and max_cost_usd (contract §20.1)
USAGE_WAIT = "usage-wait"  # profiles' on_usage_limit is honoured (contract §20.2)


def capabilities() -> list[str]:
    """This machine's capabilities: optional operations, then `harness:<name>` for each harness it can run."""
    from courier.runs.harness import runnable_harnesses
    from protocol.operations import TABLE

    found = [SERVE]
    found += [entry.capability for entry in TABLE.values() if entry.capability]
    found.append("follow")  # logs --follow (contract §15.2): a mode of `logs`, not an operation
    found += [BUDGET, USAGE_WAIT]
    found += [f"harness:{name}" for name in runnable_harnesses()]
    return found


def harnesses_of(capabilities: list[str] | None) -> list[str]:
    """The harness names a peer's capabilities list (none when it sent no list)."""
    return [item.removeprefix("harness:") for item in capabilities or [] if item.startswith("harness:")]
