"""Benchmark 8 — the warm path (docs/benchmarks.md#targets; docs/courier.md): the courier running, its connections open.

- remote `wb agent status m1:agt-…` and `wb agent list --to m1` against `ssh host true`
  (target ≤ 0.15×, issue 19), status also
  against `ssh host true` over an OpenSSH ControlMaster socket (target ≤ 0.5×);
- `wb agent list --all --json` over 16 loopback machines against the OpenSSH parallel
  fan-out of the same calls (target ≤ 0.2×);
- local `wb agent status agt-…` wall time (target ≤ 60 ms) and `wb agent list --json` (≤ 40 ms, issue 19);
- the courier's peak RSS with 16 open connections (information: no target).

"Warm" means what a supervisor that polls sees from its second call on: the courier was
started by an earlier command and holds one verified connection (in serve mode) per machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common, fleet_list

MACHINES = 16


def _courier(env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run([common.WB, "courier", "status", "--json"], env=env, capture_output=True, text=True)
    document = json.loads(done.stdout)
    return document if isinstance(document, dict) else {}


def _warm_up(argv: list[str], env: dict[str, str], machines: int) -> None:
    """Run `argv` until the courier holds a serve-mode connection to every machine (or 30 s passed)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        subprocess.run(argv, env=env, capture_output=True)
        rows = _courier(env).get("machines") or []
        if isinstance(rows, list) and sum(1 for row in rows if row.get("mode") == "serve") >= machines:
            return
        time.sleep(0.2)
    raise RuntimeError(f"the courier did not reach serve mode with {machines} machine(s): {_courier(env)}")


def _without_flags(argv: list[str], master: Path, *extra: str) -> list[str]:
    """`argv` (bench.common.Fleet.ssh_argv) with multiplexing on through `master` instead of off."""
    out: list[str] = []
    for item in argv:
        if item in ("ControlMaster=no", "ControlPath=none"):
            out.pop()  # its "-o"
            continue
        out.append(item)
    mode = "yes" if "-fN" in extra else "no"
    return [out[0], "-o", f"ControlMaster={mode}", "-o", f"ControlPath={master}", *extra, *out[1:]]


