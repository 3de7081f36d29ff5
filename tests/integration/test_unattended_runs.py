"""Budgets and usage-limit waits through wb, with the bundled stand-ins of the three CLIs (docs/cli.md#budgets,
docs/cli.md#waiting-out-a-usage-limit).

The stand-ins (courier/demo/standin_*.py) hold real HTTP conversations with the scripted servers,
as the real CLIs do, so the owner's metering relay sits in the same place; tests/e2e has the same
cases with the real CLIs. Refusals at dispatch use the fakes (nothing starts).
"""

from __future__ import annotations

import json
import shlex
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from conftest import Machine, wait_for

import courier
from courier.demo.scripted_http import ScriptedServer
from tests.unattended_support import Cli, cli, model_requests, run, server, unattended_config

__all__ = ["cli", "server"]  # fixtures

EXTRA_PROFILES = """\
    stingy:
      harness: {harness}
      provider: write-file
      model: {model}
      on_usage_limit: {{resume: true, max_waits: 1, max_wait: 1m}}
    quiet:
      harness: {harness}
      provider: write-file
      model: {model}
      stall_after: 1s
      on_usage_limit: {{resume: true, max_wait: 1m}}
    hasty:
      harness: {harness}
      provider: write-file
      model: {model}
      on_usage_limit: {{resume: true, max_wait: 2s}}
    unbounded:
      harness: {harness}
      provider: endless
      model: {model}
    priced:
      harness: {harness}
      provider: endless
      model: {model}
      budget: {{cost_usd: 0.5}}
    scripted:
      harness: command
      command: [/bin/true]
      budget: {{tokens: 10}}
    scripted-waits:
      harness: command
      command: [/bin/true]
      on_usage_limit: {{resume: true}}
"""


@pytest.fixture
def standin(machine: Machine, cli: Cli, server: ScriptedServer[Any], tmp_path: Path) -> Machine:
    """The `machine` fixture with the stand-in under the CLI's name first on PATH and the unattended profiles."""
    bin_dir = tmp_path / "standin-bin"
    bin_dir.mkdir()
    wrapper = bin_dir / cli.name
    package_parent = str(Path(courier.__file__).resolve().parents[1])
    wrapper.write_text(
        f"#!/bin/sh\nPYTHONPATH={shlex.quote(package_parent)}; export PYTHONPATH\n"
        f'exec {shlex.quote(sys.executable)} -m courier.demo.standin_{cli.name} "$@"\n'
    )
    wrapper.chmod(0o755)
    machine.env["PATH"] = f"{bin_dir}:{machine.env['PATH']}"
    machine.write_config(
        unattended_config(cli, server) + EXTRA_PROFILES.format(harness=cli.name, model=cli.model)
    )
    machine.clone()
    return machine


def _dispatch(machine: Machine, profile: str, *extra: str) -> str:
    done = machine.wb("agent", "dispatch", "--new-worktree", "w1", "--profile", profile,
                      "--repo", "acme/widget", "--task", "Do the scripted task.", *extra)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.split()[0]


def _status(machine: Machine, ref: str) -> dict[str, Any]:
    done = machine.wb("agent", "status", ref, "--json")
    assert done.returncode == 0, done.stderr
    value: dict[str, Any] = json.loads(done.stdout)
    return value


def test_a_token_budget_stops_the_run_after_the_response_that_crosses_it(
    standin: Machine, server: ScriptedServer[Any]
) -> None:
    result = run(standin, "budgeted")

    assert result["state"] == "failed", result
    assert result["failure"] == "budget exceeded: 1,200 tokens of 1,000"
    assert model_requests(server) == 3  # 400 + 400 + 400: no fourth request reached the server
    assert result["budget"] == {"tokens": 1000}
    assert result["usage"]["input_tokens"] + result["usage"]["output_tokens"] == 1200  # usage kept
    status = standin.wb("agent", "status", result["agent_id"])
    assert "budget:   1,200 of 1,000 tokens\n" in status.stdout
    lines = status.stdout.splitlines()
    assert [line.split(":")[0] for line in lines].index("budget") == [line.split(":")[0] for line in lines].index(
        "usage"
    ) + 1


def test_max_tokens_replaces_the_profiles_budget_and_a_continued_run_counts_its_own_usage(
    standin: Machine, server: ScriptedServer[Any]
) -> None:
    first = run(standin, "unbounded", "--max-tokens", "500")
    assert first["failure"] == "budget exceeded: 800 tokens of 500" and first["budget"] == {"tokens": 500}
    assert model_requests(server) == 2

    server.clear()
    done = standin.wb("agent", "continue", first["agent_id"], "--task", "Go on.", "--max-tokens", "700")
    assert done.returncode == 0, done.stderr
    waited = standin.wb("agent", "await", done.stdout.split()[0], "--wait-timeout", "150s", "--json", timeout=180)
    assert waited.stdout, (waited.returncode, waited.stderr)
    second = json.loads(waited.stdout)
    # Its own 400 + 400 cross 700; the parent's 800 are not counted again.
    assert second["failure"] == "budget exceeded: 800 tokens of 700", second
    assert model_requests(server) == 2


