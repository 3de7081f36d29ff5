"""Benchmark 1 — remote status round trip (docs/benchmarks.md#targets: ≤ 1.8× `ssh host true`, cold).

Ours: `wb agent status m1:agt-…` as a user types it: interpreter start, the CLI, an asyncssh
connection, the remote `wb --wb-internal-agent-remote`, the reply. Yardstick: `ssh host true`
with OpenSSH against the same sshd, the same key and the same known_hosts, no multiplexing.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common


def run(report: common.Report, base: Path, repetitions: int = 15) -> None:
    with common.fleet(1, base, name="status") as machines:
        server = machines.servers[0]
        agent_id = common.write_records(server.wb_home, 1)[0]
        env = machines.env()
        ours = [common.WB, "agent", "status", f"m1:{agent_id}", "--json"]
        yardstick = machines.ssh_argv(server, "true")
        samples = common.interleaved(
            {
                "wb": lambda: common.run_timed(ours, env=env),
                "ssh": lambda: common.run_timed(yardstick, env=env),
            },
            repetitions,
        )
    wb, ssh = common.median(samples["wb"]), common.median(samples["ssh"])
    ratio = wb / ssh
    report.add(
        common.Row(
            "1. remote status round trip",
            f"wb agent status m:agt {common.ms(wb)}",
            f"ssh host true {common.ms(ssh)}",
            f"{ratio:.2f}x",
            "<= 1.8x",
            ratio <= 1.8,
            f"medians of {repetitions}",
        )
    )


if __name__ == "__main__":
    report = common.Report()
    with common.workdir("status") as base:
        run(report, base, int(sys.argv[1]) if len(sys.argv) > 1 else 15)
    print(common.table(report.rows))