def _stop(env: dict[str, str]) -> None:
    subprocess.run([common.WB, "courier", "stop"], env=env, capture_output=True)


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def run(report: common.Report, base: Path, repetitions: int = 15) -> None:
    request = base / "warm-list-request.json"
    request.write_text(json.dumps({"schema_version": 1, "operation": "list"}))
    with common.fleet(MACHINES, base, name="warm") as machines:
        ids = [common.write_records(server.wb_home, fleet_list.RUNS_PER_MACHINE) for server in machines.servers]
        local_id = common.write_records(machines.local_home, 1)[0]
        env = machines.env(WB_COURIER="on")
        try:
            status = [common.WB, "agent", "status", f"m1:{ids[0][0]}", "--json"]
            _warm_up(status, env, 1)
            samples = common.interleaved(
                {
                    "wb": lambda: common.run_timed(status, env=env),
                    "ssh": lambda: common.run_timed(machines.ssh_argv(machines.servers[0], "true"), env=env),
                },
                repetitions,
            )
            wb, ssh = common.median(samples["wb"]), common.median(samples["ssh"])
            report.add(
                common.Row(
                    "8. warm remote status",
                    f"wb agent status m:agt {common.ms(wb)}",
                    f"ssh host true {common.ms(ssh)}",
                    f"{wb / ssh:.2f}x",
                    "<= 0.15x",
                    wb / ssh <= 0.15,
                    f"medians of {repetitions}; courier running, serve mode",
                )
            )

            # The issue's own row: `list --to m1` (50 runs) against the same `ssh host true`.
            listing_one = [common.WB, "agent", "list", "--to", "m1", "--json"]
            samples = common.interleaved(
                {
                    "wb": lambda: common.run_timed(listing_one, env=env),
                    "ssh": lambda: common.run_timed(machines.ssh_argv(machines.servers[0], "true"), env=env),
                },
                repetitions,
            )
            wb, ssh = common.median(samples["wb"]), common.median(samples["ssh"])
            report.add(
                common.Row(
                    "8f. warm remote list --to m1",
                    f"wb agent list --to m1 {common.ms(wb)}",
                    f"ssh host true {common.ms(ssh)}",
                    f"{wb / ssh:.2f}x",
                    "<= 0.15x",
                    wb / ssh <= 0.15,
                    f"medians of {repetitions}; {fleet_list.RUNS_PER_MACHINE} runs; courier running, serve mode",
                )
            )

            # The fairest yardstick for a kept connection: OpenSSH's own, a ControlMaster socket.
            master = base / "cm.sock"
            subprocess.run(_without_flags(machines.ssh_argv(machines.servers[0]), master, "-fN"), env=env, check=True)
            try:
                multiplexed = _without_flags(machines.ssh_argv(machines.servers[0], "true"), master)
                samples = common.interleaved(
                    {
                        "wb": lambda: common.run_timed(status, env=env),
                        "cm": lambda: common.run_timed(multiplexed, env=env),
                    },
                    repetitions,
                )
            finally:
                subprocess.run(_without_flags(machines.ssh_argv(machines.servers[0]), master, "-O", "exit"), env=env)
            wb, cm = common.median(samples["wb"]), common.median(samples["cm"])
            report.add(
                common.Row(
                    "8e. warm remote status / ControlMaster",
                    f"wb agent status m:agt {common.ms(wb)}",
                    f"ssh host true over a ControlMaster socket {common.ms(cm)}",
                    f"{wb / cm:.2f}x",
                    "<= 0.5x",
                    wb / cm <= 0.5,
                    f"medians of {repetitions}; the master opened before, as the courier's connection",
                )
            )

            listing = [common.WB, "agent", "list", "--all", "--json"]
            _warm_up(listing, env, MACHINES)
            fan = common.interleaved(
                {
                    "wb": lambda: common.run_timed(listing, env=env),
                    "ssh": lambda: fleet_list.openssh_fanout(machines, MACHINES, request),
                },
                max(3, repetitions // 3),
            )
            wb, ssh = common.median(fan["wb"]), common.median(fan["ssh"])
            report.add(
                common.Row(
                    f"8b. warm list --all, N={MACHINES}",
                    f"wb agent list --all {common.ms(wb)}",
                    f"OpenSSH parallel fan-out {common.ms(ssh)}",
                    f"{wb / ssh:.2f}x",
                    "<= 0.2x",
                    wb / ssh <= 0.2,
                    f"medians of {max(3, repetitions // 3)}; {fleet_list.RUNS_PER_MACHINE} runs per machine",
                )
            )

            local = [common.WB, "agent", "status", local_id, "--json"]
            common.run_timed(local, env=env)
            times = [common.run_timed(local, env=env) for _ in range(repetitions)]
            wall = common.median(times)
            report.add(
                common.Row(
                    "8c. warm local status",
                    f"wb agent status agt {common.ms(wall)}",
                    "60 ms",
                    common.ms(wall),
                    "<= 60 ms",
                    wall <= 0.060,
                    f"median of {repetitions}; p90 {common.ms(common.percentile(times, 90))}",
                )
            )

            local_list = [common.WB, "agent", "list", "--json"]
            common.run_timed(local_list, env=env)
            times = [common.run_timed(local_list, env=env) for _ in range(repetitions)]
            wall = common.median(times)
            report.add(
                common.Row(
                    "8g. warm local list",
                    f"wb agent list --json {common.ms(wall)}",
                    "40 ms",
                    common.ms(wall),
                    "<= 40 ms",
                    wall <= 0.040,
                    f"median of {repetitions}; p90 {common.ms(common.percentile(times, 90))}; one local run",
                )
            )

            courier = _courier(env)
            pid = int(str(courier["pid"]))
            connected = sum(1 for row in courier.get("machines") or [] if row.get("connected"))  # type: ignore[union-attr]
            rss = _peak_rss_mib(pid)
            report.add(
                common.Row(
                    "8d. courier peak RSS",
                    f"{rss:.0f} MiB with {connected} connections",
                    "-",
                    f"{rss:.0f} MiB",
                    "(info)",
                    None,
                    "VmHWM of the courier process after the runs above",
                )
            )
        finally:
            _stop(env)


if __name__ == "__main__":
    report = common.Report()
    with common.workdir("warm") as base:
        run(report, base, int(sys.argv[1]) if len(sys.argv) > 1 else 15)
    print(common.table(report.rows))
