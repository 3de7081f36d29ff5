"""What confining a worker adds to a run's start (docs/benchmarks.md#confinement; docs/security.md#confined-runs).

Through the installed `wb` (the venv's, as a user runs it): `wb agent dispatch` of a `command`
harness whose program's first instruction writes the wall-clock time, with the profile's
`sandbox: off` and with `sandbox: auto` (bubblewrap usable here), `RUNS` runs each, interleaved.
Per run: the time from just before `wb agent dispatch` starts to that first instruction (so the
dispatch, the detached owner's start, the bubblewrap probe and the sandbox's set-up all count).
Medians per mode; the difference is what confinement adds (target: at most 30 ms).

Each pass is made once per `--branches` count: the clone starts with that many other `wb/` branches
(loose refs, as wb's runs leave them), so the figure shows whether the cost grows with the branches
of the clone (docs/benchmarks.md#confinement). Then the sandbox alone for a linked worktree of that
clone: the owner's copy of the branch's folders, and `/bin/true` in the bubblewrap command line a run
gets against `/bin/true` alone.

    python bench/confinement.py [--runs N] [--branches 0,200]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RUNS = 10
BRANCHES = "0,200"
WB = Path(sys.executable).with_name("wb")
# The program's first instruction: one `date` (a builtin would need bash), the same in both modes.
PROGRAM = "#!/bin/sh\ndate +%s%N > started-at\n"
CONFIG = """\
agents:
  profiles:
    plain: {{harness: command, command: [{program}], sandbox: "off"}}
    confined: {{harness: command, command: [{program}], sandbox: auto}}
"""


def _git(cwd: Path, *args: str, stdin: str = "") -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@example.com", "GIT_COMMITTER_NAME": "b",
           "GIT_COMMITTER_EMAIL": "b@example.com", "GIT_CONFIG_GLOBAL": "/dev/null"}  # fmt: skip
    subprocess.run(["git", *args], cwd=cwd, env=env, input=stdin.encode(), check=True, capture_output=True)


def _machine(root: Path, branches: int) -> dict[str, str]:
    home = root / "home"
    home.mkdir()
    program = root / "program.sh"
    program.write_text(PROGRAM)
    program.chmod(0o700)
    config = root / "wb.yaml"
    config.write_text(CONFIG.format(program=program))
    config.chmod(0o600)
    clone = root / "projects" / "acme" / "widget"
    clone.mkdir(parents=True)
    _git(clone, "init", "-q", "-b", "main")
    (clone / "README.md").write_text("bench\n")
    _git(clone, "add", "README.md")
    _git(clone, "commit", "-q", "-m", "initial")
    _branches(clone, branches)
    return {
        "HOME": str(home),
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "WB_CONFIG": str(config),
        "WB_HOME": str(root / "wbhome"),
        "WB_PROJECTS_ROOT": str(root / "projects"),
        "WB_COURIER": "off",
    }


def _branches(clone: Path, count: int) -> None:
    """`count` other `wb/` branches at HEAD, each a loose ref with its reflog, as a run's branch is left."""
    if count:
        lines = "".join(f"create refs/heads/wb/other{index} HEAD\n" for index in range(count))
        _git(clone, "update-ref", "--create-reflog", "--stdin", stdin=lines)


def _one(env: dict[str, str], profile: str, worktree: str) -> float:
    """Milliseconds from just before `wb agent dispatch` to the program's first instruction."""
    started = time.time_ns()
    done = subprocess.run(
        [str(WB), "agent", "dispatch", "--new-worktree", worktree, "--profile", profile, "--repo", "acme/widget",
         "--task", "bench", "--json"],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"dispatch failed: {done.stderr.strip()}")
    result = json.loads(done.stdout)
    waited = subprocess.run(
        [str(WB), "agent", "await", result["agent_id"], "--json"], env=env, capture_output=True, text=True, check=False
    )
    final = json.loads(waited.stdout)
    if final.get("state") != "completed":
        raise SystemExit(f"run {profile} ended {final.get('state')}: {final.get('failure')}")
    expected = "bwrap" if profile == "confined" else "none"
    if final["sandbox"]["kind"] != expected:
        raise SystemExit(f"profile {profile} ran with sandbox {final['sandbox']}, not {expected}")
    first = int(Path(final["worktree_dir"], "started-at").read_text())
    return (first - started) / 1e6


