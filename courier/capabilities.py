"""The optional features this machine's receiver supports: the `version` reply's `capabilities` (contract Part two).

One list, built here; a feature is added by one line (`diff`, `follow`, `continue`, …). A caller uses an
optional feature of a peer only when the peer lists it.
"""

from __future__ import annotations


def capabilities() -> list[str]:
    """This machine's capabilities: `harness:<name>` for each harness it can run (its executable is on PATH)."""
    from courier.runs.harness import runnable_harnesses

    found: list[str] = []
    found += [f"harness:{name}" for name in runnable_harnesses()]
    return found


def harnesses_of(capabilities: list[str] | None) -> list[str]:
    """The harness names a peer's capabilities list (none when it sent no list)."""
    return [item.removeprefix("harness:") for item in capabilities or [] if item.startswith("harness:")]