def test_a_usage_limit_is_waited_out_visibly_and_the_session_resumes(
    standin: Machine, server: ScriptedServer[Any]
) -> None:
    server.limit_at(1, 1, "3")
    ref = _dispatch(standin, "patient")

    seen: dict[str, str] = {}

    def waiting() -> bool:
        done = standin.wb("agent", "status", ref)
        seen["text"] = done.stdout
        return "waiting:" in done.stdout or "state:    completed" in done.stdout

    assert wait_for(waiting, timeout=60)
    line = next(x for x in seen["text"].splitlines() if x.startswith("waiting:"))
    assert line.startswith("waiting:  usage limit (write-file); resuming at ") and line.endswith(" (wait 1 of 3)")
    assert "state:    running\n" in seen["text"]
    waited = standin.wb("agent", "await", ref, "--wait-timeout", "150s", "--json", timeout=180)
    result = json.loads(waited.stdout)
    assert result["state"] == "completed", result
    [wait] = result["waits"]
    assert wait["reason"] == "usage limit (write-file)" and line.split("resuming at ")[1].startswith(wait["until"])
    seconds = (datetime.fromisoformat(wait["until"]) - datetime.fromisoformat(wait["started_at"])).total_seconds()
    assert 2.5 <= seconds <= 4
    steps = [served.step for served in server.served if getattr(served, "step", None) is not None]
    assert steps == [0, 1, 2]  # the resumed session went on from its tool result


def test_a_waiting_run_is_not_stalled_and_stop_during_the_wait_ends_it_at_once(
    standin: Machine, server: ScriptedServer[Any]
) -> None:
    server.limit_at(1, 1, "50")  # within the profile's max_wait 1m
    ref = _dispatch(standin, "quiet")
    assert wait_for(lambda: bool(_status(standin, ref).get("waits")), timeout=60)

    def silent_past_stall_after() -> bool:
        seen = _status(standin, ref)
        last = datetime.fromisoformat(seen["last_output_at"])
        return (datetime.now(last.tzinfo) - last).total_seconds() > 2

    assert wait_for(silent_past_stall_after, timeout=30)
    quiet = _status(standin, ref)
    assert quiet["state"] == "running" and "stalled_since" not in quiet  # waiting is not stalling
    stopped = standin.wb("agent", "stop", ref)
    assert stopped.returncode == 0, stopped.stderr
    assert wait_for(lambda: _status(standin, ref)["terminal"], timeout=10)
    result = _status(standin, ref)
    assert result["state"] == "failed" and result["failure"].startswith("stopped on request at "), result
    assert len(result["waits"]) == 1


def test_more_waits_than_max_waits_end_the_run_with_the_limits_failure(
    standin: Machine, server: ScriptedServer[Any]
) -> None:
    server.limit_at(1, 2, "1")  # the resumed session meets the limit again
    result = run(standin, "stingy")
    assert result["state"] == "failed", result
    assert result["failure"].startswith("usage limit (write-file): ")
    assert result["failure"].endswith("(gave up after 1 wait(s), the on_usage_limit.max_waits bound)")
    assert len(result["waits"]) == 1


def test_a_reset_further_than_max_wait_ends_the_run_at_once(standin: Machine, server: ScriptedServer[Any]) -> None:
    server.limit_at(1, 1, "30")
    result = run(standin, "hasty")
    assert result["state"] == "failed", result
    assert "further away than on_usage_limit.max_wait 2s" in result["failure"]
    assert "waits" not in result


@pytest.mark.parametrize("cli", ["codex"], indirect=True)
@pytest.mark.parametrize(
    ("profile", "extra", "named"),
    [
        ("scripted", (), "harness command reports no usage"),
        ("unbounded", ("--max-cost-usd", "0.5"), "harness codex (Codex) reports no cost"),
        ("priced", (), "harness codex (Codex) reports no cost"),
        ("scripted-waits", (), "harness command cannot resume a session"),
    ],
)
def test_bounds_a_harness_cannot_honour_are_refused_at_dispatch(
    standin: Machine, profile: str, extra: tuple[str, ...], named: str
) -> None:
    done = standin.wb("agent", "dispatch", "--new-worktree", "w1", "--profile", profile,
                      "--repo", "acme/widget", "--task", "Do it.", *extra)  # fmt: skip
    assert done.returncode == 2, done.stdout
    assert done.stderr.startswith("error: ") and named in done.stderr and len(done.stderr.splitlines()) == 1
    listed = standin.wb("agent", "list", "--json")
    assert json.loads(listed.stdout) == []  # nothing was created


@pytest.mark.parametrize("cli", ["codex"], indirect=True)
@pytest.mark.parametrize("flag", [("--max-tokens", "0"), ("--max-cost-usd", "-1"), ("--max-cost-usd", "0")])
def test_a_bad_budget_flag_is_a_usage_error(standin: Machine, flag: tuple[str, str]) -> None:
    done = standin.wb("agent", "dispatch", "--new-worktree", "w1", "--profile", "unbounded",
                      "--repo", "acme/widget", "--task", "Do it.", *flag)  # fmt: skip
    assert done.returncode == 2 and done.stderr.startswith(f"error: {flag[0]} must be"), done.stderr


@pytest.mark.parametrize("cli", ["claude"], indirect=True)
def test_a_cost_bound_binds_claude_code_when_it_reports_its_cost(standin: Machine) -> None:
    result = run(standin, "patient", "--max-cost-usd", "0.0001")
    assert result["state"] == "failed", result
    cost = result["usage"]["cost_usd"]
    assert cost > 0.0001 and result["failure"] == f"budget exceeded: ${cost:.4f} of $0.0001"
    assert result["budget"] == {"cost_usd": 0.0001}
