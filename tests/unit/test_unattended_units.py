"""The parts of budgets and usage-limit waits (docs/cli.md#budgets, docs/cli.md#waiting-out-a-usage-limit) that need
no process: what the
profile says, what a provider's response reports, what each real CLI's 429 stream means, how status shows it."""

from __future__ import annotations

import email.utils
import http.client
import io
import json
import time
from pathlib import Path

import pytest

from courier.capabilities import capabilities
from courier.config import Config, load_config
from courier.errors import UsageError
from courier.ops.status import status_text
from courier.render import budget_text
from courier.runs import usage_wait
from courier.runs.budget import budget_in_force, check_budget, exceeded, price_of, usage_limit_policy
from courier.runs.harness.claude import ClaudeEvents
from courier.runs.harness.codex import EventSummary
from courier.runs.harness.gemini import GeminiEvents
from courier.runs.harness.interface import MessageUsage
from courier.runs.meter import ResponseUsage, reset_time, usage_in
from courier.runs.metering import relay_needed
from courier.runs.store import Record
from protocol.models import Budget, Price, RemoteRequest, RemoteResponse, Result, UsageLimitPolicy

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _config(tmp_path: Path, profile: str) -> Config:
    path = tmp_path / "wb.yaml"
    path.write_text(
        "agents:\n  providers:\n    p: {base_url: 'http://127.0.0.1:9/v1', credential_env: K_KEY}\n"
        f"  profiles:\n    x:\n      harness: codex\n      provider: p\n      model: m\n{profile}"
    )
    path.chmod(0o600)
    tmp_path.chmod(0o700)
    return load_config(path)


def test_a_profile_takes_a_budget_and_on_usage_limit(tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        "      budget: {tokens: 10000, cost_usd: 0.5}\n"
        "      on_usage_limit: {resume: true, max_waits: 2, max_wait: 90m, prompt: Go on.}\n",
    )
    profile = config.profile("x")
    assert profile.budget is not None and (profile.budget.tokens, profile.budget.cost_usd) == (10000, 0.5)
    policy = usage_limit_policy(profile, "codex", "x")
    assert policy == UsageLimitPolicy(max_waits=2, max_wait_ms=90 * 60_000, prompt="Go on.")


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("      budget: {tokens: 0}\n", "budget.tokens must be a whole number of at least 1"),
        ("      budget: {cost_usd: -1}\n", "budget.cost_usd must be a number of dollars above 0"),
        ("      budget: {tokenz: 5}\n", "tokenz"),
        ("      on_usage_limit: {resume: true, max_wait: 6}\n", "max_wait"),
        ("      on_usage_limit: {resume: true, max_waits: 0}\n", "max_waits must be a whole number from 1"),
        ("      price: {input_usd_per_mtok: -1, output_usd_per_mtok: 15}\n", "price.input_usd_per_mtok: price rates"),
        ("      price: {input_usd_per_mtok: 3}\n", "price.output_usd_per_mtok"),
        ("      price: {input_usd_per_mtok: 3, output_usd_per_mtok: 15, cache: 1}\n", "price.cache"),
        ("      price: {input_usd_per_mtok: '3', output_usd_per_mtok: 15}\n", "price.input_usd_per_mtok"),
    ],
)
def test_a_bad_budget_or_wait_setting_is_refused_naming_the_key(tmp_path: Path, text: str, named: str) -> None:
    config = _config(tmp_path, text)
    with pytest.raises(UsageError) as caught:
        config.profile("x")
    assert named in caught.value.message and "agents.profiles.x" in caught.value.message


def test_a_profile_takes_a_price(tmp_path: Path) -> None:
    profile = _config(tmp_path, "      price: {input_usd_per_mtok: 3, output_usd_per_mtok: 15}\n").profile("x")
    assert price_of(profile) == Price(input_usd_per_mtok=3.0, output_usd_per_mtok=15.0)
    assert price_of(_config(tmp_path, "").profile("x")) is None


def test_waiting_is_off_unless_resume_is_true(tmp_path: Path) -> None:
    config = _config(tmp_path, "      on_usage_limit: {max_waits: 2}\n")
    assert usage_limit_policy(config.profile("x"), "command", "x") is None  # nothing to refuse either


def test_the_flags_replace_each_bound_of_the_profile(tmp_path: Path) -> None:
    profile = _config(tmp_path, "      budget: {tokens: 10000, cost_usd: 0.5}\n").profile("x")
    request = RemoteRequest(schema_version=1, max_tokens=200)
    assert budget_in_force(profile, request) == Budget(tokens=200, cost_usd=0.5)
    assert budget_in_force(profile, RemoteRequest(schema_version=1)) == Budget(tokens=10000, cost_usd=0.5)
    bare = _config(tmp_path, "").profile("x")
    assert budget_in_force(bare, RemoteRequest(schema_version=1)) is None


