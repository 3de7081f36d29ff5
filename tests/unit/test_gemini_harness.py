"""The Gemini CLI harness against real 0.61.0 transcripts: argv, environment, private home, parser, actions
(docs/harnesses.md)."""

from __future__ import annotations

import json
import os
import stat
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from courier.config import Provider
from courier.runs.harness import harness_for, spec_for
from courier.runs.harness.gemini import TASK_PLACEHOLDER, Gemini, GeminiEvents
from courier.runs.harness.interface import Launch
from courier.runs.harness.message import bounded_message
from protocol import limits
from protocol.models import Usage

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gemini-cli-0.61.0"
PROVIDER = Provider(base_url="http://127.0.0.1:9", credential_env="MY_GEMINI_KEY", wire_api="gemini")


def parse(name: str) -> tuple[GeminiEvents, list[bytes]]:
    parser = GeminiEvents()
    stored = [parser.feed(line) for line in (FIXTURES / name).read_bytes().splitlines(keepends=True)]
    return parser, stored


def line(event: dict[str, Any]) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode() + b"\n"


def launch(tmp_path: Path, provider: Provider | None = PROVIDER, env_key: str = "MY_GEMINI_KEY") -> Launch:
    home = tmp_path / "run" / "harness-home"
    home.mkdir(parents=True, mode=0o700)
    worktree = tmp_path / "worktree"
    worktree.mkdir(exist_ok=True)
    return Launch(str(worktree), tmp_path / "run", home, "gemini-2.5-pro", "g", provider, env_key)


def final_text(parser: GeminiEvents) -> str | None:
    found = Gemini().final_message(launch_stub(), parser)
    return None if found is None else bounded_message(*found)


def launch_stub() -> Launch:
    return Launch("/w", Path("/r"), Path("/r/h"), "m", "g", PROVIDER, "K")


# --------------------------------------------------------------------------- the registry and the start


def test_the_registry_names_the_gemini_harness() -> None:
    spec = spec_for("gemini")
    assert (spec.display, spec.executable, spec.wire_apis) == ("Gemini CLI", "gemini", ("gemini",))
    assert isinstance(harness_for("gemini"), Gemini)


def test_argv_is_exactly_the_contracts_and_never_holds_the_task(tmp_path: Path) -> None:
    assert Gemini().argv(launch(tmp_path)) == [
        "gemini", "-o", "stream-json", "-m", "gemini-2.5-pro", "--approval-mode", "auto_edit",
    ]  # fmt: skip


SESSION = "4faa5275-8a56-498b-8ec3-09e4b05d1588"


def test_the_gemini_harness_can_resume_by_session_id(tmp_path: Path) -> None:
    """docs/cli.md, wb agent continue: 0.61.0 looks a `--resume` value up as a session ID first (docs/harnesses.md)."""
    assert spec_for("gemini").can_resume
    run = replace(launch(tmp_path), resume_session=SESSION)
    assert Gemini().argv(run) == [
        "gemini", "-o", "stream-json", "-m", "gemini-2.5-pro", "--approval-mode", "auto_edit", "--resume", SESSION,
    ]  # fmt: skip


@pytest.mark.parametrize("session", ["latest", "3", "", "--yolo", f"{SESSION}\n", f"{SESSION} 2", "/etc/passwd"])
def test_only_a_uuid_is_ever_passed_to_resume(tmp_path: Path, session: str) -> None:
    """`latest` or a number would resume another session of the project; anything but a UUID is refused."""
    with pytest.raises(ValueError, match="not a Gemini CLI session ID"):
        Gemini().argv(replace(launch(tmp_path), resume_session=session))


def test_argv_refuses_a_provider_of_another_wire_api_and_an_option_like_model(tmp_path: Path) -> None:
    responses = Provider(base_url="http://127.0.0.1:9", credential_env="K", wire_api="responses")
    with pytest.raises(ValueError, match='wire_api "gemini", not "responses"'):
        Gemini().argv(launch(tmp_path, responses))
    bad = Launch("/w", tmp_path, tmp_path, "--yolo", "g", PROVIDER, "K")
    with pytest.raises(ValueError, match="not starting with '-'"):
        Gemini().argv(bad)


