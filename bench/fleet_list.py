"""Issue 5's benchmark — `wb agent list --all --json` over N loopback machines (N = 1, 4, 16),
each with 50 recorded runs, against the same fan-out done with OpenSSH: for every host,
`ssh host wb --wb-internal-agent-remote < list-request`, all in parallel (docs/benchmarks.md#targets:
ours ≤ 1.0× at every N). Also time(16)/time(1), and how much of time(16) is the remote
start-ups' CPU (N receivers answering `list`, divided over this machine's cores).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common

RUNS_PER_MACHINE = 50


def openssh_fanout(machines: common.Fleet, count: int, request: Path) -> float:
    started = time.perf_counter()
    processes = []
    handles = []
    try:
        for server in machines.servers[:count]:
            handle = open(request, "rb")  # noqa: SIM115
            handles.append(handle)
            processes.append(
                subprocess.Popen(
                    machines.ssh_argv(server, "wb", "--wb-internal-agent-remote"),
                    env=machines.env(),
                    stdin=handle,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                )
            )
        for process in processes:
            out, _ = process.communicate(timeout=common.SUBPROCESS_TIMEOUT_S)
            if process.returncode != 0 or len(json.loads(out)["results"]) != RUNS_PER_MACHINE:
                raise RuntimeError(f"OpenSSH fan-out failed: {process.returncode} {out[:200]!r}")
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        for handle in handles:
            handle.close()
    return time.perf_counter() - started


def receiver_cpu_s(home: Path, request: Path, repetitions: int = 5) -> float:
    """CPU seconds (user + system) of one `wb --wb-internal-agent-remote` answering `list` over 50 runs."""
    env = common.base_env(WB_HOME=str(home), WB_CONFIG=str(home / "no-such-wb.yaml"))
    samples = []
    for _ in range(repetitions):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        common.run_timed([common.WB, "--wb-internal-agent-remote"], env=env, stdin_path=request)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        samples.append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
    return common.median(samples)


def run(report: common.Report, base: Path, sizes: tuple[int, ...] = (1, 4, 16), repetitions: int = 5) -> None:
    request = base / "list-request.json"
    request.write_text(json.dumps({"schema_version": 1, "operation": "list"}))
    largest = max(sizes)
    medians: dict[int, float] = {}
    with common.fleet(largest, base, name="fleet-list") as machines:
        for server in machines.servers:
            common.write_records(server.wb_home, RUNS_PER_MACHINE)
        for size in sizes:
            config = common.write_config(machines.factory, f"fleet-{size}", machines.servers[:size])
            env = machines.env(WB_CONFIG=str(config))
            ours = [common.WB, "agent", "list", "--all", "--json"]
            samples = common.interleaved(
                {
                    "wb": lambda env=env, ours=ours: common.run_timed(ours, env=env),
                    "ssh": lambda size=size: openssh_fanout(machines, size, request),
                },
                repetitions,
            )
            wb, ssh = common.median(samples["wb"]), common.median(samples["ssh"])
            medians[size] = wb
            report.add(
                common.Row(
                    f"6. list --all, N={size}",
                    f"wb agent list --all {common.ms(wb)}",
                    f"OpenSSH parallel fan-out {common.ms(ssh)}",
                    f"{wb / ssh:.2f}x",
                    "<= 1.0x",
                    wb / ssh <= 1.0,
                    f"medians of {repetitions}; {RUNS_PER_MACHINE} runs per machine",
                )
            )
        cpu = receiver_cpu_s(machines.servers[0].wb_home, request)
    if 1 in medians and largest in medians:
        cores = os.cpu_count() or 1
        floor = cpu * largest / cores
        report.add(
            common.Row(
                "6b. list --all scaling",
                f"time({largest})/time(1)",
                "-",
                f"{medians[largest] / medians[1]:.2f}",
                "(info)",
                None,
                f"{largest} receivers x {cpu * 1000:.0f} ms CPU / {cores} cores = {floor * 1000:.0f} ms floor "
                f"({floor / medians[largest]:.0%} of time({largest}))",
            )
        )


if __name__ == "__main__":
    report = common.Report()
    with common.workdir("fleet") as base:
        run(report, base, repetitions=int(sys.argv[1]) if len(sys.argv) > 1 else 5)
    print(common.table(report.rows))
