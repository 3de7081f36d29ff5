"""Benchmark 1 — remote status round trip (docs/benchmarks.md#targets: ≤ 1.8× `ssh host true`, cold).

Ours: `wb agent status m1:agt-…` as a user types it: interpreter start, the CLI, an asyncssh
connection, the remote `wb --wb-internal-agent-remote`, the reply. Yardstick: `ssh host true`
with OpenSSH against the same sshd, the same key and the same known_hosts, no multiplexing.
Beside it, issue 19's own cold row: `wb agent list --to m1 --json`, the machine holding 50 runs
(as the warm benchmark's machines do).

Floors beside it (information rows, bench/common.py `Fleet.least_clients`): the least an asyncssh
client can do, a ten-line script that connects with the same key and known_hosts and runs `true`;
the same script running the receiver with the status request on stdin (what wb costs above it is
its own client: the CLI, wb.yaml and the reply's validation); and the least client of the
contract's shape, which validates the request and the answer with pydantic before and after the
same call.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common, fleet_list


def run(report: common.Report, base: Path, repetitions: int = 15) -> None:
    with common.fleet(1, base, name="status") as machines:
        server = machines.servers[0]
        agent_id = common.write_records(server.wb_home, fleet_list.RUNS_PER_MACHINE)[0]
        env = machines.env()
        ours = [common.WB, "agent", "status", f"m1:{agent_id}", "--json"]
        listing = [common.WB, "agent", "list", "--to", "m1", "--json"]
        yardstick = machines.ssh_argv(server, "true")
        request = base / "status-request.json"
        request.write_text(json.dumps({"schema_version": 1, "operation": "status", "agent_id": agent_id}))
        bare = machines.least_clients(server, "true")["asyncssh"]
        least = machines.least_clients(server)
        samples = common.interleaved(
            {
                "wb": lambda: common.run_timed(ours, env=env),
                "list": lambda: common.run_timed(listing, env=env),
                "ssh": lambda: common.run_timed(yardstick, env=env),
                "floor": lambda: common.run_timed(bare, env=env, stdin_path=request),
                "receiver": lambda: common.run_timed(least["asyncssh"], env=env, stdin_path=request),
                "validating": lambda: common.run_timed(least["validating"], env=env, stdin_path=request),
            },
            repetitions,
        )
    wb, ssh = common.median(samples["wb"]), common.median(samples["ssh"])
    bare_s, receiver = common.median(samples["floor"]), common.median(samples["receiver"])
    validating = common.median(samples["validating"])
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
    listed = common.median(samples["list"])
    report.add(
        common.Row(
            "1c. remote list round trip (issue 19's cold row)",
            f"wb agent list --to m1 --json, {fleet_list.RUNS_PER_MACHINE} runs {common.ms(listed)}",
            f"ssh host true {common.ms(ssh)}",
            f"{listed / ssh:.2f}x",
            "<= 1.8x",
            listed / ssh <= 1.8,
            f"medians of {repetitions}",
        )
    )
    for label, figure in (("`true`", bare_s), ("the receiver's `status`", receiver)):
        report.add(
            common.Row(
                f"1b. the least asyncssh client running {label}",
                f"python + asyncssh {common.ms(figure)}",
                f"ssh host true {common.ms(ssh)}",
                f"{figure / ssh:.2f}x",
                "(info)",
                None,
                "a floor for any asyncssh client: no CLI, no wb.yaml, no reply validation",
            )
        )
    report.add(
        common.Row(
            "1d. remote status / the least client of the contract's shape",
            f"wb agent status m:agt {common.ms(wb)}",
            f"python + pydantic + asyncssh, the receiver's `status` {common.ms(validating)}",
            f"{wb / validating:.2f}x",
            "(info)",
            None,
            f"the request and the answer validated with pydantic, then asyncssh, one after the other; "
            f"{validating / ssh:.2f}x ssh host true",
        )
    )


if __name__ == "__main__":
    report = common.Report()
    with common.workdir("status") as base:
        run(report, base, int(sys.argv[1]) if len(sys.argv) > 1 else 15)
    print(common.table(report.rows))
