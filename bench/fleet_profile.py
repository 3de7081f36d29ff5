"""Where a warm `wb agent list --all` over N loopback machines spends its time (issue 19).

Starts N sshd machines with 50 runs each, lets the courier open a serve session to every one,
then times `wb agent list --all --json` and, across the same calls, adds up the CPU seconds
(`/proc/PID/stat`) of each party on this machine's cores: the client, the courier (its own
threads, and separately the per-command children it forked and reaped), the N remote serve
processes (`wb --wb-internal-agent-serve`) and their sshd sessions. On a 2-core machine a
listing cannot be faster than the sum of those CPU seconds divided by 2.

    python3 bench/fleet_profile.py [N] [CALLS] [--profile]   (defaults 64 and 5)

With --profile, one more listing runs inside this process under cProfile (what a courier
child runs, its calls through the same courier), the profile on stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common, fleet_list
from protocol.entry import SERVE_ARGUMENT

CLOCK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[float, float]:
    """(own CPU s, reaped children's CPU s) of a process; zeros when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0.0
    utime, stime, cutime, cstime = (int(value) for value in fields[11:15])
    return (utime + stime) / CLOCK, (cutime + cstime) / CLOCK


def _processes(marker: str, within: str) -> list[int]:
    """Processes whose command line holds `marker` and whose command line or environment names `within`.

    `within` is this fleet's directory: other runs' serve processes on the same machine are not counted.
    """
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker not in cmdline:
            continue
        try:
            environment = (entry / "environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if within in cmdline or within in environment:
            found.append(int(entry.name))
    return found


def _cpu(pids: list[int]) -> float:
    return sum(_stat(pid)[0] for pid in pids)


def _profile_command(argv: list[str], env: dict[str, str], socket_path: str) -> None:
    """The command a courier child runs, here under cProfile, its calls through the same courier."""
    import contextlib
    import cProfile
    import io
    import pstats

    from courier import cli
    from courier.channels.courier import through_courier
    from courier.channels.registry import carry_through

    os.environ.update(env)
    carry_through(through_courier(socket_path))
    profiler = cProfile.Profile()
    with contextlib.redirect_stdout(io.StringIO()):
        profiler.runcall(cli.run, argv)
    carry_through(None)
    for key in ("cumulative", "tottime"):
        pstats.Stats(profiler, stream=sys.stderr).sort_stats(key).print_stats(30)


def main(size: int, calls: int, profile: bool = False) -> None:
    with common.workdir("fleet-profile") as base, common.fleet(size, base, name="profile") as machines:
        for server in machines.servers:
            common.write_records(server.wb_home, fleet_list.RUNS_PER_MACHINE)
        env = machines.env(WB_COURIER="on")
        listing = [common.WB, "agent", "list", "--all", "--json"]
        try:
            common.run_timed([common.WB, "agent", "list", "--json"], env=env)  # starts the courier
            first = common.run_timed(listing, env=env, expect=None)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                done = subprocess.run([common.WB, "courier", "status", "--json"], env=env, capture_output=True)
                rows = json.loads(done.stdout).get("machines") or []
                if sum(1 for row in rows if row.get("mode") == "serve") >= size:
                    break
                common.run_timed(listing, env=env, expect=None)
            courier_pid = int(json.loads(done.stdout)["pid"])
            serves = _processes(SERVE_ARGUMENT, str(base))
            sshds = [pid for pid in _processes("sshd", str(base)) if pid not in serves]
            own0, children0 = _stat(courier_pid)
            serve0, sshd0 = _cpu(serves), _cpu(sshds)
            walls = []
            client_cpu = 0.0
            for _ in range(calls):
                before = os.times()
                walls.append(common.run_timed(listing, env=env, expect=None))
                after = os.times()
                client_cpu += (after.children_user - before.children_user) + (
                    after.children_system - before.children_system
                )
            own1, children1 = _stat(courier_pid)
            serve1, sshd1 = _cpu(serves), _cpu(sshds)
            if profile:
                _profile_command(listing[1:], env, str(json.loads(done.stdout)["socket"]))
        finally:
            subprocess.run([common.WB, "courier", "stop"], env=env, capture_output=True)
    per = 1000 / calls
    parts = {
        "client (thin)": client_cpu * per,
        "courier children (the command)": (children1 - children0) * per,
        "courier (connections, relaying)": (own1 - own0) * per,
        f"{len(serves)} serve processes": (serve1 - serve0) * per,
        f"{len(sshds)} sshd processes": (sshd1 - sshd0) * per,
    }
    total = sum(parts.values())
    print(f"{common.machine_description()}; load average {os.getloadavg()[0]:.1f}")
    print(f"warm list --all, N={size}, {fleet_list.RUNS_PER_MACHINE} runs each: first call {common.ms(first)}")
    print(f"wall per call: median {common.ms(common.median(walls))} of {calls} ({', '.join(map(common.ms, walls))})")
    for name, value in parts.items():
        print(f"  cpu per call, {name}: {value:.0f} ms")
    cores = os.cpu_count() or 1
    print(f"  cpu per call, all: {total:.0f} ms = {total / cores:.0f} ms of wall on {cores} cores")


if __name__ == "__main__":
    numbers = [int(arg) for arg in sys.argv[1:] if arg.isdigit()]
    main(*(numbers + [64, 5][len(numbers) :])[:2], profile="--profile" in sys.argv)
