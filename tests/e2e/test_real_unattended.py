"""Unattended runs end to end with the real CLIs (docs/cli.md#budgets, docs/cli.md#waiting-out-a-usage-limit;
docs/harnesses.md).

Codex 0.169.0, Claude Code 2.1.328 and Gemini CLI 0.61.0, each against its in-suite scripted
server: a token budget stops the run after the response that crosses it, with no later request
answered; a usage limit (HTTP 429, `retry-after: 3`) is waited out and the same session resumed;
the worker holds the run's placeholder, never the credential, and its relay answers a request
without the placeholder with 403 (docs/cli.md#budgets).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import urllib.error
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from conftest import CREDENTIAL_VALUE, FAKES, Machine, require_cli, wait_for

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
    # A CLI may send its first request again before the limit (Claude Code does on a loaded machine):
    # what counts is that nothing after the first later step starts over at step 0.
    later = next((i for i, step in enumerate(steps) if step != 0), len(steps))
    assert steps[0] == 0 and later < len(steps) and 0 not in steps[later:], steps


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode("utf-8", "replace").split("\0") if "=" in item)


def test_the_real_cli_holds_the_placeholder_and_its_relay_refuses_anyone_else(
    real: Machine, cli: Cli, server: ScriptedServer[Any]
) -> None:
    done = real.wb("agent", "dispatch", "--new-worktree", "w1", "--profile", "budgeted", "--max-tokens", "100000000",
                   "--repo", "acme/widget", "--task", "Do the scripted task.")  # fmt: skip
    assert done.returncode == 0, done.stderr
    ref = done.stdout.split()[0]

    def status() -> dict[str, Any]:
        value: dict[str, Any] = json.loads(real.wb("agent", "status", ref, "--json").stdout)
        return value

    assert wait_for(lambda: model_requests(server) >= 2, timeout=120), server.served  # it works through the relay
    seen = status()
    assert seen["state"] == "running" and seen.get("worker_pid"), seen
    env = _environ(seen["worker_pid"])
    key = {"codex": "TEST_PROVIDER_KEY", "claude": "ANTHROPIC_API_KEY", "gemini": "GEMINI_API_KEY"}[cli.name]
    assert re.fullmatch(r"wb-run-[0-9a-f]{32}", env[key]), env.get(key)
    assert not any(CREDENTIAL_VALUE in value for value in env.values())
    if cli.name == "codex":
        argv = Path(f"/proc/{seen['worker_pid']}/cmdline").read_bytes().decode()  # its -c overrides
        relay = re.search(r'base_url="(http://127\.0\.0\.1:\d+[^"]*)"', argv)
        assert relay is not None, argv
        url = relay.group(1).rstrip("/") + "/responses"
    else:
        base = env["ANTHROPIC_BASE_URL" if cli.name == "claude" else "GOOGLE_GEMINI_BASE_URL"].rstrip("/")
        url = base + ("/v1/messages" if cli.name == "claude" else f"/v1beta/models/{cli.model}:streamGenerateContent")
    for credential in (CREDENTIAL_VALUE, "wb-run-" + "0" * 32):
        headers = {"content-type": "application/json", "x-foreign": "1", "authorization": f"Bearer {credential}",
                   "x-api-key": credential, "x-goog-api-key": credential}  # fmt: skip
        request = urllib.request.Request(url, data=b"{}", headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                code = answer.status
        except urllib.error.HTTPError as exc:
            code = exc.code
        assert code == 403
    assert not any("x-foreign" in {name.lower() for name in r.headers} for r in server.requests)  # none forwarded
    forwarded = [r for r in server.requests if r.method == "POST"]
    assert forwarded and all(CREDENTIAL_VALUE in json.dumps(dict(r.headers)) + r.path for r in forwarded)
    assert real.wb("agent", "stop", ref).returncode == 0
    assert wait_for(lambda: status()["terminal"], timeout=30)
