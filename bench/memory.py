"""Benchmark 5 — peak RSS of the CLI (docs/benchmarks.md#targets: ≤ 100 MB).

The peak resident set of the `wb` process itself (os.wait4's ru_maxrss: the CLI and any
child it waited for) for `wb agent status m1:<id>` and for `wb agent list --all --json`
over 16 loopback machines with 50 runs each.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common


def peak_rss_mib(argv: list[str], env: dict[str, str], ok_codes: tuple[int, ...] = (0,)) -> float:
    process = subprocess.Popen(
        argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        _, status, usage = os.wait4(process.pid, 0)
    except BaseException:
        process.kill()
        process.wait()
        raise
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode not in ok_codes:
        raise RuntimeError(f"{argv} exited {process.returncode}: {process.stderr.read()!r}")  # type: ignore[union-attr]
    return usage.ru_maxrss / 1024  # KiB on Linux


def measure(report: common.Report, machines: common.Fleet, status_ref: str, repetitions: int = 3) -> None:
    env = machines.env()
    status = max(peak_rss_mib([common.WB, "agent", "status", status_ref, "--json"], env) for _ in range(repetitions))
    listing = max(peak_rss_mib([common.WB, "agent", "list", "--all", "--json"], env) for _ in range(repetitions))
    size = len(machines.servers)
    for name, value in (("remote status", status), (f"list --all over {size} machines", listing)):
        report.add(
            common.Row(
                f"5. peak RSS, {name}",
                f"{value:.0f} MiB",
                "100 MB",
                f"{value:.0f} MiB",
                "<= 100 MB",
                value * 1024 * 1024 <= 100e6,
                f"largest of {repetitions}",
            )
        )


if __name__ == "__main__":
    report = common.Report()
    with common.workdir("memory") as base, common.fleet(16, base) as machines:
        ids = [common.write_records(server.wb_home, 50) for server in machines.servers]
        measure(report, machines, f"m1:{ids[0][0]}")
    print(common.table(report.rows))
