"""Benchmark — `wb agent watch` latency (docs/benchmarks.md#watch; docs/cli.md, wb agent watch: each change printed
within 2 s).

Three loopback exec machines (`env WB_HOME=… wb`, each a home, a clone and the fake codex of
its own). `wb agent watch --all --json --until-idle` is started while one seed run waits, then
a ten-run fan-out is dispatched across the three machines (`scenario:slow`), and the seed is
released. An observer thread reads each machine's records every 20 ms and notes when each run
appeared, got its worker and became terminal; the latency of a transition is from that moment
to the moment its line arrived on watch's stdout (so it is at most 20 ms short). Then the
receiver's CPU: with ten live runs that change nothing, the CPU time the machines' receivers
(their serve processes with the courier, else the one-call receivers) spend waiting over 10 s.

    python bench/watch_latency.py            # WB_COURIER as set (default on)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil
import yaml

from bench import common
from tests.conftest import FAKES, REMOTE_CONFIG, Machine, make_clone, make_machine

MACHINES = ("m1", "m2", "m3")
RUNS = 10
OBSERVE_S = 0.02
IDLE_WINDOW_S = 10.0


def _box(base: Path, name: str) -> tuple[Machine, dict[str, Any]]:
    box = make_machine(base / name)
    make_clone(box.projects / "acme" / "widget")
    credential = box.root / "credential"
    credential.write_text("sk-bench-box-credential-0d4f7c1e")
    credential.chmod(0o600)
    box.write_config(REMOTE_CONFIG.format(credential=credential))
    argv = [
        "env", f"WB_HOME={box.home}", f"WB_CONFIG={box.config_path}", f"WB_PROJECTS_ROOT={box.projects}",
        f"PATH={FAKES}:{Path(sys.executable).parent}:/usr/bin:/bin", f"PYTHONPATH={common.REPO_ROOT}",
    ]  # fmt: skip
    return box, {"exec": {"argv": argv, "wb_path": common.WB}}


def _dispatch(caller: Machine, machine: str, task: str, worktree: str) -> str:
    done = caller.wb(
        "agent", "dispatch", "--to", machine, "--new-worktree", worktree, "--profile", "fake",
        "--repo", "acme/widget", "--task", task,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"dispatch failed: {done.stderr}")
    return done.stdout.split()[0]


class Observer:
    """When each run of each box first appeared, got a worker, ended (time.time())."""

    def __init__(self, boxes: dict[str, Machine]) -> None:
        self.boxes = boxes
        self.seen: dict[tuple[str, str], float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(OBSERVE_S):
            now = time.time()
            for name, box in self.boxes.items():
                root = box.home / "agents"
                for run_dir in root.glob("agt-*") if root.exists() else []:
                    ref = f"{name}:{run_dir.name}"
                    try:
                        record = json.loads((run_dir / "run.json").read_text())
                    except (OSError, ValueError):
                        continue
                    self.seen.setdefault((ref, "dispatched"), now)
                    if record.get("worker_pid"):
                        self.seen.setdefault((ref, "started"), now)
                    if record.get("state") in ("completed", "failed", "timeout", "abandoned"):
                        self.seen.setdefault((ref, "finished"), now)


def _receiver_cpu_s(boxes: dict[str, Machine]) -> dict[int, float]:
    """CPU seconds of each live receiver process (pid → user + system) of the boxes' homes."""
    homes = {str(box.home) for box in boxes.values()}
    total: dict[int, float] = {}
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "--wb-internal-agent-serve" not in cmdline and "--wb-internal-agent-remote" not in cmdline:
            continue
        try:
            if proc.environ().get("WB_HOME") in homes:
                times = proc.cpu_times()
                total[proc.pid] = times.user + times.system
        except psutil.Error:
            continue
    return total


def main() -> int:
    base = Path(tempfile.mkdtemp(prefix="wb-bench-watch-"))
    caller = make_machine(base / "caller")
    boxes: dict[str, Machine] = {}
    targets: dict[str, Any] = {}
    for name in MACHINES:
        boxes[name], targets[name] = _box(base, name)
    config = yaml.safe_load(caller.config_path.read_text())
    config["session_move"] = {"targets": targets}
    caller.write_config(yaml.safe_dump(config))
    load = os.getloadavg()
    print(f"machine: {common.machine_description()}")
    courier = os.environ.get("WB_COURIER", "on")
    print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; WB_COURIER={courier}")

    seed = _dispatch(caller, "m1", "scenario:wait-release", "seed")
    observer = Observer(boxes)
    watch = subprocess.Popen(
        [sys.executable, "-m", "courier.main", "agent", "watch", "--all", "--json", "--until-idle"],
        env=caller.env, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    printed: dict[tuple[str, str], float] = {}

    def read() -> None:
        assert watch.stdout is not None
        for line in watch.stdout:
            event = json.loads(line)
            if "ref" in event:
                printed.setdefault((event["ref"], event["event"]), time.time())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + 60
    while (seed, "running") not in printed and (seed, "queued") not in printed and time.monotonic() < deadline:
        time.sleep(0.05)
    refs = [_dispatch(caller, MACHINES[i % 3], f"scenario:slow sleep:{2 + i % 3}", f"r{i}") for i in range(RUNS)]
    seed_home = boxes["m1"].home / "agents" / seed.split(":", 1)[1] / "harness-home"
    (seed_home / "release").write_text("go\n")
    watch.wait(300)
    reader.join(10)
    observer.stop.set()
    latencies: list[float] = []
    missing: list[str] = []
    for ref in refs:
        for event in ("dispatched", "started", "finished"):
            if (ref, event) not in printed:
                missing.append(f"{ref} {event}")
                continue
            seen = observer.seen.get((ref, event))
            if seen is not None:
                latencies.append(printed[(ref, event)] - seen)
    print(f"watch exit: {watch.returncode}; transitions printed: {len(latencies) + 0}/{RUNS * 3}; missing: {missing}")
    if latencies:
        latencies.sort()
        p50, p90 = common.median(latencies), common.percentile(latencies, 90)
        print(
            f"latency: median {common.ms(p50)}, p90 {common.ms(p90)}, "
            f"max {common.ms(max(latencies))}; over 2 s: {sum(value > 2.0 for value in latencies)}"
        )

    # The receivers' CPU while ten runs are live and nothing changes.
    hangs = [_dispatch(caller, MACHINES[i % 3], "scenario:hang", f"h{i}") for i in range(RUNS)]
    idle = subprocess.Popen(
        [sys.executable, "-m", "courier.main", "agent", "watch", "--all", "--json"],
        env=caller.env, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    time.sleep(3.0)
    before = _receiver_cpu_s(boxes)
    time.sleep(IDLE_WINDOW_S)
    after = _receiver_cpu_s(boxes)
    spent = sum(value - before.get(pid, 0.0) for pid, value in after.items())
    print(f"receiver processes: {len(before)} before, {len(after)} after")
    print(f"receivers' CPU with {RUNS} live runs on {len(MACHINES)} machines, no change: "
          f"{spent * 1000:.0f} ms over {IDLE_WINDOW_S:.0f} s ({spent / IDLE_WINDOW_S * 100:.1f}% of one core)")
    idle.terminate()
    idle.wait(30)
    for ref in hangs:
        caller.wb("agent", "stop", ref)
    caller.wb("courier", "stop")
    return 0 if not missing and latencies and max(latencies) <= 2.0 else 1


if __name__ == "__main__":
    sys.exit(main())