@pytest.mark.parametrize("harness", ["claude", "codex", "gemini"])
def test_a_cost_bound_needs_a_price_for_a_harness_that_reports_no_cost_per_response(harness: str) -> None:
    """Claude Code reports its cost only in its `result`, at the end of a turn: too late to bound a run by."""
    check_budget(Budget(tokens=5), harness, "x")
    check_budget(Budget(cost_usd=1.0), harness, "x", Price(input_usd_per_mtok=3, output_usd_per_mtok=15))
    refused = f"harness {harness} .* reports no cost per model response.*give the profile a price"
    with pytest.raises(UsageError, match=refused):
        check_budget(Budget(cost_usd=1.0), harness, "x")


def test_a_price_costs_cache_reads_at_the_cached_rate() -> None:
    price = Price(input_usd_per_mtok=3, output_usd_per_mtok=15, cached_input_usd_per_mtok=0.3)
    assert price.cost_usd(1_000_000, 500_000, 100_000) == pytest.approx(1.5 + 0.15 + 1.5)
    assert Price(input_usd_per_mtok=3, output_usd_per_mtok=15).cost_usd(1_000_000, 500_000, 0) == pytest.approx(3.0)


def test_the_failure_names_the_usage_and_the_bound() -> None:
    assert exceeded(Budget(tokens=10000), 12345, None) == "budget exceeded: 12,345 tokens of 10,000"
    assert exceeded(Budget(tokens=10000), 10000, None) is None  # reaching the bound is not crossing it
    assert exceeded(Budget(cost_usd=0.5), None, 0.521) == "budget exceeded: $0.5210 of $0.5000"
    assert exceeded(None, 10**9, 10.0) is None


# --------------------------------------------------------------------------- what a provider's response reports


def test_the_usage_of_each_wire_format() -> None:
    completed = {"type": "response.completed", "response": {"usage": {"input_tokens": 300, "output_tokens": 100}}}
    assert usage_in("responses", completed) == (ResponseUsage(300, 100), True)
    assert usage_in("responses", {"type": "response.output_text.delta"}) == (None, False)
    start = {"type": "message_start", "message": {"usage": {"input_tokens": 10, "cache_read_input_tokens": 290,
                                                            "output_tokens": 1}}}  # fmt: skip
    assert usage_in("anthropic", start) == (ResponseUsage(300, 1, 290), False)
    assert usage_in("anthropic", {"type": "message_delta", "usage": {"output_tokens": 100}}) == (
        ResponseUsage(0, 100),
        False,
    )
    assert usage_in("anthropic", {"type": "message_stop"}) == (None, True)
    chunk = {
        "candidates": [{"finishReason": "STOP"}],
        "usageMetadata": {"promptTokenCount": 300, "candidatesTokenCount": 90, "thoughtsTokenCount": 10},
    }
    assert usage_in("gemini", chunk) == (ResponseUsage(300, 100), True)


def _headers(**values: str) -> http.client.HTTPMessage:
    text = "".join(f"{key.replace('_', '-')}: {value}\r\n" for key, value in values.items()) + "\r\n"
    return http.client.parse_headers(io.BytesIO(text.encode()))


def test_the_reset_time_is_the_providers_else_its_retry_after() -> None:
    now = 1_000_000.0
    assert reset_time(_headers(retry_after="3"), now) == now + 3
    date = email.utils.formatdate(now + 60, usegmt=True)
    assert reset_time(_headers(retry_after=date), now) == now + 60
    reset = "2026-12-01T22:00:00Z"
    found = reset_time(_headers(retry_after="3", anthropic_ratelimit_unified_reset=reset), now)
    assert found == 1796162400.0
    assert reset_time(_headers(), now) is None


def test_without_a_reset_time_the_wait_is_fifteen_minutes() -> None:
    limit = usage_wait.Limit("anthropic", "rate limited")
    assert usage_wait.resume_at(limit, 100.0) == 100.0 + 15 * 60
    policy = UsageLimitPolicy(max_waits=3, max_wait_ms=10 * 60_000)
    assert "further away than on_usage_limit.max_wait 10m" in (usage_wait.refusal(policy, 0, 1000.0, 0.0, limit) or "")
    assert "gave up after 3 wait(s)" in (usage_wait.refusal(policy, 3, 10.0, 0.0, limit) or "")
    assert usage_wait.refusal(policy, 2, 10.0, 0.0, limit) is None