def test_environment_moves_the_one_credential_to_gemini_api_key_and_points_home_and_tmp_inside(
    tmp_path: Path,
) -> None:
    run = launch(tmp_path)
    env = Gemini().environment(run, {"PATH": "/usr/bin", "HOME": "/home/u", "MY_GEMINI_KEY": "sk-1"})
    home = str(run.home)
    assert env == {
        "PATH": "/usr/bin",
        "HOME": "/home/u",  # the worker's commands keep the user's git identity
        "GEMINI_API_KEY": "sk-1",
        "GOOGLE_GEMINI_BASE_URL": "http://127.0.0.1:9",
        "GEMINI_CLI_HOME": home,
        "TMPDIR": f"{home}/tmp",
        "TMP": f"{home}/tmp",
        "TEMP": f"{home}/tmp",
        "GEMINI_CLI_NO_RELAUNCH": "true",
    }


def test_a_credential_file_value_is_given_as_gemini_api_key(tmp_path: Path) -> None:
    provider = Provider(base_url="https://generativelanguage.googleapis.com", credential_file="/k", wire_api="gemini")
    run = launch(tmp_path, provider, env_key="WB_AGENT_PROVIDER_CREDENTIAL")
    env = Gemini().environment(run, {"WB_AGENT_PROVIDER_CREDENTIAL": "sk-file"})
    assert env["GEMINI_API_KEY"] == "sk-file" and "WB_AGENT_PROVIDER_CREDENTIAL" not in env
    assert env["GOOGLE_GEMINI_BASE_URL"] == "https://generativelanguage.googleapis.com"


def test_the_private_home_selects_api_key_auth_trusts_only_this_worktree_and_allows_the_shell(
    tmp_path: Path,
) -> None:
    run = launch(tmp_path)
    Gemini().prepare_home(run)
    gemini_dir = run.home / ".gemini"
    settings = json.loads((gemini_dir / "settings.json").read_text())
    assert settings["security"]["auth"]["selectedType"] == "gemini-api-key"
    assert settings["security"]["environmentVariableRedaction"] == {"enabled": True}
    assert settings["privacy"]["usageStatisticsEnabled"] is False
    assert "mcpServers" not in settings and "hooks" not in settings
    assert json.loads((gemini_dir / "trustedFolders.json").read_text()) == {run.worktree: "TRUST_FOLDER"}
    policy = tomllib.loads((gemini_dir / "policies" / "wb.toml").read_text())
    assert policy == {"rule": [{"toolName": "run_shell_command", "decision": "allow", "priority": 100}]}
    for path in (gemini_dir / "settings.json", gemini_dir / "trustedFolders.json", gemini_dir / "policies" / "wb.toml"):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(run.home / "tmp").st_mode) == 0o700


# --------------------------------------------------------------------------- the parser on real transcripts


def test_simple_transcript() -> None:
    parser, _ = parse("simple.jsonl")
    assert parser.session_id == "0544521f-0cdc-4bb1-8fb2-982d45a0583c"
    assert final_text(parser) == "Hello from the mock Gemini."
    assert parser.usage == Usage(input_tokens=1500, cached_input_tokens=0, output_tokens=30)
    assert parser.tool_calls == 0 and parser.diagnostics == []
    assert parser.failure(0) is None


def test_shell_transcript_counts_the_tool_and_input_includes_the_cached_tokens() -> None:
    parser, _ = parse("shell-yolo.jsonl")
    assert parser.tool_calls == 1
    # stats: input_tokens 3000 = cached 1200 + input 1800 (docs/cli.md#results: input counts cache reads).
    assert parser.usage == Usage(input_tokens=3000, cached_input_tokens=1200, output_tokens=60)
    assert final_text(parser) == "The directory contains README.md."
    assert parser.failure(0) is None


def test_a_tool_that_was_not_registered_is_a_diagnostic_not_a_failure() -> None:
    parser, _ = parse("shell-default-approval.jsonl")
    assert parser.tool_calls == 1
    assert parser.diagnostics == [
        'run_shell_command failed: Tool "run_shell_command" not found. Did you mean one of: '
        '"update_topic", "grep_search", "invoke_agent"?'
    ]
    assert parser.failure(0) is None


