"""The harness registry (docs/harnesses.md): a profile's `harness` name → what it speaks and where it lives.

The facts dispatch and `version` need (fitting wire_api values, the executable, whether it can
resume) are here; the module itself is imported only by the owner (and `logs`, for worker
actions), never by the receiver answering `status` or `list`. Adding a harness = one module
implementing `base.Harness` plus one entry here.
"""

from __future__ import annotations

import importlib
import shutil
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from courier.runs.harness.interface import Harness
    from protocol.models import ProviderApi


@dataclass(frozen=True)
class HarnessSpec:
    name: str
    display: str  # how messages name it ("Codex")
    target: str  # "module:class"
    executable: str | None  # None: the profile names its own command
    wire_apis: tuple[ProviderApi, ...]  # the provider wire_api values it speaks; () = no provider
    can_resume: bool
    # Its stream reports each model response's cost in dollars, so a cost budget binds it without a price
    # (docs/cli.md#budgets). Claude Code reports a cost only in its `result`, at the end of a turn: too late.
    reports_cost: bool = False


REGISTRY: dict[str, HarnessSpec] = {
    spec.name: spec
    for spec in (
        HarnessSpec("codex", "Codex", "courier.runs.harness.codex:Codex", "codex", ("responses",), True),
        HarnessSpec("claude", "Claude Code", "courier.runs.harness.claude:Claude", "claude", ("anthropic",), True),
        HarnessSpec("gemini", "Gemini CLI", "courier.runs.harness.gemini:Gemini", "gemini", ("gemini",), True),
        HarnessSpec("command", "command", "courier.runs.harness.command:Command", None, (), False),
    )
}

HARNESS_NAMES = tuple(REGISTRY)


class UnknownHarness(ValueError):
    """A harness name no module implements."""


def spec_for(name: str) -> HarnessSpec:
    try:
        return REGISTRY[name]
    except KeyError:
        raise UnknownHarness(f'unsupported harness "{name}" (supported: {", ".join(HARNESS_NAMES)})') from None


def harness_for(name: str) -> Harness:
    module_name, class_name = spec_for(name).target.split(":")
    harness: Harness = getattr(importlib.import_module(module_name), class_name)()
    return harness


def runnable_harnesses() -> list[str]:
    """The harnesses this machine can run: their executable is on PATH (or they bring their own)."""
    return [spec.name for spec in REGISTRY.values() if spec.executable is None or shutil.which(spec.executable)]
