"""A confined run's own branch with the real bubblewrap and real git (docs/security.md#confined-runs).

The worker moves its branch in a private copy of the branch's folder (courier/runs/own_branch.py) and the
owner carries it back: a commit made inside is on the branch outside (`git rev-parse`, its reflog) while
the run goes on and when it ends, however it ends; another branch moved inside, by any means, is unchanged
outside; a branch moved outside meanwhile is not overwritten. A `command` harness probe does the git work
inside and writes what it saw into its worktree.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from conftest import Machine, git, wait_for

from courier.runs.bwrap_probe import probe

pytestmark = pytest.mark.skipif(not probe().usable, reason=f"bubblewrap is not usable here: {probe().reason}")

CONFIG = "agents:\n  profiles:\n    probe: {{harness: command, command: [{script}]}}\n"

# The task (JSON) says what to do: `commits` commits; `wait` for a file of that name in the worktree before
# each commit after the first (each commit's SHA is written to `committed-N` first); `others`, moves of
# another branch. What it saw goes to probe.json.
PROBE = """\
#!{python}
import json, os, subprocess, sys, time

task = json.loads(sys.stdin.read())
seen = {{"commits": [], "others": {{}}}}
IDENTITY = ["-c", "user.name=probe", "-c", "user.email=probe@example.com"]