def test_an_api_error_fails_with_the_exit_code_and_the_reported_message() -> None:
    parser, _ = parse("api-error-400.jsonl")
    assert parser.failure(144) == (
        'harness exited with code 144; harness reported an error: [API Error: {"error":{"code":400,'
        '"message":"API key not valid. Please pass a valid API key.","status":"INVALID_ARGUMENT"}}]'
    )
    assert parser.usage is None  # every count was zero: nothing to report
    assert final_text(parser) is None


@pytest.mark.parametrize(
    "name", ["simple.jsonl", "shell-yolo.jsonl", "shell-default-approval.jsonl", "api-error-400.jsonl"]
)
def test_the_echoed_task_is_stored_as_a_placeholder(name: str) -> None:
    original = (FIXTURES / name).read_bytes().splitlines(keepends=True)
    _, stored = parse(name)
    user = [json.loads(s) for s in stored if b'"role":"user"' in s]
    assert [u["content"] for u in user] == [TASK_PLACEHOLDER]
    task = next(json.loads(o)["content"] for o in original if b'"role":"user"' in o)
    assert all(task.encode() not in s for s in stored if b'"role":"user"' in s)
    # Every other line is stored byte for byte; the masked one keeps its other fields and newline.
    for before, after in zip(original, stored, strict=True):
        if b'"role":"user"' in before:
            assert after.endswith(b"\n")
            assert {k: v for k, v in json.loads(after).items() if k != "content"} == {
                k: v for k, v in json.loads(before).items() if k != "content"
            }
        else:
            assert after == before


# --------------------------------------------------------------------------- the terminal rule


def test_any_non_zero_exit_fails_even_after_a_success_result() -> None:
    parser, _ = parse("simple.jsonl")
    assert parser.failure(1) == "harness exited with code 1"
    assert parser.failure(143) == "harness exited with code 143"


def test_exit_zero_without_a_result_or_with_an_error_result_fails() -> None:
    parser = GeminiEvents()
    parser.feed(line({"type": "init", "session_id": "s", "model": "m"}))
    parser.feed(line({"type": "message", "role": "assistant", "content": "partial", "delta": True}))
    assert parser.failure(0) == "no terminal result event"
    parser.feed(line({"type": "result", "status": "error", "error": {"type": "x", "message": "Invalid stream"}}))
    assert parser.failure(0) == "harness reported an error: Invalid stream"


def test_malformed_lines_are_diagnostics_and_do_not_fail_a_successful_run() -> None:
    parser = GeminiEvents()
    for raw in (
        b"Warning: 256-color support not detected.\n",
        b"[1,2]\n",
        b"\n",
        *(FIXTURES / "simple.jsonl").read_bytes().splitlines(True),
    ):
        parser.feed(raw)
    assert parser.failure(0) is None
    assert parser.diagnostics == [
        "malformed event line 1: Warning: 256-color support not detected.",
        "malformed event line 2: [1,2]",
    ]


def test_the_clis_known_stderr_lines_are_not_diagnostics_nor_actions(tmp_path: Path) -> None:
    noise = [
        b"[STARTUP] Phase 'cleanup_ops' was started but never ended. Skipping metrics.\n",
        b'Error executing tool run_shell_command: Tool "run_shell_command" not found.\n',
    ]
    lines = (FIXTURES / "shell-yolo.jsonl").read_bytes().splitlines(True)
    parser = GeminiEvents()
    for raw in [*noise, *lines, b"Warning: something new\n"]:
        parser.feed(raw)
    assert parser.diagnostics == ["malformed event line 9: Warning: something new"]
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join([lines[0], *noise, *lines[1:]]))
    assert Gemini().worker_actions(path, 10) == ["ran: ls"]


def test_error_events_are_diagnostics() -> None:
    parser = GeminiEvents()
    parser.feed(line({"type": "error", "severity": "warning", "message": "Loop detected, stopping execution"}))
    assert parser.diagnostics == ["Loop detected, stopping execution"]


# --------------------------------------------------------------------------- the final message


def test_the_final_message_is_the_last_turns_deltas_concatenated() -> None:
    parser = GeminiEvents()
    for event in (
        {"type": "message", "role": "assistant", "content": "I'll list the files. ", "delta": True},
        {"type": "tool_use", "tool_name": "run_shell_command", "tool_id": "t1", "parameters": {"command": "ls"}},
        {"type": "tool_result", "tool_id": "t1", "status": "success", "output": "README.md"},
        {"type": "message", "role": "assistant", "content": "The directory ", "delta": True},
        {"type": "message", "role": "assistant", "content": "contains README.md.", "delta": True},
    ):
        parser.feed(line(event))
    assert final_text(parser) == "The directory contains README.md."


