"""Run every benchmark of issues 5, 7, 19 and 35 (docs/benchmarks.md#targets) and print one table; exits 0.

    python3 bench/run_all.py [--quick] [--json PATH]

Starts its own loopback sshd machines (127.0.0.2 …, stopped at the end) and needs root and
OpenSSH (the same as tests/integration/sshd.py). Set WB_BENCH_TREE to another checkout's
tree to measure that code instead (before/after figures). Targets that are missed are
reported, not failed: the exit status is 0 whenever every benchmark ran.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import (
    await_latency,
    common,
    diff_remote,
    dispatch_latency,
    fleet_list,
    mcp_startup,
    memory,
    receiver_startup,
    remote_status,
    store_scale,
    warm,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run, noisier figures)")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args()
    reps = 3 if args.quick else 1
    started = time.monotonic()
    report = common.Report()
    print(f"machine: {common.machine_description()}", flush=True)
    if common.TREE:
        print(f"measuring the tree at {common.TREE}", flush=True)
    with common.workdir("all") as base:
        steps = [
            ("remote status", lambda: remote_status.run(report, base, 15 // reps)),
            ("receiver start-up", lambda: receiver_startup.run(report, base, 21 // reps)),
            ("await latency", lambda: await_latency.run(report, base, 30 // reps, 12 // reps)),
            ("store scale", lambda: store_scale.run(report, base, 10_000, 5 // reps + 1)),
            ("fleet list", lambda: fleet_list.run(report, base, repetitions=5 // reps + 1)),
            ("remote diff", lambda: diff_remote.run(report, base, 11 // reps)),
            ("warm path", lambda: warm.run(report, base, 15 // reps)),
            ("mcp start-up", lambda: mcp_startup.run(report, 9 // reps)),
            # Issue 35: dispatch to the worker's first instruction, every channel, warm and cold, with and
            # without the sandbox; the longest step (docs/benchmarks.md#dispatch-latency).
            ("dispatch latency", lambda: dispatch_latency.run(report, base, dispatch_latency.RUNS // reps)),
        ]
        for name, step in steps:
            print(f"{name}…", flush=True)
            step()
        print("memory…", flush=True)
        with common.fleet(16, base, name="memory") as machines:
            ids = [common.write_records(server.wb_home, 50) for server in machines.servers]
            memory.measure(report, machines, f"m1:{ids[0][0]}", repetitions=2)
    print()
    print(common.table(report.rows))
    for line in report.details:
        print(line)
    print(f"\n{len(report.rows)} figures in {time.monotonic() - started:.0f} s on {time.strftime('%Y-%m-%d')}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "date": time.strftime("%Y-%m-%d"),
                    "machine": common.machine_description(),
                    "tree": common.TREE or str(common.REPO_ROOT),
                    "rows": [row.as_dict() for row in report.rows],
                    "details": report.details,
                },
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
