"""End to end with the real Codex CLI (@openai/codex 0.169.0) against the in-suite model server.

`wb agent dispatch` runs here, on this machine, with a profile whose provider points at
`courier.demo.model_server.ModelServer`; the real `codex` (installed by scripts/install-codex.sh,
which .ci/run calls) is first on PATH and tests/fakes is not on it at all. Without it these
tests skip saying why, except under CI (CI=true), where they fail. What the real binary
did, and the limits checked here, are written up in docs/codex-notes.md.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import CREDENTIAL_ENV, CREDENTIAL_VALUE, FAKES, Machine, git, require_cli

from courier.demo.model_server import (
    COMMIT_MESSAGE,
    FAIL_MESSAGE,
    HELLO_CONTENT,
    HELLO_PATH,
    NETWORK_MESSAGE,
    WRITE_FILE_LIST_COMMAND,
    WRITE_FILE_MESSAGE,
    ModelServer,
    TokenUsage,
)

pytestmark = pytest.mark.e2e

CODEX_VERSION = "0.169.0"
MODEL = "gpt-5.5"  # in Codex's bundled catalogue: full tool set (apply_patch), no fallback-metadata warning


def _real_codex_dirs() -> list[str]:
    """Directories holding the real `codex` and `node`; a skip naming the install step (a failure under CI)."""
    return require_cli("codex", CODEX_VERSION, install="run `bash scripts/install-codex.sh`").dirs


@pytest.fixture(scope="module")
def codex_dirs() -> list[str]:
    return _real_codex_dirs()


@pytest.fixture(scope="module")
def server() -> Iterator[ModelServer]:
    with ModelServer() as running:
        yield running


def _config(server: ModelServer) -> str:
    """One provider and one profile per scenario; `network-open` is the network scenario with network: true."""
    providers, profiles = [], []
    for name, scenario, network in (
        ("write-file", "write-file", False),
        ("fail", "fail", False),
        ("http-500", "http-500", False),
        ("commit", "commit", False),
        ("network", "network", False),
        ("network-open", "network", True),
    ):
        providers.append(
            f"    {name}:\n"
            f"      base_url: {server.base_url_for(scenario)}\n"
            f"      credential_env: {CREDENTIAL_ENV}\n"
            "      wire_api: responses\n"
            "      request_max_retries: 0\n"
            "      stream_max_retries: 0\n"
        )
        profiles.append(
            f"    {name}:\n"
            "      harness: codex\n"
            f"      provider: {name}\n"
            f"      model: {MODEL}\n"
            "      reasoning: high\n"
            f"      network: {'true' if network else 'false'}\n"
        )
    return "agents:\n  providers:\n" + "".join(providers) + "  profiles:\n" + "".join(profiles)


@pytest.fixture
def real(machine: Machine, server: ModelServer, codex_dirs: list[str]) -> Machine:
    """The `machine` fixture with the real codex first on PATH, tests/fakes gone, and the scenario profiles."""
    kept = [d for d in machine.env["PATH"].split(os.pathsep) if d and Path(d).resolve() != FAKES.resolve()]
    machine.env["PATH"] = os.pathsep.join([*codex_dirs, *(d for d in kept if d not in codex_dirs)])
    found = shutil.which("codex", path=machine.env["PATH"])
    assert found is not None and Path(found).parent != FAKES
    machine.write_config(_config(server))
    machine.clone()
    return machine


def _run(machine: Machine, profile: str, worktree: str, task: str = "Do the scripted task.") -> dict[str, object]:
    """Dispatch, await (≤ 60 s) and return the `--json` result."""
    done = machine.wb("agent", "dispatch", "--new-worktree", worktree, "--profile", profile,
                      "--repo", "acme/widget", "--task", task)
    assert done.returncode == 0, done.stderr
    ref = done.stdout.split()[0]
    waited = machine.wb("agent", "await", ref, "--wait-timeout", "60s", "--json", timeout=90)
    assert waited.returncode == 0, waited.stderr
    result: dict[str, object] = json.loads(waited.stdout)
    return result


def _events(result: dict[str, object]) -> list[dict[str, object]]:
    """The transcript's JSON events. Codex's stderr is merged into it (docs/runs.md#the-owner): skip its text lines."""
    text = Path(str(result["log_path"])).read_text()
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def _thread_id(result: dict[str, object]) -> str:
    return next(str(e["thread_id"]) for e in _events(result) if e.get("type") == "thread.started")


def _logs(machine: Machine, result: dict[str, object]) -> list[str]:
    done = machine.wb("agent", "logs", str(result["agent_id"]))
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()[1:]


def _usage(result: dict[str, object]) -> dict[str, int]:
    usage = result["usage"]
    assert isinstance(usage, dict)
    return {key: int(value) for key, value in usage.items() if value is not None}


def _expected_usage(reported: TokenUsage) -> dict[str, int]:
    # Codex's turn.completed usage is the thread's running total: the sum of every response's
    # usage, with cache_write_input_tokens 0 (the Responses API reported none).
    return {**reported.as_dict(), "cache_write_input_tokens": 0}


def test_a_real_codex_run_writes_the_file_and_reports_the_facts(real: Machine, server: ModelServer) -> None:
    result = _run(real, "write-file", "w1")

    assert result["state"] == "completed", result
    assert result["exit_code"] == 0 and "failure" not in result  # --json omits absent fields
    assert result["result"] == WRITE_FILE_MESSAGE
    worktree = Path(str(result["worktree_dir"]))
    assert (worktree / HELLO_PATH).read_text() == HELLO_CONTENT
    changes = result["changes"]
    assert isinstance(changes, dict)
    assert changes["files_changed"] == 1 and changes["files"] == [HELLO_PATH]
    assert not changes.get("commits")
    assert result["tool_calls"] == 2  # the ls command and the apply_patch file change

    thread = _thread_id(result)
    served = [r for r in server.served if r.thread == thread]
    assert [r.step for r in served] == [0, 1, 2]  # ls, apply_patch, final message
    assert _usage(result) == _expected_usage(server.usage_reported(thread=thread))

    lines = _logs(real, result)
    assert f"  ran: /bin/bash -lc {WRITE_FILE_LIST_COMMAND}" in lines
    assert "  changed 1 file" in lines
    # Codex's first stderr line (its prompt comes on stdin) is neither an action nor a diagnostic.
    assert not any("Reading additional input" in line for line in lines), lines

    # Codex sent the provider's credential as a bearer token; wb stored it nowhere.
    posts = [r for r in server.requests if r.method == "POST" and isinstance(r.body, dict)
             and r.body.get("prompt_cache_key") == thread]
    assert posts and all(r.headers.get("authorization") == f"Bearer {CREDENTIAL_VALUE}" for r in posts)
    assert all(r.body["model"] == MODEL and r.body["reasoning"] == {"effort": "high"} for r in posts)
    assert CREDENTIAL_VALUE not in Path(str(result["log_path"])).read_text()

    # Besides its stdin notice, Codex's only stderr line is a warning when CODEX_HOME (<run>/harness-home)
    # is under /tmp, as pytest's tmp_path is. The owner merges stderr into the transcript, so it is a
    # malformed-line diagnostic.
    diagnostics = result.get("harness_diagnostics") or []
    assert isinstance(diagnostics, list)
    for diagnostic in diagnostics:
        assert "WARNING: proceeding, even though we could not create PATH aliases" in diagnostic


def test_a_model_failure_ends_the_run_failed_with_the_harness_message(real: Machine, server: ModelServer) -> None:
    result = _run(real, "fail", "w1")
    assert len([r for r in server.served if r.thread == _thread_id(result)]) == 1  # retries 0: one request
    assert result["state"] == "failed" and result["exit_code"] == 1
    # Codex wraps a response.failed event as a stream failure.
    assert result["failure"] == (
        "harness exited with code 1; harness reported a failed turn: "
        f"stream disconnected before completion: {FAIL_MESSAGE}"
    )
    assert "result" not in result and "usage" not in result
    assert int(result["duration_ms"]) < 30_000  # type: ignore[call-overload]


def test_an_http_500_ends_the_run_failed_with_codexs_generic_message(real: Machine, server: ModelServer) -> None:
    result = _run(real, "http-500", "w1")
    assert len([r for r in server.served if r.thread == _thread_id(result)]) == 1
    assert result["state"] == "failed" and result["exit_code"] == 1
    failure = str(result["failure"])
    assert failure.startswith("harness exited with code 1; harness reported a failed turn: ")
    # Codex 0.169.0 does not pass a 5xx body on: it says "We’re currently experiencing high demand, …".
    assert FAIL_MESSAGE not in failure and "high demand" in failure


def test_the_worker_cannot_commit_in_a_linked_worktree(real: Machine, server: ModelServer) -> None:
    """Limits 1 and 2 of docs/codex-notes.md#the-known-limits-of-the-sandbox: the git dir is read-only to the sandbox;
    a denial is as Codex reports it."""
    result = _run(real, "commit", "w1")
    assert result["state"] == "completed" and result["result"] == COMMIT_MESSAGE

    worktree = Path(str(result["worktree_dir"]))
    assert git(worktree, "rev-parse", "HEAD").strip() == result["base_sha"]  # no new commit
    changes = result["changes"]
    assert isinstance(changes, dict)
    assert not changes.get("commits")
    assert changes["files"] == ["committed.txt"]  # the echo (inside the worktree) did run

    # The sandbox denied `git add` (index.lock in <clone>/.git/worktrees/w1 is read-only). Codex
    # 0.169.0 has been seen both emitting no command_execution item for it and emitting one with
    # the denial: wb counts exactly what the stream reported, as tool calls and `ran:` lines.
    items = [e for e in _events(result) if e.get("type") == "item.completed"]
    commands = [e for e in items if e["item"].get("type") == "command_execution"]
    assert result["tool_calls"] == len(commands) <= 1
    assert len([line for line in _logs(real, result) if line.startswith("  ran:")]) == len(commands)

    # The model did get the denial back as the tool output.
    thread = _thread_id(result)
    last = [r for r in server.requests if isinstance(r.body, dict) and r.body.get("prompt_cache_key") == thread][-1]
    output = next(i["output"] for i in last.body["input"] if i.get("type") == "function_call_output")
    assert "index.lock': Read-only file system" in output and "exited with code 128" in output


def test_commands_have_no_network_unless_the_profile_allows_it(real: Machine, server: ModelServer) -> None:
    """Limit 3 of docs/codex-notes.md#the-known-limits-of-the-sandbox, checked on loopback (the sandbox blocks it
    too)."""
    before = server.pings()
    closed = _run(real, "network", "w1")
    assert closed["state"] == "completed" and closed["result"] == NETWORK_MESSAGE
    assert server.pings() == before  # the sandbox refused the socket: nothing reached the server
    # Codex 0.169.0 reports a sandbox-denied command inconsistently: seen both with no event at
    # all and with a command_execution item carrying the denial. wb counts what was reported.
    ran = [line for line in _logs(real, closed) if line.startswith("  ran:")]
    assert closed["tool_calls"] == len(ran) and len(ran) in (0, 1)
    thread = _thread_id(closed)
    last = [r for r in server.requests if isinstance(r.body, dict) and r.body.get("prompt_cache_key") == thread][-1]
    output = next(i["output"] for i in last.body["input"] if i.get("type") == "function_call_output")
    assert "socket: Operation not permitted" in output

    opened = _run(real, "network-open", "w2")
    assert opened["state"] == "completed" and opened["result"] == NETWORK_MESSAGE
    assert server.pings() == before + 1  # with network: true the command's GET /ping arrived
    assert opened["tool_calls"] == 1
    assert any(line.startswith("  ran: /bin/bash -lc ") and "/dev/tcp/127.0.0.1/" in line
               for line in _logs(real, opened))


def test_continue_resumes_the_real_codex_session_and_the_model_sees_the_earlier_turn(
    real: Machine, server: ModelServer
) -> None:
    """Continue (docs/cli.md, wb agent continue) with the real binary: `codex exec … resume <thread> -` from a copy
    of the parent's home."""
    first = _run(real, "write-file", "w1", task="Do the scripted task. first-turn-marker-7a1c")
    assert first["state"] == "completed", first
    thread = _thread_id(first)
    assert first["session_id"] == thread
    parent_home = Path(str(first["log_path"])).parent / "harness-home"
    sessions = [path for path in parent_home.rglob("*.jsonl") if "sessions" in path.parts]
    assert sessions, "Codex kept no session file in the run's private home"
    before = len(server.requests)

    done = real.wb("agent", "continue", str(first["agent_id"]), "--task", "Say it once more. second-turn-marker-4b2e")
    assert done.returncode == 0, done.stderr
    child = done.stdout.split()[0]
    waited = real.wb("agent", "await", child, "--wait-timeout", "60s", "--json", timeout=90)
    assert waited.returncode == 0, waited.stderr
    second = json.loads(waited.stdout)
    assert second["state"] == "completed", second
    assert second["parent_id"] == first["agent_id"] and second["session_id"] == thread
    assert second["worktree_dir"] == first["worktree_dir"]

    resumed = [
        r for r in server.requests[before:]
        if r.method == "POST" and isinstance(r.body, dict) and r.body.get("prompt_cache_key") == thread
    ]  # fmt: skip
    assert resumed, "the resumed run sent nothing on the parent's thread"
    sent = json.dumps(resumed[0].body["input"])
    assert "first-turn-marker-7a1c" in sent and "second-turn-marker-4b2e" in sent  # the earlier turn came along
    assert sent.index("first-turn-marker-7a1c") < sent.index("second-turn-marker-4b2e")

    home = Path(str(second["log_path"])).parent / "harness-home"
    for path in [home, *home.rglob("*")]:
        if path.is_symlink():
            continue
        mode = path.stat().st_mode & 0o777
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))
