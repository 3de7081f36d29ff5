"""docs/supervisor-loop.sh, the supervisor's whole loop, run as written against two loopback sshd machines."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT, SshdFactory, git, make_clone, prepare_remote

from tests.integration.sshd import sshd_unavailable_reason

pytestmark = pytest.mark.skipif(sshd_unavailable_reason() is not None, reason=str(sshd_unavailable_reason()))

SCRIPT = REPO_ROOT / "docs" / "supervisor-loop.sh"
MACHINES = ("gpu-box", "build-1")


def test_the_supervisor_loop_runs_as_written(sshd: SshdFactory, tmp_path: Path) -> None:
    targets = {}
    for index, name in enumerate(MACHINES):
        server = sshd.start(f"127.0.0.{40 + index}")
        prepare_remote(server)
        with open(server.root / "remote-wb.yaml", "a") as config:  # the script's profile name
            config.write("    fast: {harness: codex, provider: mock, model: gpt-5.5}\n")
        targets[name] = sshd.target(server)
    workdir = tmp_path / "supervisor"
    workdir.mkdir()
    (workdir / "task.md").write_text("Fix the bug. scenario:complete file:fix.py\n")
    (workdir / "follow-up.md").write_text("Add a test for it. scenario:complete file:tests/test_fix.py\n")
    checkout = make_clone(workdir / "checkout")
    env = {
        "HOME": str(tmp_path),
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "WB_CONFIG": str(sshd.write_wb_config("supervisor", targets)),
        "WB_HOME": str(tmp_path / "wbhome"),
        "WB_SSH_CONFIG": str(sshd.client_config),
        "LANG": "C.UTF-8",
        "MACHINES": " ".join(MACHINES),
        "PRUNE_AFTER": "0s",
        "GIT_CONFIG_GLOBAL": "/dev/null",
    }
    done = subprocess.run(
        ["bash", str(SCRIPT)], cwd=workdir, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    for machine in MACHINES:
        # Followed live: the first run's and the continuation's actions, each ending in its state.
        followed = [line for line in lines if line.startswith(f"[{machine}] ")]
        finals = [line for line in followed if re.fullmatch(rf"\[{machine}\] {machine}:agt-[0-9a-f]{{32}} \S+", line)]
        assert [line.rsplit(" ", 1)[1] for line in finals] == ["completed", "completed"], followed
        assert f"[{machine}]   changed 1 file" in followed
        accepted = [line for line in lines if line.startswith(f"{machine}: accepted {machine}:agt-")]
        assert len(accepted) == 1 and accepted[0].endswith(": 2 files changed, +2 -0"), lines
        patch = (workdir / f"{machine}.patch").read_text()
        assert "+++ b/fix.py" in patch and "+++ b/tests/test_fix.py" in patch
        # Accepted: staged in a worktree of the supervisor's own checkout, nothing committed.
        accepted_tree = workdir / f"accepted-{machine}"
        assert git(accepted_tree, "diff", "--cached", "--name-only").split() == ["fix.py", "tests/test_fix.py"]
        assert git(accepted_tree, "rev-parse", "HEAD") == git(checkout, "rev-parse", "HEAD")
    # Prune removed the four records (two runs and two continuations) on the two machines.
    pruned = [line for line in lines if line.startswith("removed ")]
    assert pruned[-1] == "removed 4 records", lines


def test_the_readme_shows_the_loop_script_exactly() -> None:
    """The README's copy of the loop is the file the test above runs."""
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme[readme.index("## The supervisor's loop") :]
    script = (REPO_ROOT / "docs" / "supervisor-loop.sh").read_text()
    assert f"```sh\n{script}```" in section