def test_stop_ends_a_wait_at_once() -> None:
    started = time.monotonic()
    assert usage_wait.wait_out(time.time() + 60, lambda: True) is True
    assert time.monotonic() - started < 5


# --------------------------------------------------------------------------- the real CLIs' 429 streams


def _feed(parser: EventSummary | ClaudeEvents | GeminiEvents, path: Path) -> None:
    with open(path, "rb") as handle:
        for line in handle:
            parser.feed(line)


def test_each_real_clis_429_failure_is_recognised_as_a_usage_limit() -> None:
    codex = EventSummary()
    _feed(codex, FIXTURES / "codex-0.169.0" / "limit-429.jsonl")
    assert codex.usage_limit == "exceeded retry limit, last status: 429 Too Many Requests"
    claude = ClaudeEvents()
    _feed(claude, FIXTURES / "claude-code-2.1.328" / "limit-429.jsonl")
    assert claude.usage_limit is not None and claude.usage_limit.startswith("API Error: Request rejected (429)")
    gemini = GeminiEvents()
    _feed(gemini, FIXTURES / "gemini-cli-0.61.0" / "limit-429.jsonl")
    assert gemini.usage_limit is not None and "Resource has been exhausted" in gemini.usage_limit
    for parser in (codex, claude, gemini):
        assert parser.failure(1) is not None


def test_other_failures_are_not_usage_limits() -> None:
    for name in ("http400.jsonl", "http401.jsonl", "failed_retry.jsonl"):
        codex = EventSummary()
        _feed(codex, FIXTURES / "codex-0.169.0" / name)
        assert codex.usage_limit is None, name
    claude = ClaudeEvents()
    _feed(claude, FIXTURES / "claude-code-2.1.328" / "api-error-400.jsonl")
    assert claude.usage_limit is None
    gemini = GeminiEvents()
    _feed(gemini, FIXTURES / "gemini-cli-0.61.0" / "api-error-400.jsonl")
    assert gemini.usage_limit is None


def test_a_claude_subscription_limit_names_its_reset_time() -> None:
    claude = ClaudeEvents()
    claude.feed(b'{"type":"result","is_error":true,"result":"Claude AI usage limit reached|1796162400"}\n')
    assert claude.usage_limit is not None and claude.limit_reset_at == 1796162400.0


# --------------------------------------------------------------------------- what status shows, what a peer lists


def _result(**fields: object) -> Result:
    base: dict[str, object] = {
        "agent_id": "agt-0123456789abcdef0123456789abcdef",
        "state": "running",
        "profile": "x",
        "resolved": {"profile": "x", "harness": "claude", "provider": "anthropic", "model": "m",
                     "routing": {"base_url": "https://api.anthropic.com", "wire_api": "anthropic"}},
        "repository": "acme/widget",
        "worktree_mode": "new",
        "worktree": "w1",
        "started_at": "2026-12-01T20:00:00Z",
    }  # fmt: skip
    return Result.model_validate({**base, **fields})


def test_status_shows_the_budget_after_the_usage() -> None:
    usage = {"input_tokens": 3000, "output_tokens": 210, "cost_usd": 0.0123}
    text = status_text(_result(usage=usage, budget={"tokens": 10000, "cost_usd": 0.5}))
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("usage:"))
    assert lines[at + 1] == "budget:   3,210 of 10,000 tokens; $0.0123 of $0.5000"


def test_an_unknown_cost_is_shown_as_unknown_never_as_zero() -> None:
    result = _result(budget={"tokens": 1000, "cost_usd": 0.01}, usage={"input_tokens": 300, "output_tokens": 100})
    assert budget_text(result) == "400 of 1,000 tokens; cost: unknown of $0.0100"
    text = status_text(result)
    assert "usage:    input 300, output 100, cost: unknown\n" in text and "$0.0000" not in text
    assert budget_text(_result(budget={"cost_usd": 0.01})) == "cost: unknown of $0.0100"


def test_status_shows_a_wait_while_the_run_waits() -> None:
    wait = {"started_at": "2026-12-01T20:10:00Z", "until": "2026-12-01T20:25:00Z", "reason": "usage limit (anthropic)"}
    text = status_text(_result(waits=[wait], max_waits=3))
    assert "waiting:  usage limit (anthropic); resuming at 2026-12-01T20:25:00Z (wait 1 of 3)\n" in text
    resumed = status_text(_result(waits=[wait], max_waits=3, worker_pid=123))
    assert "waiting:" not in resumed


