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


def _machines(sshd: SshdFactory, first_address: int) -> tuple[dict[str, dict[str, object]], dict[str, Path]]:
    """Two loopback machines with the script's profile: (their targets, their canonical clones)."""
    targets = {}
    clones = {}
    for index, name in enumerate(MACHINES):
        server = sshd.start(f"127.0.0.{first_address + index}")
        prepare_remote(server)
        with open(server.root / "remote-wb.yaml", "a") as config:  # the script's profile name
            config.write("    fast: {harness: codex, provider: mock, model: gpt-5.5}\n")
        targets[name] = sshd.target(server)
        clones[name] = server.projects_root / "acme" / "widget"
    return targets, clones


def _run_script(
    sshd: SshdFactory, tmp_path: Path, targets: dict[str, dict[str, object]], machines: str
) -> subprocess.CompletedProcess[str]:
    workdir = tmp_path / "supervisor"
    if not workdir.exists():
        workdir.mkdir()
        (workdir / "task.md").write_text("Fix the bug. scenario:complete file:fix.py\n")
        (workdir / "follow-up.md").write_text("Add a test for it. scenario:complete file:tests/test_fix.py\n")
        make_clone(workdir / "checkout")
    env = {
        "HOME": str(tmp_path),
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "WB_CONFIG": str(sshd.write_wb_config(f"supervisor-{tmp_path.name}", targets)),
        "WB_HOME": str(tmp_path / "wbhome"),
        "WB_SSH_CONFIG": str(sshd.client_config),
        "LANG": "C.UTF-8",
        "MACHINES": machines,
        "PRUNE_AFTER": "0s",
        "GIT_CONFIG_GLOBAL": "/dev/null",
    }
    return subprocess.run(["bash", str(SCRIPT)], cwd=workdir, env=env, capture_output=True, text=True, timeout=600)


def _accepted(workdir: Path, run: Path, lines: list[str], machine: str) -> None:
    """The machine's work was followed, continued and accepted into the script run's directory `run`."""
    followed = [line for line in lines if line.startswith(f"[{machine}] ")]
    finals = [line for line in followed if re.fullmatch(rf"\[{machine}\] {machine}:agt-[0-9a-f]{{32}} \S+", line)]
    assert [line.rsplit(" ", 1)[1] for line in finals] == ["completed", "completed"], followed
    assert f"[{machine}]   changed 1 file" in followed
    accepted = [line for line in lines if line.startswith(f"{machine}: accepted {machine}:agt-")]
    assert len(accepted) == 1 and accepted[0].endswith(": 2 files changed, +2 -0"), lines
    patch = (run / f"{machine}.patch").read_text()
    assert "+++ b/fix.py" in patch and "+++ b/tests/test_fix.py" in patch
    # Accepted: staged in a worktree of the supervisor's own checkout, nothing committed.
    accepted_tree = run / f"accepted-{machine}"
    assert git(accepted_tree, "diff", "--cached", "--name-only").split() == ["fix.py", "tests/test_fix.py"]
    assert git(accepted_tree, "rev-parse", "HEAD") == git(workdir / "checkout", "rev-parse", "HEAD")


def _nothing_left_there(clone: Path) -> None:
    """The script cleaned up after itself: no wb worktree and no wb/ branch on the machine."""
    assert git(clone, "worktree", "list", "--porcelain").count("worktree ") == 1  # the clone itself
    assert git(clone, "branch", "--list", "wb/*").strip() == ""


def test_the_supervisor_loop_runs_as_written_twice_in_a_row(sshd: SshdFactory, tmp_path: Path) -> None:
    targets, clones = _machines(sshd, 40)
    workdir = tmp_path / "supervisor"
    for attempt in (1, 2):
        done = _run_script(sshd, tmp_path, targets, " ".join(MACHINES))
        assert done.returncode == 0, f"run {attempt}: {done.stdout}{done.stderr}"
        lines = done.stdout.splitlines()
        runs = sorted(workdir.glob("run-*"))
        assert len(runs) == attempt
        for machine in MACHINES:
            _accepted(workdir, runs[-1], lines, machine)
            _nothing_left_there(clones[machine])
        # Prune removed the four records (two runs and two continuations) and their two worktrees.
        assert lines[-1] == "removed 4 records and 2 worktrees", lines
        assert len([line for line in lines if line.startswith("removed worktree ")]) == 2


def test_a_failed_dispatch_is_named_and_the_loop_goes_on(sshd: SshdFactory, tmp_path: Path) -> None:
    targets, clones = _machines(sshd, 50)
    done = _run_script(sshd, tmp_path, targets, "gpu-box nowhere")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert 'error: unknown machine "nowhere"' in done.stderr, done.stderr
    lines = done.stdout.splitlines()
    assert "nowhere: not dispatched (the reason is above)" in lines
    (run,) = (tmp_path / "supervisor").glob("run-*")
    _accepted(tmp_path / "supervisor", run, lines, "gpu-box")
    assert lines[-1] == "removed 2 records and 1 worktree", lines
    _nothing_left_there(clones["gpu-box"])


def test_a_machine_down_at_prune_time_is_named_and_the_loop_still_exits_0(sshd: SshdFactory, tmp_path: Path) -> None:
    """Both machines' work accepted, a third configured machine down when step 6 prunes every
    machine: the loop names it, prunes the others and exits 0, as a failed dispatch does."""
    targets, clones = _machines(sshd, 60)
    gone = sshd.start("127.0.0.62")
    targets["gone"] = sshd.target(gone)
    gone.stop()
    done = _run_script(sshd, tmp_path, targets, " ".join(MACHINES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stdout.splitlines()
    (run,) = (tmp_path / "supervisor").glob("run-*")
    for machine in MACHINES:
        _accepted(tmp_path / "supervisor", run, lines, machine)
        _nothing_left_there(clones[machine])
    assert "gone: not pruned (the reason is above); the next run prunes it" in lines, lines
    assert "removed 4 records and 2 worktrees" in lines, lines
    assert any(line.startswith("warning: gone") for line in done.stderr.splitlines()), done.stderr


def test_the_supervisors_doc_shows_the_loop_script_exactly() -> None:
    """docs/supervisors.md's copy of the loop is the file the test above runs."""
    doc = (REPO_ROOT / "docs" / "supervisors.md").read_text()
    section = doc[doc.index("## The supervisor's loop") :]
    script = (REPO_ROOT / "docs" / "supervisor-loop.sh").read_text()
    assert f"```sh\n{script}```" in section
