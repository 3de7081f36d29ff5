"""Budgets and usage-limit waits through wb, with the bundled stand-ins of the three CLIs (docs/cli.md#budgets,
docs/cli.md#waiting-out-a-usage-limit).

The stand-ins (courier/demo/standin_*.py) hold real HTTP conversations with the scripted servers,
as the real CLIs do, so the owner's metering relay sits in the same place; tests/e2e has the same
cases with the real CLIs. Refusals at dispatch use the fakes (nothing starts).
"""

from __future__ import annotations

import json
import re
import shlex
import sys
import urllib.error
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from conftest import CREDENTIAL_ENV, CREDENTIAL_VALUE, Machine, wait_for

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
    metered-cost:
      harness: {harness}
      provider: endless
      model: {model}
      budget: {{cost_usd: 0.01}}
      price: {{input_usd_per_mtok: 3, output_usd_per_mtok: 15}}
    unmetered:
      harness: {harness}
      provider: endless-unmetered
      model: {model}
      budget: {{tokens: 1000}}
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


PLACEHOLDER = re.compile(r"wb-run-[0-9a-f]{32}")
# The variable each CLI reads its credential from (docs/harnesses.md); Codex reads the provider's own.
KEY_VARIABLE = {"codex": CREDENTIAL_ENV, "claude": "ANTHROPIC_API_KEY", "gemini": "GEMINI_API_KEY"}


def _put_first_on_path(machine: Machine, tmp_path: Path, name: str, runs: str) -> None:
    """`name` on the machine's PATH: a wrapper that writes its environment to worker-env.json in its working
    directory (what the worker was handed), then execs `runs` with the package importable."""
    bin_dir = tmp_path / f"{name}-wrapped-bin"
    bin_dir.mkdir()
    package_parent = str(Path(courier.__file__).resolve().parents[1])
    dump = "import json, os; json.dump(dict(os.environ), open('worker-env.json', 'w'))"
    wrapper = bin_dir / name
    wrapper.write_text(
        f"#!/bin/sh\n{shlex.quote(sys.executable)} -c {shlex.quote(dump)}\n"
        f"PYTHONPATH={shlex.quote(package_parent)}; export PYTHONPATH\nexec {runs} \"$@\"\n"
    )
    wrapper.chmod(0o755)
    machine.env["PATH"] = f"{bin_dir}:{machine.env['PATH']}"


def _worker_env(result: dict[str, Any]) -> dict[str, str]:
    value: dict[str, str] = json.loads((Path(result["worktree_dir"]) / "worker-env.json").read_text())
    return value


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
        ("unbounded", ("--max-cost-usd", "0.5"), "harness codex (Codex) reports no cost per model response"),
        ("priced", (), "harness codex (Codex) reports no cost per model response, so a cost_usd budget cannot be "
                       "enforced without a price; give the profile a price"),
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
def test_a_cost_bound_without_a_price_is_refused_for_claude_code_too(standin: Machine) -> None:
    """Claude Code reports its cost only in its `result`, at the end of a turn: a run could spend far past the bound."""
    done = standin.wb("agent", "dispatch", "--new-worktree", "w1", "--profile", "unbounded",
                      "--repo", "acme/widget", "--task", "Do it.", "--max-cost-usd", "0.01")  # fmt: skip
    assert done.returncode == 2, done.stdout
    assert done.stderr.startswith("error: profile unbounded: harness claude (Claude Code) reports no cost per model")
    assert "give the profile a price (price: {input_usd_per_mtok: X, output_usd_per_mtok: Y})" in done.stderr


def test_with_a_price_a_cost_bound_is_checked_after_every_response(
    standin: Machine, server: ScriptedServer[Any]
) -> None:
    """Each endless response is 300 in + 100 out: $0.0024 at $3/$15 per million; the fifth crosses $0.0100."""
    result = run(standin, "metered-cost")
    assert result["state"] == "failed", result
    assert result["failure"] == "budget exceeded: $0.0120 of $0.0100", result
    assert model_requests(server) == 5  # stopped after the crossing response, not at the end of a turn
    assert result["budget"] == {"cost_usd": 0.01}
    assert result["usage"]["cost_usd"] >= 0.012
    status = standin.wb("agent", "status", result["agent_id"])
    assert "budget:   $0.0120 of $0.0100\n" in status.stdout, status.stdout
    assert "$0.0000" not in status.stdout


