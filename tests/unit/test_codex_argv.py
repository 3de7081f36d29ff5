"""The `codex exec` command line of docs/codex-notes.md#the-argv, exactly, and every override valid TOML."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest

from courier.config import Provider
from courier.runs.environment import FILE_CREDENTIAL_ENV
from courier.runs.harness.codex import codex_argv, toml_string

TASK = "scenario:complete please write hello.txt"


def _provider(**fields: Any) -> Provider:
    values: dict[str, Any] = {"base_url": "https://api.deepseek.com", "credential_env": "DEEPSEEK_API_KEY"}
    values.update(fields)
    return Provider(**values)


def _argv(**changes: Any) -> list[str]:
    arguments: dict[str, Any] = {
        "worktree": "/p/.wb-worktrees/acme/widget/w1",
        "model": "deepseek-flash",
        "provider_name": "deepseek",
        "provider": _provider(),
        "reasoning": None,
        "network": False,
        "last_message_path": "/h/agents/agt-1/last-message.txt",
        "env_key": "DEEPSEEK_API_KEY",
    }
    arguments.update(changes)
    return codex_argv(**arguments)


def _overrides(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == "-c"]


def _as_toml(argv: list[str]) -> dict[str, Any]:
    """Every `-c key=value` parsed as one TOML document, as Codex layers them."""
    return tomllib.loads("\n".join(_overrides(argv)))


def test_exact_argv_for_a_representative_provider() -> None:
    assert _argv() == [
        "codex", "exec", "--json", "--ignore-user-config",
        "-C", "/p/.wb-worktrees/acme/widget/w1", "-s", "workspace-write", "-m", "deepseek-flash",
        "-c", 'model_provider="wb_deepseek"',
        "-c", 'model_providers.wb_deepseek.name="deepseek"',
        "-c", 'model_providers.wb_deepseek.base_url="https://api.deepseek.com"',
        "-c", 'model_providers.wb_deepseek.wire_api="responses"',
        "-c", 'model_providers.wb_deepseek.env_key="DEEPSEEK_API_KEY"',
        "-c", 'approval_policy="never"',
        "-c", 'shell_environment_policy.inherit="core"',
        "-c", 'shell_environment_policy.exclude=["*KEY*","*TOKEN*","*SECRET*"]',
        "-o", "/h/agents/agt-1/last-message.txt", "-",
    ]  # fmt: skip


def test_runs_keep_their_session_no_ephemeral_flag() -> None:
    """docs/codex-notes.md#the-argv; docs/cli.md, wb agent continue: the session is kept (in the run's private
    CODEX_HOME) so it can be continued."""
    assert "--ephemeral" not in _argv()


def test_resume_puts_the_exec_options_first_then_resume_thread_and_stdin() -> None:
    """`codex exec [OPTIONS] resume <thread> -`: the resume subcommand takes only the ID and the prompt."""
    thread = "019a7c1e-5b0c-7d22-9f1a-3c4d5e6f7a8b"
    plain, resumed = _argv(), _argv(resume_session=thread)
    assert resumed == [*plain[:-1], "resume", thread, "-"]


@pytest.mark.parametrize("session", ["--last", "-x", "a b", "../x", "", "x" * 200])
def test_a_session_id_that_is_not_a_thread_id_is_refused(session: str) -> None:
    with pytest.raises(ValueError, match="session ID"):
        _argv(resume_session=session)


def test_every_override_round_trips_through_tomllib() -> None:
    argv = _argv(
        provider_name="local-vllm",
        provider=_provider(
            base_url="http://127.0.0.1:8000/v1", request_max_retries=2, stream_max_retries=3,
            stream_idle_timeout_ms=300000,
        ),
        reasoning="high",
        network=True,
        env_key="VLLM_KEY",
    )  # fmt: skip
    for override in _overrides(argv):
        value = override.split("=", 1)[1]
        parsed = tomllib.loads(f"x = {value}")["x"]
        assert parsed is not None
        assert tomllib.loads(override)  # also a valid `dotted.key = value` line on its own
    assert _as_toml(argv) == {
        "model_provider": "wb_local-vllm",
        "model_providers": {
            "wb_local-vllm": {
                "name": "local-vllm",
                "base_url": "http://127.0.0.1:8000/v1",
                "wire_api": "responses",
                "env_key": "VLLM_KEY",
                "request_max_retries": 2,
                "stream_max_retries": 3,
                "stream_idle_timeout_ms": 300000,
            }
        },
        "approval_policy": "never",
        "shell_environment_policy": {"inherit": "core", "exclude": ["*KEY*", "*TOKEN*", "*SECRET*"]},
        "model_reasoning_effort": "high",
        "sandbox_workspace_write": {"network_access": True},
    }


def test_optional_overrides_come_in_contract_order() -> None:
    overrides = _overrides(
        _argv(provider=_provider(request_max_retries=0, stream_max_retries=1), reasoning="low", network=True)
    )
    keys = [override.split("=", 1)[0] for override in overrides]
    assert keys == [
        "model_provider",
        "model_providers.wb_deepseek.name",
        "model_providers.wb_deepseek.base_url",
        "model_providers.wb_deepseek.wire_api",
        "model_providers.wb_deepseek.env_key",
        "model_providers.wb_deepseek.request_max_retries",
        "model_providers.wb_deepseek.stream_max_retries",
        "approval_policy",
        "shell_environment_policy.inherit",
        "shell_environment_policy.exclude",
        "model_reasoning_effort",
        "sandbox_workspace_write.network_access",
    ]
    assert "model_providers.wb_deepseek.request_max_retries=0" in overrides
    assert 'model_reasoning_effort="low"' in overrides
    assert "sandbox_workspace_write.network_access=true" in overrides


def test_no_network_and_no_reasoning_by_default() -> None:
    joined = " ".join(_argv())
    assert "network_access" not in joined
    assert "model_reasoning_effort" not in joined
    assert "max_retries" not in joined


def test_credential_file_providers_read_the_injected_variable() -> None:
    provider = Provider(base_url="https://openrouter.ai/api/v1", credential_file="/home/me/.config/wb/key")
    argv = _argv(provider_name="openrouter", provider=provider, env_key=FILE_CREDENTIAL_ENV)
    assert _as_toml(argv)["model_providers"]["wb_openrouter"]["env_key"] == "WB_AGENT_PROVIDER_CREDENTIAL"


def test_chat_wire_api_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="wire_api: responses"):
        _argv(provider=_provider(wire_api="chat"))


@pytest.mark.parametrize(
    "changes",
    [
        {"provider_name": "Bad.Name"},
        {"env_key": "lower"},
        {"worktree": "relative/dir"},
        {"last_message_path": "last.txt"},
        {"model": "-x"},
    ],
)
def test_unsafe_values_are_refused(changes: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        _argv(**changes)


def test_the_task_never_appears_and_stdin_is_the_prompt() -> None:
    argv = _argv(reasoning="high", network=True)
    assert argv[-1] == "-"
    assert argv[-3:-1] == ["-o", "/h/agents/agt-1/last-message.txt"]
    assert not any(TASK in arg or "scenario:" in arg for arg in argv)


@pytest.mark.parametrize("value", ['quo"te', "back\\slash", "tab\there", "new\nline", "del\x7f", "ünïcødé ‮"])
def test_toml_string_round_trips(value: str) -> None:
    assert tomllib.loads(f"x = {toml_string(value)}")["x"] == value


def test_toml_string_refuses_lone_surrogates() -> None:
    with pytest.raises(ValueError):
        toml_string("bad \udc80")
