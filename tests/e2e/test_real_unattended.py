"""Unattended runs end to end with the real CLIs (docs/cli.md#budgets, docs/cli.md#waiting-out-a-usage-limit;
docs/harnesses.md).

Codex 0.169.0, Claude Code 2.1.328 and Gemini CLI 0.61.0, each against its in-suite scripted
server: a token budget stops the run after the response that crosses it, with no later request
answered; a usage limit (HTTP 429, `retry-after: 3`) is waited out and the same session resumed.
"""

from __future__ import annotations

import os
import shutil
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from conftest import FAKES, Machine, require_cli

from courier.demo.scripted_http import ScriptedServer
from tests.unattended_support import Cli, cli, model_requests, run, server, unattended_config

__all__ = ["cli", "server"]  # fixtures

pytestmark = pytest.mark.e2e


@pytest.fixture
def real(machine: Machine, cli: Cli, server: ScriptedServer[Any]) -> Machine:
    dirs = require_cli(cli.name, cli.version, install=f"run `{cli.install}`").dirs
    kept = [d for d in machine.env["PATH"].split(os.pathsep) if d and Path(d).resolve() != FAKES.resolve()]
    machine.env["PATH"] = os.pathsep.join([*dirs, *(d for d in kept if d not in dirs)])
    found = shutil.which(cli.name, path=machine.env["PATH"])
    assert found is not None and Path(found).parent != FAKES
    machine.write_config(unattended_config(cli, server))
    machine.clone()
    return machine


def test_a_token_budget_stops_the_real_cli_after_the_response_that_crosses_it(
    real: Machine, cli: Cli, server: ScriptedServer[Any]
) -> None:
    result = run(real, "budgeted")

    assert result["state"] == "failed", result
    # 400 tokens a response: 400, 800, then 1,200 crosses 1,000.
    assert model_requests(server) == 3, server.served
    assert result["budget"] == {"tokens": 1000}
    usage = result["usage"]
    assert usage["input_tokens"] + usage["output_tokens"] >= 1200
    assert result["failure"].startswith("budget exceeded: 1,2") and result["failure"].endswith(" tokens of 1,000")
    status = real.wb("agent", "status", result["agent_id"])
    assert status.returncode == 0 and "budget:   " in status.stdout and " of 1,000 tokens" in status.stdout


def test_a_usage_limit_is_waited_out_and_the_same_session_resumes(
    real: Machine, cli: Cli, server: ScriptedServer[Any]
) -> None:
    server.limit_at(1, 1, "3")  # the second model request (after a tool call) meets a usage limit

    result = run(real, "patient")

    assert result["state"] == "completed", result
    assert server.limited == 1
    [wait] = result["waits"]
    assert wait["reason"] == "usage limit (write-file)"
    waited_s = (datetime.fromisoformat(wait["until"]) - datetime.fromisoformat(wait["started_at"])).total_seconds()
    assert 2.5 <= waited_s <= 4  # the provider's retry-after: 3
    # The same session went on after the wait: the resumed requests carried the first step's tool
    # result (no fresh start at step 0), then the script finished. (Gemini CLI's resumed history
    # holds one more tool result than Codex's and Claude Code's, so the script skips a step there.)
    steps = [served.step for served in server.served if getattr(served, "step", None) is not None]
    assert steps[0] == 0 and len(steps) >= 2 and 0 not in steps[1:], steps
