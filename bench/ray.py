"""Ray cluster benchmark (docs/benchmarks.md#ray-cluster; docs/ray.md): 60 runs of a 3-second task on 3 nodes × 2 cpus.

A real cluster (tests/integration/ray_cluster.py: a private network namespace, three nodes of
2 cpus, each its own wb home) is reached as the exec machine `lab`, as a supervisor would.

- dispatch: 60 `wb agent dispatch --to lab` of the `command` profile (1 cpu, `sleep 3`), six at a
  time, through the courier (its serve process keeps the head's Ray connection warm); the
  time from the first dispatch starting to the last one answered. Target ≤ 10 s.
- makespan: from the first dispatch to the last run's `finished_at` (the nodes' clocks are this
  machine's). Ideal 60 × 3 s / 6 cpus = 30 s; target ≤ 1.25 × 30 s.
- both for two batches of 60: the first right after wb first reached the cluster (its head's
  keeper still starting: docs/ray.md#the-keeper), the second on the same cluster once it has run
  work, which is what a supervisor's every later batch meets.
- list: 480 more completed records written into the nodes' stores (160 each), then
  `wb agent list --to lab --json` of all 600, cold (WB_COURIER=off) and warm; median of 3. Target ≤ 1.5 s.

Run: `.venv/bin/python bench/ray.py` (needs the extra wb[ray], unshare and nsenter; about 4 minutes).
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
EXTRA_RECORDS = 600 - 2 * RUNS  # the two batches' records and these make 600
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
    done = subprocess.run([common.WB, *args], env=env, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"wb {' '.join(args)} exited {done.returncode}: {done.stderr[-800:]}")
    return done.stdout


def listed(env: dict[str, str]) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = json.loads(wb(env, "agent", "list", "--to", "lab", "--json"))
    return results


def busy_cpu_s() -> float:
    """CPU seconds this machine has spent outside idle and iowait since boot (/proc/stat), all cores."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


_KINDS = (  # (what a process is, a piece of its command line), first match wins
    ("ray: raylets", "raylet"),
    ("ray: GCS", "gcs_server"),
    ("ray: node services (actors)", "NodeService"),
    ("ray: task workers (holders)", "ray::hold_run"),
    ("ray: idle workers", "ray::IDLE"),
    ("ray: task workers (holders)", "default_worker.py"),
    ("ray: other daemons", "ray/"),
    ("head: serve process", "--wb-internal-agent-serve"),
    ("caller: courier", "courier.courier_process"),
    ("wb owners (alive at the end)", "--wb-internal-agent-run"),
)


Snapshot = dict[int, tuple[str, float]]  # pid → (kind, CPU seconds)


def process_cpu() -> Snapshot:
    """Every live process's kind and CPU seconds so far (processes that ended are not here)."""
    tick = os.sysconf("SC_CLK_TCK")
    table: Snapshot = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        kind = next((name for name, part in _KINDS if part in command), "other processes alive at the end")
        table[int(entry.name)] = (kind, (int(fields[11]) + int(fields[12])) / tick)
    return table


def cpu_by_kind(before: Snapshot, after: Snapshot, busy: float) -> dict[str, float]:
    """CPU seconds per kind of process between two snapshots; the rest is processes that came and went
    within the window (each dispatch's `wb` client and courier child, the nodes' git and owner starts,
    the harness, the benchmark's own polling)."""
    kinds: dict[str, float] = {}
    for pid, (kind, cpu) in after.items():
        kinds[kind] = kinds.get(kind, 0.0) + cpu - (before[pid][1] if pid in before else 0.0)
    kinds["short-lived processes (the rest)"] = busy - sum(kinds.values())
    return {kind: round(seconds, 1) for kind, seconds in sorted(kinds.items(), key=lambda item: -item[1])}


