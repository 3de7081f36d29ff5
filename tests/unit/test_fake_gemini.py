"""The fake gemini stays faithful to the real 0.61.0 CLI: its lines have the captured shapes and its start-up checks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from courier.config import Provider
from courier.runs.harness.base import Launch
from courier.runs.harness.gemini import Gemini

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


def launch_fake(tmp_path: Path, task: str, *, prepare: bool = True) -> subprocess.CompletedProcess[str]:
    worktree = tmp_path / "w"
    worktree.mkdir(exist_ok=True)
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    provider = Provider(base_url="http://127.0.0.1:9", credential_env="K", wire_api="gemini")
    launch = Launch(str(worktree), tmp_path, home, "gemini-2.5-pro", "g", provider, "K")
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
