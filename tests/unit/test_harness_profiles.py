"""Profiles for every harness (docs/config.md; docs/harnesses.md), the `command` harness's stream, and `capabilities`
on the wire."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from courier.capabilities import capabilities, harnesses_of
from courier.config import Problem, load_config
from courier.errors import UsageError
from courier.runs.admission import resolve_profile
from courier.runs.harness import harness_for, runnable_harnesses
from courier.runs.harness.command import CommandLines
from protocol.models import RemoteResponse, Usage

CONFIG = """\
agents:
  providers:
    local-claude: {base_url: 'http://127.0.0.1:9', credential_env: MY_CLAUDE_KEY, wire_api: anthropic}
  profiles:
    sonnet: {harness: claude, provider: anthropic, model: claude-sonnet-4-5}
    bypass: {harness: claude, provider: local-claude, model: claude-sonnet-4-5, permissions: bypass}
    script: {harness: command, command: [/usr/local/bin/agent, --fast, 'two words']}
    claude-on-codex: {harness: claude, provider: deepseek, model: m}
    codex-on-claude: {harness: codex, provider: anthropic, model: m}
    no-command: {harness: command}
    command-with-model: {harness: command, command: [/bin/true], provider: anthropic, model: m}
    relative: {harness: command, command: [bin/agent]}
    unclean: {harness: command, command: [/usr/bin/../bin/true]}
    empty: {harness: command, command: []}
    command-elsewhere: {harness: codex, provider: deepseek, model: m, command: [/bin/true]}
    bypass-codex: {harness: codex, provider: deepseek, model: m, permissions: bypass}
    other-permission: {harness: claude, provider: anthropic, model: m, permissions: all}
    no-model: {harness: claude, provider: anthropic}
    number-arg: {harness: command, command: [/bin/echo, 5]}
