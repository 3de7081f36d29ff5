"""The e2e tier as pytest runs it on a machine without the real Codex: skipped with the reason, failed under CI."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT

# A pytest run of the e2e tier whose every test skips or fails before starting wb: one courier pass
# runs this module (tests/conftest.py).
pytestmark = pytest.mark.courier_independent


def _run_tier(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PATH"] = str(tmp_path)  # no codex, no npm
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rsf", "-q",
         "tests/e2e/test_real_codex.py", "tests/e2e/test_real_codex_remote.py", "--basetemp", str(tmp_path / "t")],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_without_codex_the_e2e_tier_skips_saying_why(tmp_path: Path) -> None:
    done = _run_tier(tmp_path, None)
    assert done.returncode == 0, done.stdout[-3000:]
    summary = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"\d+ skipped in .*", summary), summary  # every test of the tier, nothing else
    assert "the real codex CLI (0.169.0) is not installed: run `bash scripts/install-codex.sh`" in done.stdout


def test_under_ci_a_missing_codex_fails_the_e2e_tier(tmp_path: Path) -> None:
    done = _run_tier(tmp_path, "true")
    assert done.returncode == 1, done.stdout[-3000:]
    summary = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"\d+ errors? in .*", summary), summary  # every test of the tier fails, none skips
    assert "is not installed: run `bash scripts/install-codex.sh` (CI is set" in done.stdout


def test_under_ci_any_skip_outside_the_docker_tier_fails(tmp_path: Path) -> None:
    """A missing prerequisite (sshd, root, a CLI) may not turn a tier green by skipping it under CI."""
    (tmp_path / "test_prerequisite.py").write_text(
        "import pytest\n\n"
        "def test_needs_a_frobnicator():\n    pytest.skip('no frobnicator here')\n\n"
        "@pytest.mark.docker\ndef test_needs_docker():\n    pytest.skip('no reachable Docker engine')\n"
    )
    env = {**os.environ, "CI": "true", "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{REPO_ROOT / 'tests'}"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "conftest", "-rsf", "-q",
         "--rootdir", str(tmp_path), "-c", str(REPO_ROOT / "pyproject.toml"), str(tmp_path / "test_prerequisite.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout[-3000:]
    assert "skipped under CI, which must run every tier: Skipped: no frobnicator here" in done.stdout
    assert done.stdout.strip().splitlines()[-1].startswith("1 failed, 1 skipped")
