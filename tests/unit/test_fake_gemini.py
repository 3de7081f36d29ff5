"""The fake gemini stays faithful to the real 0.61.0 CLI: its lines have the captured shapes and its start-up checks."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from courier.config import Provider
from courier.runs.harness.gemini import Gemini
from courier.runs.harness.interface import Launch

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "fakes" / "gemini"
FIXTURES = ROOT / "fixtures" / "gemini-cli-0.61.0"


def shapes(lines: list[str]) -> dict[tuple[str, str], set[str]]:
    """(type, role or status) → the keys its events carry."""
    found: dict[tuple[str, str], set[str]] = {}
    for line in lines:
        event: dict[str, Any] = json.loads(line)
        kind = (event["type"], str(event.get("role") or event.get("status") or ""))
        found.setdefault(kind, set()).update(event)
    return found


def launch_fake(
    tmp_path: Path, task: str, *, prepare: bool = True, resume: str | None = None
) -> subprocess.CompletedProcess[str]:
    worktree = tmp_path / "w"
    worktree.mkdir(exist_ok=True)
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    provider = Provider(base_url="http://127.0.0.1:9", credential_env="K", wire_api="gemini")
    launch = Launch(str(worktree), tmp_path, home, "gemini-2.5-pro", "g", provider, "K", resume_session=resume)
    gemini = Gemini()
    if prepare:
        gemini.prepare_home(launch)
    env = gemini.environment(launch, {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "K": "sk-x"})
    argv = [sys.executable, str(FAKE), *gemini.argv(launch)[1:]]
    return subprocess.run(argv, input=task, capture_output=True, text=True, cwd=worktree, env=env, timeout=60)


def test_the_fakes_lines_have_the_real_shapes(tmp_path: Path) -> None:
    real = shapes((FIXTURES / "limits-auto-edit.jsonl").read_text().splitlines())
    real.update(shapes((FIXTURES / "api-error-400.jsonl").read_text().splitlines()))
    done = launch_fake(tmp_path, "scenario:complete")
    assert done.returncode == 0, done.stderr
    fake = shapes(done.stdout.splitlines())
    assert fake.keys() <= real.keys()
    for kind, keys in fake.items():
        # tool_result: the real one carries `output` only when there is some; `error` only on errors.
        assert keys <= real[kind], (kind, keys - real[kind])
    assert (tmp_path / "w" / "hello.txt").read_text() == "hello from the fake gemini\n"
    failed = launch_fake(tmp_path, "scenario:fail")
    assert failed.returncode == 144
    assert shapes(failed.stdout.splitlines())[("result", "error")] == real[("result", "error")]


def test_the_fake_checks_trust_and_auth_as_the_cli_does(tmp_path: Path) -> None:
    done = launch_fake(tmp_path, "scenario:complete", prepare=False)
    assert done.returncode == 55 and "not running in a trusted directory" in done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize(("settings", "message"), [({}, "Invalid auth method selected.")])
def test_the_fake_refuses_the_gateway_auth_the_base_url_selects_alone(
    tmp_path: Path, settings: dict[str, Any], message: str
) -> None:
    launch_fake(tmp_path, "scenario:complete")  # prepares the home
    (tmp_path / "home" / ".gemini" / "settings.json").write_text(json.dumps(settings))
    done = launch_fake(tmp_path, "scenario:complete", prepare=False)
    assert done.returncode == 41 and message in done.stderr


def test_the_fake_resumes_a_session_of_its_home_by_id_and_fails_as_the_cli_does_without_it(tmp_path: Path) -> None:
    """As 0.61.0: `--resume <uuid>` finds the session in `$GEMINI_CLI_HOME`; an unknown one exits 42, no stdout."""
    first = launch_fake(tmp_path, "scenario:complete")
    assert first.returncode == 0, first.stderr
    session = json.loads(first.stdout.splitlines()[0])["session_id"]
    (chats,) = (tmp_path / "home" / ".gemini" / "tmp").glob("*/chats")
    assert [p.name.endswith(f"-{session[:8]}.jsonl") for p in chats.iterdir()] == [True]

    again = launch_fake(tmp_path, "scenario:complete file:second.txt", resume=session)
    assert again.returncode == 0, again.stderr
    lines = [json.loads(line) for line in again.stdout.splitlines()]
    assert lines[0]["type"] == "init" and lines[0]["session_id"] == session
    final = "".join(e["content"] for e in lines if e["type"] == "message" and e["role"] == "assistant")
    assert final == f"resumed {session} after 1 earlier turn(s); created second.txt."

    other = "0b0b0b0b-0000-4000-8000-000000000000"
    unknown = launch_fake(tmp_path, "scenario:complete", resume=other)
    assert unknown.returncode == 42 and unknown.stdout == ""
    assert f'Error resuming session: Invalid session identifier "{other}".' in unknown.stderr
    shutil.rmtree(chats)
    empty = launch_fake(tmp_path, "scenario:complete", resume=session)
    assert empty.returncode == 42 and empty.stdout == ""
    assert "Error resuming session: No previous sessions found for this project." in empty.stderr