def git(*args):
    done = subprocess.run(["git", *IDENTITY, *args], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(done.stderr.strip())
    return done.stdout.strip()

def wait_for_file(name):
    deadline = time.monotonic() + 60
    while not os.path.exists(name) and time.monotonic() < deadline:
        time.sleep(0.05)

def write_ref(ref, value):
    path = os.path.join(git("rev-parse", "--git-common-dir"), ref)
    with open(path, "w") as handle:
        handle.write(value + "\\n")

if task.get("switch"):  # point the worktree's HEAD at another branch, as git checkout would without its checks
    git("symbolic-ref", "HEAD", task["switch"])
for index in range(task.get("commits", 0)):
    if index and task.get("wait"):
        wait_for_file(task["wait"])
    with open("work.txt", "a") as handle:
        handle.write(f"commit {{index}}\\n")
    git("add", "work.txt")
    try:
        git("commit", "-q", "-m", f"inside {{index}}")
    except RuntimeError as exc:
        seen["commit"] = f"refused {{exc}}"
        break
    seen["commits"].append(git("rev-parse", "HEAD"))
    with open(f"committed-{{index}}", "w") as handle:
        handle.write(seen["commits"][-1])
moves = {{
    "ref-file": lambda ref, value: write_ref(ref, value),
    "update-ref": lambda ref, value: git("update-ref", ref, value),
    "branch-f": lambda ref, value: git("branch", "-f", ref[len("refs/heads/"):], value),
}}
for name, ref in task.get("others", []):
    try:
        moves[name](ref, git("rev-parse", "HEAD"))
        seen["others"][f"{{name}} {{ref}}"] = "ok"
    except Exception as exc:
        seen["others"][f"{{name}} {{ref}}"] = f"refused {{exc}}"
try:
    git("branch", "made-inside")
    seen["made"] = "ok"
except Exception as exc:
    seen["made"] = f"refused {{exc}}"
seen["status"] = git("status", "--short")
with open("probe.json", "w") as handle:
    json.dump(seen, handle)
if task.get("hang"):
    wait_for_file("never")
print(json.dumps({{"type": "wb.result", "message": "probed"}}))
"""


def _setup(machine: Machine) -> Path:
    script = machine.root / "probe.py"
    script.write_text(PROBE.format(python=os.path.realpath(sys.executable)))
    script.chmod(0o700)
    machine.write_config(CONFIG.format(script=script))
    clone = machine.clone()
    git(clone, "branch", "wb/other")  # another run's branch
    return clone


def _dispatch(machine: Machine, task: dict[str, object], *extra: str, worktree: str = "w1") -> dict[str, object]:
    where = ["--new-worktree", worktree] if "--use-worktree" not in extra else []
    done = machine.wb(
        "agent", "dispatch", *where, "--profile", "probe", "--repo", "acme/widget",
        "--task", json.dumps(task), *extra, "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    started = json.loads(done.stdout)
    assert isinstance(started, dict)
    return started


def _await(machine: Machine, ref: str) -> dict[str, object]:
    final = machine.wb_json("agent", "await", ref, "--wait-timeout", "60s")
    assert isinstance(final, dict) and final["sandbox"] == {"kind": "bwrap", "network": "provider"}, final
    return final


def _rev(clone: Path, ref: str) -> str:
    return git(clone, "rev-parse", ref).strip()


def _reflog(clone: Path, ref: str) -> list[str]:
    return git(clone, "reflog", "show", "--format=%H %gs", ref).splitlines()


@pytest.mark.parametrize("branch", ["wb/w1", "feature"])
def test_a_confined_commit_moves_its_own_branch_and_no_other(machine: Machine, branch: str) -> None:
    """A commit inside moves the run's branch outside, with a reflog line; moving another branch inside (its
    ref file written, `git update-ref`, `git branch -f`) and making a branch leave them all as they were
    outside. The same when the branch is directly in `refs/heads/` (`--branch feature`), beside `main`."""
    clone = _setup(machine)
    initial = _rev(clone, "main")
    others = [
        (how, ref)
        for ref in ("refs/heads/wb/other", "refs/heads/main")
        for how in ("ref-file", "update-ref", "branch-f")
    ]
    extra = ["--branch", branch] if branch != "wb/w1" else []
    started = _dispatch(machine, {"commits": 1, "others": others}, *extra)
    final = _await(machine, str(started["agent_id"]))
    assert final["state"] == "completed", final
    assert not final.get("harness_diagnostics"), final
    worktree = Path(str(final["worktree_dir"]))
    seen = json.loads((worktree / "probe.json").read_text())
    [commit] = seen["commits"]
    # inside, the other branch's file is written in the run's copy (git's own moves stop at its read-only
    # reflog); outside, none of it lands
    assert seen["others"]["ref-file refs/heads/wb/other"] == "ok", seen
    assert _rev(clone, branch) == commit != initial
    assert _reflog(clone, branch)[0] == f"{commit} commit: inside 0"
    assert _rev(clone, "wb/other") == initial and _rev(clone, "main") == initial
    assert len(_reflog(clone, "wb/other")) == 1 and len(_reflog(clone, "main")) == 1
    assert git(clone, "for-each-ref", "refs/heads/made-inside") == ""
    # the worktree outside is on its commit: nothing but the probe's own files is left over
    status = git(worktree, "status", "--porcelain").split("\n")
    assert sorted(line for line in status if line) == ["?? committed-0", "?? probe.json"], status


def test_the_branch_is_carried_while_the_run_goes_on_and_never_over_a_move_outside(machine: Machine) -> None:
    """The first commit is on the branch outside while the run still runs (within about a second); moved
    outside after that, the branch keeps that move: the run's second commit is not carried, and the run's
    diagnostics name it."""
    clone = _setup(machine)
    initial = _rev(clone, "main")
    started = _dispatch(machine, {"commits": 2, "wait": "go"})
    worktree = Path(str(started["worktree_dir"]))
    assert wait_for(lambda: (worktree / "committed-0").exists(), 30)
    first = (worktree / "committed-0").read_text()
    assert wait_for(lambda: _rev(clone, "wb/w1") == first, 10)
    assert machine.wb_json("agent", "status", str(started["agent_id"]))["state"] == "running"  # type: ignore[index]
    git(clone, "update-ref", "refs/heads/wb/w1", initial)  # moved outside, as a user might
    (worktree / "go").write_text("")
    final = _await(machine, str(started["agent_id"]))
    second = (worktree / "committed-1").read_text()
    assert _rev(clone, "wb/w1") == initial
    diagnostics = final.get("harness_diagnostics") or []
    assert isinstance(diagnostics, list)
    assert any(second in line and "moved outside the run" in line for line in diagnostics), final


def test_a_stopped_run_keeps_its_commit_on_its_branch(machine: Machine) -> None:
    """A run stopped on request (its worker killed) still has what it committed on its branch outside."""
    clone = _setup(machine)
    started = _dispatch(machine, {"commits": 1, "hang": True})
    worktree = Path(str(started["worktree_dir"]))
    assert wait_for(lambda: (worktree / "probe.json").exists(), 30)
    stopped = machine.wb("agent", "stop", str(started["agent_id"]))
    assert stopped.returncode == 0, stopped.stderr
    final = _await(machine, str(started["agent_id"]))
    assert final["state"] == "failed" and str(final["failure"]).startswith("stopped on request"), final
    assert _rev(clone, "wb/w1") == (worktree / "committed-0").read_text()


def test_a_head_pointed_at_another_runs_branch_does_not_make_it_the_next_runs_own(machine: Machine) -> None:
    """A worker can point its worktree's HEAD at another run's branch (the admin dir is its to write). The next
    run in that worktree (`--use-worktree`) does not take that branch as its own: it is checked out in the other
    run's worktree, so it stays read-only inside, the commit on it fails, and it is unchanged outside."""
    clone = _setup(machine)
    other = _await(machine, str(_dispatch(machine, {}, worktree="w0")["agent_id"]))
    assert other["state"] == "completed", other
    initial = _rev(clone, "wb/w0")
    first = _await(machine, str(_dispatch(machine, {"switch": "refs/heads/wb/w0"})["agent_id"]))
    assert first["state"] == "completed", first
    assert git(Path(str(first["worktree_dir"])), "symbolic-ref", "HEAD").strip() == "refs/heads/wb/w0"
    second = _await(machine, str(_dispatch(machine, {"commits": 1}, "--use-worktree", "w1")["agent_id"]))
    seen = json.loads((Path(str(second["worktree_dir"])) / "probe.json").read_text())
    assert seen["commits"] == [] and seen["commit"].startswith("refused"), seen
    assert _rev(clone, "wb/w0") == initial