def test_this_machine_lists_budget_and_usage_wait() -> None:
    assert {"budget", "usage-wait"} <= set(capabilities())


def test_a_budget_flag_for_an_older_peer_is_the_upgrade_message(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The peer is asked `version` once; its answer is kept, so the next budgeted start asks nothing more."""
    from courier.client import client as client_module
    from courier.client.client import Client

    asked: list[str] = []

    def older(config: object, machine: str, request: RemoteRequest, **_: object) -> RemoteResponse:
        asked.append(request.operation)
        assert request.operation == "version"
        return RemoteResponse(schema_version=1, operation="version", wb_version="0.9.0", capabilities=["diff"])

    class Target:
        def model_dump_json(self) -> str:
            return '{"ssh": {"host": "box"}}'

    class Settings:
        home = tmp_path / "home"

        def target(self, machine: str) -> Target:
            return Target()

    monkeypatch.setattr(client_module, "ask", older)
    starting = RemoteRequest(schema_version=1, operation="dispatch", max_tokens=5)
    upgrade = "machine box runs wb 0.9.0, which does not support --max-tokens and --max-cost-usd; upgrade wb there"
    for _ in range(2):
        with pytest.raises(UsageError) as caught:
            Client(Settings()).start("box", starting, "agt-" + "0" * 32)  # type: ignore[arg-type]
        assert caught.value.message == upgrade
    assert asked == ["version"]  # the second client read the first one's answer
    assert (tmp_path / "home" / "peers.json").stat().st_mode & 0o777 == 0o600


def test_claude_codes_assistant_lines_report_each_messages_usage_by_its_id() -> None:
    """What the meter takes as the stream's figure for a response (docs/cli.md#budgets); repeated per content block."""
    parser = ClaudeEvents()
    usage = {"input_tokens": 10, "cache_read_input_tokens": 290, "cache_creation_input_tokens": 5, "output_tokens": 1}
    line = {"type": "assistant", "message": {"id": "msg_1", "content": [], "usage": usage}}
    parser.feed(json.dumps(line).encode() + b"\n")
    parser.feed(json.dumps(line).encode() + b"\n")
    parser.feed(json.dumps({"type": "assistant", "message": {"id": "msg_2", "content": []}}).encode() + b"\n")
    assert parser.take_message_usage() == [MessageUsage("msg_1", 305, 1, 290)] * 2
    assert parser.take_message_usage() == []


@pytest.mark.parametrize(
    ("fields", "needed"),
    [
        ({}, False),
        ({"budget": {"tokens": 10}}, True),
        ({"usage_limit": {"max_waits": 1}}, True),
    ],
)
def test_the_relay_is_in_front_of_a_run_with_a_budget_or_a_wait(fields: dict[str, object], needed: bool) -> None:
    record = Record.model_validate({**_result().model_dump(exclude_none=True), "timeout_ms": 60_000, **fields})
    assert relay_needed(record) is needed


@pytest.mark.parametrize(
    ("tokens", "dollars"),
    [(-1, None), (0, None), (None, 0.0), (None, -0.5), (None, float("nan")), (None, float("inf")), (None, 2e6)],
)
def test_a_budget_the_flags_refuse_the_wire_refuses_too(tokens: int | None, dollars: float | None) -> None:
    """One budget rule (protocol/rules.py) for the caller's flags and the receiver's check: a value the
    flags refuse never reaches a receiver that would take it, nor the other way round (0 on the wire: none)."""
    from courier.commands import budget_flags
    from protocol.validate import RequestRefused, validate_request

    with pytest.raises(UsageError):
        budget_flags(tokens, dollars)
    fields = {"max_tokens": tokens or 0, "max_cost_usd": dollars if dollars is not None else 0.0}
    if fields["max_tokens"] or fields["max_cost_usd"]:
        request = RemoteRequest.of(
            "dispatch", mode="existing", worktree="w", profile="p", task="t", timeout_ms=1000, **fields
        )
        with pytest.raises(RequestRefused, match="max_"):
            validate_request(request)


def test_a_budget_the_flags_take_the_wire_takes() -> None:
    from courier.commands import budget_flags
    from protocol.validate import validate_request

    fields = budget_flags(1, 1_000_000.0)
    request = RemoteRequest.of(
        "dispatch", mode="existing", worktree="w", profile="p", task="t", timeout_ms=1000, **fields
    )
    assert validate_request(request).max_tokens == 1
