"""The issue's bar (docs/ray.md): the README's supervisor loop, unchanged, with `MACHINES=lab` against the cluster.

docs/supervisor-loop.sh is run as written by two supervisors at once, each naming only `lab`
(the cluster's head, an exec machine). Its profile `fast` needs 2 cpus, which only node w1 has:
the cluster has one slot for it. A third run holds that slot until both loops' runs are seen
`queued`; then every run and continuation completes on w1 and each loop accepts its change.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

from tests.conftest import REPO_ROOT, Machine, make_clone
from tests.integration.test_ray_executor import WAIT_S, dispatch, lab, wait_for

__all__ = ["lab"]  # the fixture, shared with test_ray_executor.py

SCRIPT = REPO_ROOT / "docs" / "supervisor-loop.sh"
LOOPS = 2


def start_loop(lab: Machine, workdir: Path) -> subprocess.Popen[str]:
    workdir.mkdir()
    (workdir / "task.md").write_text("Fix the bug. scenario:complete file:fix.py\n")
    (workdir / "follow-up.md").write_text("Add a test for it. scenario:complete file:tests/test_fix.py\n")
    make_clone(workdir / "checkout")
    env = {**lab.env, "MACHINES": "lab", "GIT_CONFIG_GLOBAL": "/dev/null"}
    return subprocess.Popen(
        ["bash", str(SCRIPT)], cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def listed(lab: Machine) -> list[dict[str, object]]:
    done = lab.wb("agent", "list", "--to", "lab", "--json", timeout=WAIT_S)
    assert done.returncode == 0, done.stderr
    results: list[dict[str, object]] = json.loads(done.stdout)
    return results


def test_the_readme_loop_unchanged_queues_then_completes_on_the_cluster(lab: Machine, tmp_path: Path) -> None:
    release = tmp_path / "release"
    blocker = dispatch(lab, "two", f"wait:{release}", "loop-blocker")  # w1's two cpus: `fast`'s only slot
    assert wait_for(lab, blocker, {"running"})["node"] == "w1"
    workdirs = [tmp_path / f"supervisor-{index}" for index in range(LOOPS)]
    loops = [start_loop(lab, workdir) for workdir in workdirs]
    try:
        deadline = time.monotonic() + WAIT_S
        while True:  # both loops dispatched, and their runs wait for the slot
            theirs = [r for r in listed(lab) if str(r["worktree"]).startswith("fix-lab-")]
            if len(theirs) == LOOPS and all(r["state"] == "queued" for r in theirs):
                break
            assert time.monotonic() < deadline and all(loop.poll() is None for loop in loops), theirs
            time.sleep(0.5)
        assert {r["queued_for"] for r in theirs} == {"cpus=2"}
        release.touch()
        outputs = [loop.communicate(timeout=3 * WAIT_S) for loop in loops]
    finally:
        release.touch()
        for loop in loops:
            if loop.poll() is None:
                loop.kill()
            loop.communicate()  # reaped and its pipes closed here, not in a later test's garbage collection
    for loop, workdir, (out, err) in zip(loops, workdirs, outputs, strict=True):
        assert loop.returncode == 0, out + err
        lines = out.splitlines()
        # The run and its continuation (the first change had no test) completed, followed as they ran.
        finals = [line for line in lines if re.fullmatch(r"\[lab\] lab:agt-[0-9a-f]{32} \S+", line)]
        assert [line.rsplit(" ", 1)[1] for line in finals] == ["completed", "completed"], out + err
        accepted = [line for line in lines if line.startswith("lab: accepted lab:agt-")]
        assert len(accepted) == 1 and accepted[0].endswith(": 2 files changed, +2 -0"), out + err
        (run,) = workdir.glob("run-*")
        patch = (run / "lab.patch").read_text()
        assert "+++ b/fix.py" in patch and "+++ b/tests/test_fix.py" in patch
    ends = {str(r["agent_id"]): r for r in listed(lab) if str(r["worktree"]).startswith("fix-lab-")}
    assert len(ends) == 2 * LOOPS  # each loop's run and its continuation
    assert {(r["state"], r["node"]) for r in ends.values()} == {("completed", "w1")}
