"""The suite runs on a user's machine as it is: what the shell that launched it or a leaky test does must not matter.

Each check runs pytest itself in a subprocess, the way a user would, with its own basetemp
(pytest prunes old basetemps, which must never be this session's).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT

from tests.cli_lookup import HARNESS_CLIS, harness_cli_dirs, locate_cli
from tests.integration.sshd import SshdFactory, sshd_unavailable_reason

CTRL_C_TESTS = [
    "tests/integration/test_local_lifecycle.py::test_ctrl_c_during_await_exits_130_and_says_the_run_continues",
]

LEAKY_SESSION = """
import gc
import subprocess


def test_leaks_a_killed_subprocess():
    child = subprocess.Popen(["sleep", "60"], stdout=subprocess.PIPE)
    child.kill()
    cycle = [child]
    cycle.append(cycle)  # only the cycle collector frees it, once this test has returned


def test_an_unrelated_later_test():
    gc.collect()  # the collector happens to run now
"""


def _pytest(
    tmp_path: Path, *args: str, shell_prefix: str = "", cwd: Path = REPO_ROOT
) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "--basetemp", str(tmp_path / "inner")]
    command = f"{shell_prefix}exec {shlex.join([*argv, *args])}"
    return subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_ctrl_c_tests_pass_when_the_suite_was_launched_with_sigint_ignored(tmp_path: Path) -> None:
    # As a non-interactive shell's background job or `trap "" INT` leaves it: SIGINT ignored, inherited across exec.
    done = _pytest(tmp_path, *CTRL_C_TESTS, shell_prefix='trap "" INT; ')
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert f"{len(CTRL_C_TESTS)} passed" in done.stdout


def test_a_leaked_subprocess_is_reported_in_its_own_test_and_the_next_test_passes(tmp_path: Path) -> None:
    session = tmp_path / "test_leaky_session.py"
    session.write_text(LEAKY_SESSION)
    # The suite's own conftest and settings (filterwarnings=error), for a test file outside the tree.
    done = _pytest(tmp_path, "-p", "tests.conftest", "-c", str(REPO_ROOT / "pyproject.toml"),
                   "--rootdir", str(tmp_path), session.name, cwd=tmp_path)  # fmt: skip
    lines = done.stdout.splitlines()
    assert "PASSED test_leaky_session.py::test_an_unrelated_later_test" in lines, done.stdout[-4000:]
    leak = "ERROR test_leaky_session.py::test_leaks_a_killed_subprocess"
    assert any(line.startswith(leak) for line in lines), done.stdout[-4000:]
    assert "ResourceWarning: subprocess" in done.stdout and "2 passed, 1 error" in done.stdout


def _fake_clis(bin_dir: Path) -> None:
    bin_dir.mkdir(parents=True)
    for name in HARNESS_CLIS:
        (bin_dir / name).write_text(f"#!/bin/sh\necho {name} from a custom prefix\n")
        (bin_dir / name).chmod(0o755)


def test_a_cli_under_npms_global_prefix_is_found_off_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prefix, npm_bin = tmp_path / "npm-global", tmp_path / "npm"
    _fake_clis(prefix / "bin")
    npm_bin.mkdir()
    (npm_bin / "npm").write_text(f"#!/bin/sh\n[ \"$*\" = 'prefix -g' ] && echo {prefix}\n")
    (npm_bin / "npm").chmod(0o755)
    monkeypatch.setenv("PATH", str(npm_bin))  # none of the CLIs on PATH, only npm
    assert locate_cli("codex") == str(prefix / "bin" / "codex")
    assert str(prefix / "bin") in harness_cli_dirs()


@pytest.mark.skipif(sshd_unavailable_reason() is not None, reason=str(sshd_unavailable_reason()))
def test_an_sshd_machine_finds_the_clis_where_the_caller_found_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    custom = tmp_path / "npm-global" / "bin"  # e.g. `npm config set prefix ~/.npm-global`, on the user's PATH
    _fake_clis(custom)
    monkeypatch.setenv("PATH", f"{custom}{os.pathsep}{os.environ['PATH']}")
    factory = SshdFactory(tmp_path / "sshd")
    try:
        server = factory.start("127.0.0.1")
        done = subprocess.run(
            ["ssh", "-F", str(factory.client_config), "-p", str(server.port), f"root@{server.host}",
             'printenv PATH; for cli in codex claude gemini; do command -v "$cli"; done'],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        factory.close()
    assert done.returncode == 0, done.stderr
    remote_path, *found = done.stdout.splitlines()
    assert str(custom) in remote_path.split(":")
    assert found == [str(custom / name) for name in HARNESS_CLIS]