def test_a_response_neither_side_reports_usage_for_stops_a_token_bounded_run(
    standin: Machine, server: ScriptedServer[Any]
) -> None:
    result = run(standin, "unmetered")
    assert result["state"] == "failed", result
    assert result["failure"] == "budget cannot be enforced: a model response reported no usage"
    assert model_requests(server) == 1  # nothing after the unreported response reached the provider


@pytest.mark.parametrize("cli", ["claude"], indirect=True)
def test_the_harnesss_own_larger_count_binds_when_the_provider_reports_none(
    standin: Machine, server: ScriptedServer[Any], tmp_path: Path
) -> None:
    """The provider's stream carries no usage; Claude Code's `assistant` lines say 50,000 tokens: stopped after it."""
    fake = Path(__file__).resolve().parents[1] / "fakes" / "claude_overreporting.py"
    _put_first_on_path(standin, tmp_path, "claude", f"{shlex.quote(sys.executable)} {shlex.quote(str(fake))}")
    result = run(standin, "unmetered")
    assert result["state"] == "failed", result
    assert result["failure"] == "budget exceeded: 50,000 tokens of 1,000", result
    assert model_requests(server) == 1
    status = standin.wb("agent", "status", result["agent_id"])
    assert "budget:   50,000 of 1,000 tokens\n" in status.stdout


def test_the_worker_holds_the_runs_placeholder_and_the_provider_gets_the_credential(
    standin: Machine, server: ScriptedServer[Any], cli: Any, tmp_path: Path
) -> None:
    _put_first_on_path(standin, tmp_path, cli.name, f"{shlex.quote(sys.executable)} -m courier.demo.standin_{cli.name}")
    result = run(standin, "budgeted")
    assert result["failure"] == "budget exceeded: 1,200 tokens of 1,000", result  # it worked, through the relay
    env = _worker_env(result)
    assert PLACEHOLDER.fullmatch(env[KEY_VARIABLE[cli.name]]), env.get(KEY_VARIABLE[cli.name])
    assert not any(CREDENTIAL_VALUE in value for value in env.values())  # the credential is not in the worker
    forwarded = [request for request in server.requests if request.method == "POST"]
    assert forwarded and all(CREDENTIAL_VALUE in str(dict(r.headers)) + r.path for r in forwarded)
    assert not any(PLACEHOLDER.search(str(dict(r.headers)) + r.path) for r in forwarded)
    events = (Path(standin.home) / "agents" / result["agent_id"] / "events.jsonl").read_bytes()
    assert CREDENTIAL_VALUE.encode() not in events


@pytest.mark.parametrize("cli", ["claude", "gemini"], indirect=True)
def test_a_request_from_another_process_without_the_placeholder_is_refused_and_reaches_no_provider(
    standin: Machine, server: ScriptedServer[Any], cli: Any, tmp_path: Path
) -> None:
    """While the run waits out a usage limit its relay is up; 12 requests from this process all get 403."""
    _put_first_on_path(standin, tmp_path, cli.name, f"{shlex.quote(sys.executable)} -m courier.demo.standin_{cli.name}")
    server.limit_at(1, 1, "50")
    ref = _dispatch(standin, "quiet")
    assert wait_for(lambda: bool(_status(standin, ref).get("waits")), timeout=60)
    seen = _status(standin, ref)
    env = json.loads((Path(seen["worktree_dir"]) / "worker-env.json").read_text())
    relay = env["ANTHROPIC_BASE_URL" if cli.name == "claude" else "GOOGLE_GEMINI_BASE_URL"].rstrip("/")
    assert relay.startswith("http://127.0.0.1:")
    before = len(server.requests)
    path = "/v1/messages" if cli.name == "claude" else f"/v1beta/models/{cli.model}:streamGenerateContent?alt=sse"
    for key in (None, CREDENTIAL_VALUE, "wb-run-" + "0" * 32) * 4:
        headers = {"content-type": "application/json", **({"x-api-key": key, "x-goog-api-key": key} if key else {})}
        request = urllib.request.Request(f"{relay}{path}", data=b"{}", headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                status = answer.status
        except urllib.error.HTTPError as exc:
            status = exc.code
        assert status == 403
    assert len(server.requests) == before  # none reached the provider
    assert standin.wb("agent", "stop", ref).returncode == 0
    assert wait_for(lambda: _status(standin, ref)["terminal"], timeout=10)