def test_the_final_message_is_bounded_in_memory_and_noted_when_cut() -> None:
    parser = GeminiEvents()
    chunk = "x" * 100_000
    for _ in range(200):  # 20 MB of deltas
        parser.feed(line({"type": "message", "role": "assistant", "content": chunk, "delta": True}))
    found = parser.final_text
    assert found is not None
    data, size = found
    assert size == 20_000_000 and len(data) <= limits.FINAL_MESSAGE_MAX_BYTES + 1 + limits.CREDENTIAL_FILE_MAX_BYTES
    text = bounded_message(data, size)
    assert text.endswith("\n[… truncated: the final message was 20000000 bytes]")


# --------------------------------------------------------------------------- worker actions


def write(tmp_path: Path, *events: dict[str, Any]) -> Path:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(line(e) for e in events))
    return path


def test_worker_actions_of_real_transcripts() -> None:
    gemini = Gemini()
    assert gemini.worker_actions(FIXTURES / "shell-yolo.jsonl", 10) == ["ran: ls"]
    assert gemini.worker_actions(FIXTURES / "shell-default-approval.jsonl", 10) == [
        'diagnostic: run_shell_command failed: Tool "run_shell_command" not found. Did you mean one of: '
        '"update_topic", "grep_search", "invoke_agent"?'
    ]
    assert gemini.worker_actions(FIXTURES / "api-error-400.jsonl", 10) == [
        'diagnostic: [API Error: {"error":{"code":400,"message":"API key not valid. Please pass a valid API key.",'
        '"status":"INVALID_ARGUMENT"}}]'
    ]
    assert gemini.worker_actions(FIXTURES / "simple.jsonl", 10) == []


def test_worker_actions_formats(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        {"type": "tool_use", "tool_name": "run_shell_command", "tool_id": "a", "parameters": {"command": "make test"}},
        {"type": "tool_result", "tool_id": "a", "status": "success", "output": "ok"},
        {"type": "tool_use", "tool_name": "write_file", "tool_id": "b", "parameters": {"file_path": "x"}},
        {"type": "tool_result", "tool_id": "b", "status": "success"},
        {"type": "tool_use", "tool_name": "replace", "tool_id": "c", "parameters": {"file_path": "x"}},
        {"type": "tool_result", "tool_id": "c", "status": "error", "error": {"type": "x", "message": "0 occurrences"}},
        {"type": "tool_use", "tool_name": "mcp_github_create_issue", "tool_id": "d", "parameters": {}},
        {"type": "tool_use", "tool_name": "read_file", "tool_id": "e", "parameters": {"file_path": "x"}},
        {"type": "error", "severity": "error", "message": "Maximum session turns exceeded"},
        {"type": "tool_use", "tool_name": "run_shell_command", "tool_id": "f", "parameters": {"command": "sleep 100"}},
    )  # fmt: skip
    assert Gemini().worker_actions(path, 10) == [
        "ran: make test",
        "changed 1 file",
        "diagnostic: 0 occurrences",  # the failed replace changed nothing
        "called github.create_issue",
        "diagnostic: Maximum session turns exceeded",
        "ran: sleep 100",  # still running: no result yet
    ]
    assert Gemini().worker_actions(path, 2) == ["diagnostic: Maximum session turns exceeded", "ran: sleep 100"]


def test_wbs_own_auto_edit_capture() -> None:
    """The stream of the real CLI started exactly as wb starts it (fixtures README)."""
    parser, stored = parse("limits-auto-edit.jsonl")
    assert parser.failure(0) is None and parser.tool_calls == 2
    assert parser.usage == Usage(input_tokens=6900, cached_input_tokens=4200, output_tokens=115)
    assert final_text(parser) == "I tried the limits."
    assert b"Probe the limits." not in b"".join(stored)
    actions = Gemini().worker_actions(FIXTURES / "limits-auto-edit.jsonl", 10)
    assert actions[0].startswith("ran: printenv GEMINI_API_KEY >/dev/null && echo key-visible")
    assert actions[1].startswith("diagnostic: write_file failed: Path not in workspace: Attempted path ")
    assert len(actions) == 2