"""


@pytest.fixture
def config(tmp_path: Path):  # type: ignore[no-untyped-def]
    path = tmp_path / "wb.yaml"
    path.write_text(CONFIG)
    path.chmod(0o600)
    tmp_path.chmod(0o700)
    return load_config(path)


def problem(config, name: str) -> str:  # type: ignore[no-untyped-def]
    entry = config.profiles[name]
    assert isinstance(entry, Problem), name
    assert str(config.path) in entry.message and f"agents.profiles.{name}" in entry.message
    return entry.message


def test_builtin_providers_for_the_new_harnesses(config) -> None:  # type: ignore[no-untyped-def]
    anthropic, gemini = config.provider("anthropic"), config.provider("gemini")
    assert (anthropic.base_url, anthropic.credential_env, anthropic.wire_api) == (
        "https://api.anthropic.com", "ANTHROPIC_API_KEY", "anthropic",
    )  # fmt: skip
    assert (gemini.base_url, gemini.credential_env, gemini.wire_api) == (
        "https://generativelanguage.googleapis.com", "GEMINI_API_KEY", "gemini",
    )  # fmt: skip


def test_a_claude_profile_resolves(config) -> None:  # type: ignore[no-untyped-def]
    resolved, network = resolve_profile(config, "sonnet")
    assert (resolved.harness, resolved.provider, resolved.model, network) == (
        "claude",
        "anthropic",
        "claude-sonnet-4-5",
        False,
    )
    assert resolved.routing.wire_api == "anthropic" and resolved.routing.credential_env == "ANTHROPIC_API_KEY"
    assert config.profile("bypass").permissions == "bypass"


def test_a_command_profile_resolves_with_empty_provider_fields(config) -> None:  # type: ignore[no-untyped-def]
    resolved, _ = resolve_profile(config, "script")
    assert resolved.to_wire() == {
        "profile": "script", "harness": "command", "provider": "", "model": "",
        "routing": {"base_url": "", "wire_api": ""},
    }  # fmt: skip
    assert config.profile("script").command == ["/usr/local/bin/agent", "--fast", "two words"]


@pytest.mark.parametrize(
    ("name", "needs", "got"),
    [
        ("claude-on-codex", 'Claude Code needs "anthropic"', "responses"),
        ("codex-on-claude", 'Codex needs "responses"', "anthropic"),
    ],
)
def test_a_harness_provider_mismatch_names_file_key_and_fitting_values(config, name: str, needs: str, got: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UsageError) as caught:
        resolve_profile(config, name)
    provider = config.profile(name).provider
    assert f'{config.path}: agents.providers.{provider}.wire_api: {needs}, not "{got}"' in caught.value.message


@pytest.mark.parametrize(
    ("name", "rule"),
    [
        ("no-command", "harness command needs command"),
        ("command-with-model", "harness command takes no provider, model"),
        ("relative", "absolute, clean path"),
        ("unclean", "absolute, clean path"),
        ("empty", "command must list 1 to 64 strings"),
        ("command-elsewhere", "command is only for harness: command"),
        ("bypass-codex", "permissions is only for harness: claude"),
        ("other-permission", "permissions: Input should be 'bypass'"),
        ("no-model", "harness claude needs model"),
        ("number-arg", "command.1: must be a YAML string"),
    ],
)
def test_profile_rules(config, name: str, rule: str) -> None:  # type: ignore[no-untyped-def]
    assert rule in problem(config, name)


# --------------------------------------------------------------------------- the command harness


def test_command_lines_are_diagnostics_and_wb_result_sets_the_message(tmp_path: Path) -> None:
    lines = [
        b"starting\n",
        b'{"type":"wb.result","message":"first"}\n',
        b'{"type":"other"}\n',
        b"\n",
        b'{"type":"wb.result","message":"done: 3 files"}\n',
        b'{"type":"wb.result","message":7}\n',
    ]
    parser = CommandLines()
    for line in lines:
        parser.feed(line)
    assert parser.last_message == "done: 3 files"
    assert parser.diagnostics == ["starting", '{"type":"other"}', '{"type":"wb.result","message":7}']
    assert parser.failure(0) is None and parser.failure(3) == "command exited with code 3"
    assert parser.usage is None and parser.tool_calls == 0
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(lines))
    assert harness_for("command").worker_actions(path, 2) == [
        'diagnostic: {"type":"other"}', 'diagnostic: {"type":"wb.result","message":7}',
    ]  # fmt: skip


# --------------------------------------------------------------------------- capabilities


def test_capabilities_list_the_runnable_harnesses() -> None:
    listed = capabilities()
    assert [f"harness:{name}" for name in runnable_harnesses()] == [c for c in listed if c.startswith("harness:")]
    assert "harness:command" in listed  # it brings its own program
    assert harnesses_of(listed) == runnable_harnesses() and harnesses_of(None) == []


def test_an_optional_operation_lists_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    from protocol import operations

    entry = operations.Operation("example", "result", "courier.runs.service:status_op", capability="example")
    monkeypatch.setitem(operations.TABLE, "example", entry)
    listed = capabilities()
    harnesses = [f"harness:{name}" for name in runnable_harnesses()]
    assert listed == ["serve", "diff", "continue", "prune", "watch", "example", "follow", "prune-worktrees", "budget",
    "usage-wait", "placement", "login-watch", *harnesses]


def test_capabilities_and_cost_on_the_wire() -> None:
    reply = RemoteResponse(schema_version=1, operation="version", capabilities=["diff", "harness:claude"])
    decoded = RemoteResponse.model_validate(json.loads(reply.encode()))
    assert decoded.capabilities == ["diff", "harness:claude"]
    assert RemoteResponse.model_validate({"schema_version": 1, "operation": "version"}).capabilities is None
    for bad in (["Harness Claude"], ["x" * 65], "diff", [1], ["harness:claude\n"]):
        with pytest.raises(ValidationError):
            RemoteResponse.model_validate({"schema_version": 1, "operation": "version", "capabilities": bad})
    assert Usage.model_validate({"input_tokens": 1, "output_tokens": 2, "cost_usd": 0.0051}).cost_usd == 0.0051
    for bad_cost in (-1, "0.1", float("nan")):
        with pytest.raises(ValidationError):
            Usage.model_validate({"cost_usd": bad_cost})