@dataclass
class Alone:
    """The sandbox alone, in ms (medians): what confinement adds to the owner, without wb's own start-up noise."""

    probe: float  # the bubblewrap probe's first run (once per owner)
    snapshot: float  # the copy of the own branch's folders (courier/runs/own_branch.py), before each worker
    bwrap: float  # `/bin/true` inside the sandbox a run gets, less `/bin/true` alone
    mounts: int  # bind mounts on that command line


def _sandbox_alone(root: Path, runs: int) -> Alone:
    from courier.runs import bwrap_probe, own_branch
    from courier.runs.sandbox import Plan

    clone = root / "projects" / "acme" / "widget"
    worktree = root / "alone-worktree"  # a linked worktree, as a run's: its git binds count
    _git(clone, "worktree", "add", "-q", "-b", "wb/alone", str(worktree))
    run_dir = root / "alone-run"
    plan = Plan(
        bwrap=shutil.which("bwrap") or "bwrap",
        worktree=str(worktree),
        run_dir=run_dir,
        harness_home=run_dir / "harness-home",
        wb_home=root / "wbhome",
        path_env=os.environ.get("PATH", ""),
        git=own_branch.git_dirs(str(worktree), clone_git=str(clone / ".git"), branch="wb/alone"),
    )
    plan.prepare()
    bwrap_probe._trial.cache_clear()  # once per owner: each pass measures a first one
    started = time.perf_counter()
    bwrap_probe.usable(os.environ.get("PATH"))
    probe_ms = (time.perf_counter() - started) * 1000
    direct, confined, snapshots = [], [], []
    argv: list[str] = []
    for _ in range(runs):
        plan.cleanup()  # as at a run's start: no copy of an earlier worker to remove first
        plan.prepare()
        started = time.perf_counter()
        plan.snapshot_branch()
        snapshots.append((time.perf_counter() - started) * 1000)
        argv = plan.command_line(["/bin/true"])
        for command, into in ((["/bin/true"], direct), (argv, confined)):
            started = time.perf_counter()
            subprocess.run(command, check=True)
            into.append((time.perf_counter() - started) * 1000)
    plan.cleanup()  # the last copy too (it may live in /dev/shm, not below `root`)
    mounts = sum(1 for word in argv if word.endswith("bind-try"))
    added = statistics.median(confined) - statistics.median(direct)
    return Alone(probe_ms, statistics.median(snapshots), added, mounts)


def _pass(runs: int, branches: int) -> None:
    """Both modes through `wb` and the sandbox alone, for a clone with `branches` other `wb/` branches."""
    root = Path(tempfile.mkdtemp(prefix="wb-bench-confinement-"))
    try:
        env = _machine(root, branches)
        times: dict[str, list[float]] = {"plain": [], "confined": []}
        for index in range(runs):
            for profile in ("plain", "confined"):
                times[profile].append(_one(env, profile, f"{profile}{index}"))
        off, auto = statistics.median(times["plain"]), statistics.median(times["confined"])
        print(f"{branches} other wb/ branches; dispatch to the worker's first instruction, median of {runs} (ms):")
        print(f"  sandbox: off   {off:7.1f}   (min {min(times['plain']):.1f}, max {max(times['plain']):.1f})")
        print(f"  sandbox: auto  {auto:7.1f}   (min {min(times['confined']):.1f}, max {max(times['confined']):.1f})")
        print(f"  added          {auto - off:7.1f}   (target <= 30)")
        alone = _sandbox_alone(root, 3 * runs)
        print(
            f"  the sandbox alone: the bubblewrap probe {alone.probe:.1f} ms, the branch's copy "
            f"{alone.snapshot:.1f} ms, bwrap around /bin/true +{alone.bwrap:.1f} ms ({alone.mounts} bind mounts)"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=RUNS)
    parser.add_argument("--branches", default=BRANCHES, help="comma-separated counts of other wb/ branches")
    args = parser.parse_args()
    if shutil.which("bwrap") is None:
        raise SystemExit("bubblewrap is not installed here: nothing to compare")
    for count in (int(word) for word in args.branches.split(",")):
        _pass(args.runs, count)
    return 0


if __name__ == "__main__":
    sys.exit(main())
