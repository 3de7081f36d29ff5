"""Ray cluster benchmark (docs/benchmarks.md#ray-cluster; docs/ray.md): 60 runs of a 3-second task on 3 nodes × 2 cpus.

A real cluster (tests/integration/ray_cluster.py: a private network namespace, three nodes of
2 cpus, each its own wb home) is reached as the exec machine `lab`, as a supervisor would.

- dispatch: 60 `wb agent dispatch --to lab` of the `command` profile (1 cpu, `sleep 3`), six at a
  time, through the courier (its serve process keeps the head's Ray connection warm); the
  time from the first dispatch starting to the last one answered. Target ≤ 10 s.
- makespan: from the first dispatch to the last run's `finished_at` (the nodes' clocks are this
  machine's). Ideal 60 × 3 s / 6 cpus = 30 s; target ≤ 1.25 × 30 s.
- list: 540 more completed records written into the nodes' stores (180 each), then
  `wb agent list --to lab --json` of all 600, cold (WB_COURIER=off) and warm; median of 3. Target ≤ 1.5 s.

Run: `.venv/bin/python bench/ray.py` (needs the extra wb[ray], unshare and nsenter; about 3 minutes).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml

from bench import common
from tests.integration.ray_cluster import RayCluster, RayNode

RUNS = 60
TASK_S = 3
NODES = 3
CPUS = 2
PARALLEL = 6
EXTRA_RECORDS = 540
IDEAL_S = RUNS * TASK_S / (NODES * CPUS)


def caller(base: Path, cluster: RayCluster) -> dict[str, str]:
    """This machine's environment: its own home and a wb.yaml naming the head as `lab`."""
    config_dir = base / "caller"
    config_dir.mkdir(mode=0o700)
    config = config_dir / "wb.yaml"
    config.write_text(yaml.safe_dump({"session_move": {"targets": {"lab": {"exec": {"argv": cluster.head_argv()}}}}}))
    config.chmod(0o600)
    return common.base_env(WB_CONFIG=str(config), WB_HOME=str(config_dir / "wbhome"), HOME=str(config_dir))


def wb(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [common.PYTHON, "-m", "courier.main", *args], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"wb {' '.join(args)} exited {done.returncode}: {done.stderr[-800:]}")
    return done.stdout


def listed(env: dict[str, str]) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = json.loads(wb(env, "agent", "list", "--to", "lab", "--json"))
    return results


def main() -> int:
    report: dict[str, Any] = {"machine": common.machine_description(), "load_before": os.getloadavg()}
    with common.workdir("ray") as base:
        cluster = RayCluster(
            base / "cluster",
            [RayNode(f"n{i}", base / "cluster" / f"n{i}", CPUS, ("acme/widget",)) for i in range(NODES)],
        )
        started = time.monotonic()
        cluster.start()
        report["cluster_start_s"] = round(time.monotonic() - started, 1)
        warm = caller(base, cluster)
        try:
            warm["WB_COURIER"] = "on"
            cold = {**warm, "WB_COURIER": "off"}
            wb(warm, "machines", "--check")  # the courier and the head's serve process start here, unmeasured

            def one(index: int) -> str:
                out = wb(
                    warm, "agent", "dispatch", "--to", "lab", "--new-worktree", f"b{index}", "--profile", "task",
                    "--repo", "acme/widget", "--task", f"sleep:{TASK_S}",
                )  # fmt: skip
                return out.split()[0]

            first = time.time()
            with ThreadPoolExecutor(PARALLEL) as pool:
                refs = list(pool.map(one, range(RUNS)))
            report["dispatch_all_s"] = round(time.time() - first, 2)
            ids = {ref.split(":", 1)[1] for ref in refs}
            deadline = time.monotonic() + 600
            while True:
                results = [r for r in listed(warm) if r["agent_id"] in ids]
                if len(results) == RUNS and all(r["terminal"] for r in results):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("the runs did not all finish within 10 minutes")
                time.sleep(2)
            from protocol.timestamps import parse_rfc3339

            last = max(parse_rfc3339(r["finished_at"]).timestamp() for r in results)
            report["makespan_s"] = round(last - first, 2)
            report["ideal_s"] = IDEAL_S
            report["states"] = sorted({r["state"] for r in results})
            report["runs_per_node"] = {
                n: sum(r.get("node") == n for r in results) for n in sorted({r["node"] for r in results})
            }

            for node in cluster.nodes:
                common.write_records(node.wb_home, EXTRA_RECORDS // NODES)
            timings = {}
            for name, env in (("cold", cold), ("warm", warm)):
                times = []
                for _ in range(3):
                    begun = time.perf_counter()
                    count = len(listed(env))
                    times.append(time.perf_counter() - begun)
                timings[name] = {"median_s": round(statistics.median(times), 3), "records": count}
            report["list_600"] = timings
        finally:
            subprocess.run(
                [common.PYTHON, "-m", "courier.main", "courier", "stop"], env=warm, capture_output=True, check=False
            )
            cluster.stop()
    report["load_after"] = os.getloadavg()
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
