"""The README's supervisor pattern, run as written against three loopback sshd machines."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FAKES, REPO_ROOT, SshdFactory, prepare_remote

from tests.integration.sshd import sshd_unavailable_reason

pytestmark = pytest.mark.skipif(sshd_unavailable_reason() is not None, reason=str(sshd_unavailable_reason()))

README_MACHINES = ("gpu-box", "build-1", "build-2")


def supervisor_script() -> str:
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme[readme.index("## The supervisor pattern") :]
    match = re.search(r"```sh\n(#!/usr/bin/env bash\n.*?)```", section, re.S)
    assert match, "the README's supervisor script is missing"
    return match.group(1)


def run_supervisor_script(
    sshd: SshdFactory, tmp_path: Path, targets: dict[str, dict[str, object]], name: str
) -> tuple[Path, dict[str, str], list[str]]:
    """Run the README's script as written over `targets`; (its directory, its environment, its stdout lines)."""
    workdir = tmp_path / "supervisor"
    workdir.mkdir(exist_ok=True)
    (workdir / "task.md").write_text("scenario:complete\n")
    (workdir / "supervise.sh").write_text(supervisor_script())
    env = {
        "HOME": str(tmp_path),
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "WB_CONFIG": str(sshd.write_wb_config(name, targets)),
        "WB_HOME": str(tmp_path / "wbhome"),
        "WB_SSH_CONFIG": str(sshd.client_config),
        "LANG": "C.UTF-8",
    }
    done = subprocess.run(["bash", "supervise.sh"], cwd=workdir, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return workdir, env, done.stdout.splitlines()


def test_the_readme_supervisor_script_runs_as_written(sshd: SshdFactory, tmp_path: Path) -> None:
    targets = {}
    for index, name in enumerate(README_MACHINES):
        server = sshd.start(f"127.0.0.{30 + index}")
        prepare_remote(server)
        with open(server.root / "remote-wb.yaml", "a") as config:  # the README's profile name
            config.write("    fast: {harness: codex, provider: mock, model: gpt-5.5}\n")
        targets[name] = sshd.target(server)
    for attempt in (1, 2):  # as written, twice in a row: the second run's worktrees are its own
        workdir, _, lines = run_supervisor_script(sshd, tmp_path, targets, "supervisor")
        assert "(here) ok" in lines
        for name in README_MACHINES:
            assert f"{name} ok" in lines
            completed = [line for line in lines if re.fullmatch(rf"{name} agt-[0-9a-f]{{32}} completed 1", line)]
            assert len(completed) == attempt, lines
        assert len(list(workdir.glob("result-*.json"))) == 3 * attempt


def test_the_same_script_runs_a_codex_a_claude_and_a_gemini_profile(sshd: SshdFactory, tmp_path: Path) -> None:
    """Issue 12's bar: the script unchanged, one `fast` profile per machine, each a different harness."""
    profiles = {
        "gpu-box": "    fast: {harness: codex, provider: mock, model: gpt-5.5}\n",
        "build-1": "    fast: {harness: claude, provider: anth, model: claude-sonnet-4-5}\n",
        "build-2": "    fast: {harness: gemini, provider: gem, model: gemini-2.5-pro}\n",
    }
    targets = {}
    for index, name in enumerate(README_MACHINES):
        server = sshd.start(f"127.0.0.{40 + index}")
        prepare_remote(server)
        for fake in ("claude", "gemini"):
            shutil.copy(FAKES / fake, server.bin_dir / fake)
        config = (server.root / "remote-wb.yaml").read_text()
        credential = re.search(r"credential_file: (\S+)", config)
        assert credential is not None
        source = f"base_url: 'http://127.0.0.1:9', credential_file: {credential.group(1)}"
        more = f"    anth: {{{source}, wire_api: anthropic}}\n    gem: {{{source}, wire_api: gemini}}\n"
        config = config.replace("  profiles:\n", more + "  profiles:\n") + profiles[name]
        (server.root / "remote-wb.yaml").write_text(config)
        targets[name] = sshd.target(server)
    workdir, _, lines = run_supervisor_script(sshd, tmp_path, targets, "supervisor3")
    for name in README_MACHINES:
        assert f"{name} ok" in lines
        assert any(re.fullmatch(rf"{name} agt-[0-9a-f]{{32}} completed 1", line) for line in lines), lines
    harnesses = {
        json.loads(path.read_text())["machine"]: json.loads(path.read_text())["resolved"]["harness"]
        for path in workdir.glob("result-*.json")
    }
    assert harnesses == {"gpu-box": "codex", "build-1": "claude", "build-2": "gemini"}
