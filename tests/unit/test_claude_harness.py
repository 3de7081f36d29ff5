"""The Claude Code harness (docs/harnesses.md) against real 2.1.328 transcripts: facts, terminal rule, actions, argv,
env."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from courier.config import Provider
from courier.runs.environment import FILE_CREDENTIAL_ENV
from courier.runs.harness import harness_for, spec_for
from courier.runs.harness.claude import Claude, ClaudeEvents, claude_argv
from courier.runs.harness.interface import Launch
from protocol.models import Usage

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "claude-code-2.1.328"
COST = 0.010620000000000001


def parse(name: str) -> ClaudeEvents:
    events = ClaudeEvents()
    with open(FIXTURES / name, "rb") as handle:
        for line in handle:
            events.feed(line)
    return events


def launch(tmp_path: Path, **changes: Any) -> Launch:
    fields: dict[str, Any] = {
        "worktree": "/p/.wb-worktrees/acme/widget/w1",
        "run_dir": tmp_path,
        "home": tmp_path / "harness-home",
        "model": "claude-sonnet-4-5",
        "provider_name": "anthropic",
        "provider": Provider(
            base_url="https://api.anthropic.com", credential_env="ANTHROPIC_API_KEY", wire_api="anthropic"
        ),
        "env_key": "ANTHROPIC_API_KEY",
    }
    fields.update(changes)
    return Launch(**fields)


# --------------------------------------------------------------------------- the parser on real transcripts


def test_fixtures_are_the_captured_transcripts_unchanged() -> None:
    import hashlib

    pinned = {}
    for entry in (FIXTURES / "SHA256SUMS").read_text().splitlines():
        digest, name = entry.split(maxsplit=1)
        pinned[name.lstrip("*")] = digest
    assert sorted(pinned) == sorted(path.name for path in FIXTURES.glob("*.jsonl"))
    for name, digest in pinned.items():
        assert hashlib.sha256((FIXTURES / name).read_bytes()).hexdigest() == digest, name


def test_a_successful_run_with_a_command() -> None:
    events = parse("bash-allowed.jsonl")
    assert events.failure(0) is None
    assert events.session_id == "046544bf-6081-4184-9938-5a6161bda26d"
    assert events.last_message == "The directory contains README.md."
    assert events.tool_calls == 1
    # docs/cli.md#results: input_tokens counts cache reads and writes; Anthropic's 3000 does not.
    assert events.usage == Usage(
        input_tokens=4400, cached_input_tokens=1400, cache_write_input_tokens=0, output_tokens=80,
        reasoning_output_tokens=0, cost_usd=COST,
    )  # fmt: skip
    assert events.diagnostics == []


def test_partial_messages_change_nothing() -> None:
    plain, partial = parse("bash-allowed.jsonl"), parse("bash-partial-messages.jsonl")
    assert (partial.tool_calls, partial.usage, partial.last_message) == (1, plain.usage, plain.last_message)
    assert partial.failure(0) is None and partial.diagnostics == []


def test_a_denied_write_is_a_diagnostic_not_a_failure() -> None:
    events = parse("write-denied.jsonl")
    assert events.failure(0) is None and events.tool_calls == 1
    assert events.diagnostics == [
        "Claude requested permissions to write to /home/dev/lab/cwork/hello.txt, but you haven't granted it yet."
    ]


def test_max_turns_fails_with_the_harness_errors() -> None:
    events = parse("error-max-turns.jsonl")
    assert events.tool_calls == 2 and events.last_message is None
    assert events.failure(1) == (
        "harness exited with code 1; harness reported an error: Reached maximum number of turns (2)"
    )
    assert events.usage is not None and events.usage.input_tokens == 4400


def test_an_api_error_is_not_a_final_message() -> None:
    events = parse("api-error-400.jsonl")
    assert events.last_message is None
    assert events.failure(1) == (
        "harness exited with code 1; harness reported an error: API Error: 400 model: claude-nope is not a valid model"
    )
    # Even with exit 0 an error result is not success (its subtype is "success": is_error decides).
    assert events.failure(0) == "harness reported an error: API Error: 400 model: claude-nope is not a valid model"


def test_sigint_exits_0_without_a_result_and_that_is_not_success() -> None:
    events = parse("sigint.jsonl")
    assert events.failure(0) == "no result event"
    assert events.session_id is not None


def test_api_retries_are_diagnostics() -> None:
    events = parse("api-retry-401-head.jsonl")
    assert events.diagnostics == [
        "API retry 1/10 (401 authentication_failed)",
        "API retry 2/10 (401 authentication_failed)",
    ]
    assert events.failure(None) == "no result event"


def test_malformed_lines_are_diagnostics_and_do_not_fail_a_finished_run() -> None:
    events = ClaudeEvents()
    for line in (b"not json\n", b"[1,2]\n", b"\n", (FIXTURES / "simple.jsonl").read_bytes()):
        for part in line.splitlines(keepends=True) or [line]:
            events.feed(part)
    assert events.failure(0) is None and events.last_message == "Hello from the mock Claude."
    assert events.diagnostics == ["malformed event line 1: not json", "malformed event line 2: [1,2]"]


# --------------------------------------------------------------------------- worker actions


def actions(name: str, limit: int = 20) -> list[str]:
    return harness_for("claude").worker_actions(FIXTURES / name, limit)


def test_worker_actions_of_real_transcripts() -> None:
    assert actions("bash-allowed.jsonl") == ["ran: ls"]
    assert actions("write-acceptEdits.jsonl") == ["changed 1 file"]
    assert actions("write-denied.jsonl") == [
        "changed 1 file",
        "diagnostic: Claude requested permissions to write to /home/dev/lab/cwork/hello.txt, "
        "but you haven't granted it yet.",
    ]
    assert actions("error-max-turns.jsonl") == [
        "ran: echo hi", "ran: echo hi", "diagnostic: Reached maximum number of turns (2)",
    ]  # fmt: skip
    assert actions("api-retry-401-head.jsonl", 1) == ["diagnostic: API retry 2/10 (401 authentication_failed)"]
    assert actions("simple.jsonl") == []


def test_mcp_and_file_tools_and_many_blocks(tmp_path: Path) -> None:
    blocks = [
        {"type": "tool_use", "id": "t1", "name": "mcp__docs__search", "input": {}},
        {"type": "tool_use", "id": "t2", "name": "MultiEdit", "input": {}},
        {"type": "tool_use", "id": "t3", "name": "Read", "input": {"file_path": "/x"}},
        {"type": "tool_use", "id": "t4", "name": "Bash", "input": {"command": "printf '\\x1b[31mred'"}},
    ]
    events = [{"type": "assistant", "message": {"id": "m", "content": [block]}} for block in blocks]
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    assert harness_for("claude").worker_actions(path, 10) == [
        "called docs.search", "changed 1 file", "ran: printf '\\x1b[31mred'",
    ]  # fmt: skip
    parser = ClaudeEvents()
    for event in events:
        parser.feed(json.dumps(event).encode())
    assert parser.tool_calls == 4  # every tool_use block, Read included


# --------------------------------------------------------------------------- argv and environment


def test_the_registry_knows_claude() -> None:
    spec = spec_for("claude")
    assert (spec.executable, spec.wire_apis, spec.display) == ("claude", ("anthropic",), "Claude Code")
    assert isinstance(harness_for("claude"), Claude)


def test_argv_is_exact_and_never_holds_the_task(tmp_path: Path) -> None:
    assert claude_argv(launch(tmp_path)) == [
        "claude", "-p", "--output-format", "stream-json", "--verbose", "--model", "claude-sonnet-4-5",
        "--setting-sources", "", "--strict-mcp-config",
        "--permission-mode", "acceptEdits", "--allowedTools", "Bash", "--permission-prompts", "none",
    ]  # fmt: skip
    assert claude_argv(launch(tmp_path, reasoning="high"))[7:9] == ["--effort", "high"]


def test_bypass_only_when_the_profile_says_so_and_never_as_root(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        with pytest.raises(ValueError, match="Claude Code refuses bypassPermissions with root privileges"):
            claude_argv(launch(tmp_path, permissions="bypass"))
    else:
        argv = claude_argv(launch(tmp_path, permissions="bypass"))
        assert argv[-2:] == ["--permission-mode", "bypassPermissions"] and "acceptEdits" not in argv


def test_a_model_that_looks_like_a_flag_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="must be a non-empty identifier"):
        claude_argv(launch(tmp_path, model="--dangerously-skip-permissions"))


def test_environment_maps_the_one_credential_to_anthropic_api_key(tmp_path: Path) -> None:
    provider = Provider(
        base_url="http://127.0.0.1:9", credential_file="/k", wire_api="anthropic", request_max_retries=0
    )
    run = launch(tmp_path, provider=provider, env_key=FILE_CREDENTIAL_ENV)
    env = Claude().environment(run, {"PATH": "/usr/bin", "HOME": "/home/u", FILE_CREDENTIAL_ENV: "sk-secret"})
    assert env == {
        "PATH": "/usr/bin",
        "HOME": "/home/u",
        "ANTHROPIC_API_KEY": "sk-secret",
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:9",
        "CLAUDE_CODE_MAX_RETRIES": "0",
        "CLAUDE_CONFIG_DIR": str(tmp_path / "harness-home"),
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
