"""docs/supervisors.md's worked supervisor, run as written against two loopback sshd machines."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT, SshdFactory, prepare_remote

from tests.integration.sshd import sshd_unavailable_reason

pytestmark = pytest.mark.skipif(sshd_unavailable_reason() is not None, reason=str(sshd_unavailable_reason()))


def supervisor_script() -> str:
    page = (REPO_ROOT / "docs" / "supervisors.md").read_text()
    match = re.search(r"```python\n(#!/usr/bin/env python3\n.*?)```", page, re.S)
    assert match, "docs/supervisors.md has no worked supervisor"
    return match.group(1)


def test_the_documented_supervisor_runs_as_written(sshd: SshdFactory, tmp_path: Path) -> None:
    targets = {}
    for index, name in enumerate(("alpha", "beta")):
        server = sshd.start(f"127.0.0.{40 + index}")
        prepare_remote(server)
        targets[name] = sshd.target(server)
    targets["typo"] = {"host": "bad host"}  # misconfigured: the supervisor skips it, naming why
    workdir = tmp_path / "supervisor"
    workdir.mkdir()
    (workdir / "task.md").write_text("scenario:complete\n")
    (workdir / "supervise.py").write_text(supervisor_script())
    env = {
        "HOME": str(tmp_path),
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "WB_CONFIG": str(sshd.write_wb_config("documented", targets)),
        "WB_HOME": str(tmp_path / "wbhome"),
        "WB_SSH_CONFIG": str(sshd.client_config),
        "LANG": "C.UTF-8",
    }
    done = subprocess.run(
        ["python3", "supervise.py", "fake", "acme/widget", "task.md"],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, (done.stdout, done.stderr)
    lines = done.stdout.splitlines()
    assert any(line.startswith("typo skipped: ") for line in lines), lines
    for name in ("alpha", "beta"):
        assert any(re.fullmatch(rf"{name}:agt-[0-9a-f]{{32}} completed 1", line) for line in lines), lines
    assert lines[-1] == "answered: (here) alpha beta"


def test_the_documented_supervisor_stops_on_a_usage_error(sshd: SshdFactory, tmp_path: Path) -> None:
    server = sshd.start("127.0.0.42")
    prepare_remote(server)
    workdir = tmp_path / "supervisor"
    workdir.mkdir()
    (workdir / "task.md").write_text("   \n")  # blank: a usage error before anything is sent
    (workdir / "supervise.py").write_text(supervisor_script())
    env = {
        "HOME": str(tmp_path),
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "WB_CONFIG": str(sshd.write_wb_config("usage", {"only": sshd.target(server)})),
        "WB_HOME": str(tmp_path / "wbhome"),
        "WB_SSH_CONFIG": str(sshd.client_config),
        "LANG": "C.UTF-8",
    }
    done = subprocess.run(
        ["python3", "supervise.py", "fake", "acme/widget", "task.md"],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1
    assert "usage error, stopping: error: the task from task.md is blank" in done.stderr
    assert not (server.wb_home / "agents").exists() or not any((server.wb_home / "agents").iterdir())