def timeline(results: list[dict[str, Any]], first: float) -> dict[str, Any]:
    """Where a slot's time goes: each run's start and end (seconds after the first dispatch) by node,
    and the gaps on a node between one run's end and the next run's start (the slot's idle time)."""
    from protocol.timestamps import parse_rfc3339

    by_node: dict[str, list[tuple[float, float]]] = {}
    for result in results:
        begun = parse_rfc3339(result["started_at"]).timestamp() - first
        ended = parse_rfc3339(result["finished_at"]).timestamp() - first
        by_node.setdefault(str(result.get("node")), []).append((begun, ended))
    gaps: list[float] = []
    durations: list[float] = []
    for spans in by_node.values():
        spans.sort()
        durations += [end - begun for begun, end in spans]
        # With 2 slots per node the k-th run starts after the (k-2)-th ended.
        ends = sorted(end for _, end in spans)
        gaps += [spans[k][0] - ends[k - CPUS] for k in range(CPUS, len(spans))]
    return {
        "first_start_s": round(min(b for spans in by_node.values() for b, _ in spans), 2),
        "run_s_median": round(statistics.median(durations), 2),
        "run_s_max": round(max(durations), 2),
        "slot_gap_s_median": round(statistics.median(gaps), 2) if gaps else None,
        "slot_gap_s_max": round(max(gaps), 2) if gaps else None,
    }


def batch(env: dict[str, str], prefix: str) -> dict[str, Any]:
    """Dispatch RUNS runs, PARALLEL at a time, wait for all to end; the figures of that batch."""
    report: dict[str, Any] = {}

    def one(index: int) -> str:
        out = wb(
            env, "agent", "dispatch", "--to", "lab", "--new-worktree", f"{prefix}{index}", "--profile", "task",
            "--repo", "acme/widget", "--task", f"sleep:{TASK_S}",
        )  # fmt: skip
        return out.split()[0]

    cpu_before = busy_cpu_s()
    processes_before = process_cpu()
    first = time.time()
    with ThreadPoolExecutor(PARALLEL) as pool:
        refs = list(pool.map(one, range(RUNS)))
    report["dispatch_all_s"] = round(time.time() - first, 2)
    report["cpu_during_dispatch_s"] = round(busy_cpu_s() - cpu_before, 1)
    ids = {ref.split(":", 1)[1] for ref in refs}
    deadline = time.monotonic() + 600
    while True:
        results = [r for r in listed(env) if r["agent_id"] in ids]
        if len(results) == RUNS and all(r["terminal"] for r in results):
            break
        if time.monotonic() > deadline:
            raise RuntimeError("the runs did not all finish within 10 minutes")
        # Each look is a `list` of every node's store: seldom, so that the benchmark's own
        # polling adds little to the load it measures (makespan comes from the records).
        time.sleep(5)
    from protocol.timestamps import parse_rfc3339

    last = max(parse_rfc3339(r["finished_at"]).timestamp() for r in results)
    report["makespan_s"] = round(last - first, 2)
    # Every process of the machine from the first dispatch to the last run's end (the
    # three nodes, the head's serve process, the courier, this poller): per run, and the
    # floor that much work puts under the makespan on this machine's cores.
    busy = busy_cpu_s() - cpu_before
    report["cpu_per_run_s"] = round(busy / RUNS, 2)
    report["cpu_floor_s"] = round(busy / (os.cpu_count() or 1), 1)
    report["cpu_by_kind_s"] = cpu_by_kind(processes_before, process_cpu(), busy)
    report["timeline"] = timeline(results, first)
    report["states"] = sorted({r["state"] for r in results})
    nodes = sorted({r["node"] for r in results})
    report["runs_per_node"] = {n: sum(r.get("node") == n for r in results) for n in nodes}
    return report


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

            # The first batch meets a cluster wb has only just joined (the head's keeper starting
            # and warming its workers meanwhile); the second, the same cluster once it has run work.
            report["first_batch"] = batch(warm, "a")
            report["second_batch"] = batch(warm, "b")
            report["ideal_s"] = IDEAL_S

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
            subprocess.run([common.WB, "courier", "stop"], env=warm, capture_output=True, check=False)
            cluster.stop()
    report["load_after"] = os.getloadavg()
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
