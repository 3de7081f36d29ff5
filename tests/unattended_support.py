"""What the unattended-run tests share (docs/cli.md#budgets, docs/cli.md#waiting-out-a-usage-limit): the CLIs, their
scripted servers, the profiles."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from conftest import CREDENTIAL_ENV, Machine

from courier.demo.anthropic_server import AnthropicServer
from courier.demo.gemini_server import GeminiServer
from courier.demo.model_server import ModelServer
from courier.demo.scripted_http import ScriptedServer


@dataclass(frozen=True)
class Cli:
    name: str
    version: str
    server: type[ScriptedServer[Any]]
    wire_api: str
    model: str
    install: str


CLIS = {
    "codex": Cli("codex", "0.169.0", ModelServer, "responses", "gpt-5.5", "bash scripts/install-codex.sh"),
    "claude": Cli(
        "claude", "2.1.328", AnthropicServer, "anthropic", "claude-sonnet-4-5", "bash scripts/install-claude.sh"
    ),
    "gemini": Cli("gemini", "0.61.0", GeminiServer, "gemini", "gemini-2.5-pro", "bash scripts/install-gemini.sh"),
}


@pytest.fixture(params=sorted(CLIS))
def cli(request: pytest.FixtureRequest) -> Cli:
    return CLIS[request.param]


@pytest.fixture
def server(cli: Cli) -> Iterator[ScriptedServer[Any]]:
    with cli.server() as running:
        yield running


def unattended_config(cli: Cli, server: ScriptedServer[Any]) -> str:
    providers = ""
    for scenario in ("endless", "write-file", "endless-unmetered"):
        providers += (
            f"    {scenario}:\n      base_url: {server.base_url_for(scenario)}\n"
            f"      credential_env: {CREDENTIAL_ENV}\n      wire_api: {cli.wire_api}\n"
            # The CLI's own retries of a 429 are not what this test is about: one try, then wb waits.
            "      request_max_retries: 0\n"
        )
    profiles = (
        f"    budgeted:\n      harness: {cli.name}\n      provider: endless\n      model: {cli.model}\n"
        "      budget: {tokens: 1000}\n"
        f"    patient:\n      harness: {cli.name}\n      provider: write-file\n      model: {cli.model}\n"
        "      on_usage_limit: {resume: true, max_waits: 3, max_wait: 1m}\n"
    )
    return "agents:\n  providers:\n" + providers + "  profiles:\n" + profiles




def run(machine: Machine, profile: str, *extra: str) -> dict[str, Any]:
    """Dispatch the profile's scripted task, await it, and return its Result."""
    done = machine.wb("agent", "dispatch", "--new-worktree", "w1", "--profile", profile,
                      "--repo", "acme/widget", "--task", "Do the scripted task.", *extra)  # fmt: skip
    assert done.returncode == 0, done.stderr
    waited = machine.wb("agent", "await", done.stdout.split()[0], "--wait-timeout", "150s", "--json", timeout=180)
    assert waited.returncode == 0, waited.stderr
    result: dict[str, Any] = json.loads(waited.stdout)
    return result


def model_requests(server: ScriptedServer[Any]) -> int:
    """The scripted responses the server answered (tool-offering steps; not Claude Code's side requests)."""
    return sum(1 for served in server.served if getattr(served, "step", None) is not None)
