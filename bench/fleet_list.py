"""Issue 5's benchmark — `wb agent list --all --json` over N loopback machines (N = 1, 4, 16, 64),
each with 50 recorded runs, against the same fan-out done with OpenSSH: for every host,
`ssh host wb --wb-internal-agent-remote < list-request`, all in parallel (docs/benchmarks.md#targets:
ours ≤ 1.0× at every N, cold). Also time(N)/time(1), and how much of time(N) is the remote
start-ups' CPU (N receivers answering `list`, divided over this machine's cores).

Then the same listing warm (issue 19, docs/courier.md): the courier started, its first
`list --all` (which opens every connection: "first call", each paired with a fan-out; issue 35:
≤ the fan-out over 64 machines) and, once every machine is in serve mode, the steady state;
target ≤ 1.0 s over 64 machines.

    python3 bench/fleet_list.py [REPETITIONS] [--sizes 1,4,16,64] [--cold-only | --warm-only]
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


def openssh_fanout(machines: common.Fleet, count: int, request: Path, failures: list[str] | None = None) -> float:
    """Wall seconds of the parallel fan-out; a failed ssh raises, or is noted in `failures` when given."""
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
                    stderr=subprocess.PIPE,
                )
            )
        for process in processes:
            out, err = process.communicate(timeout=common.SUBPROCESS_TIMEOUT_S)
            if process.returncode != 0 or len(json.loads(out)["results"]) != RUNS_PER_MACHINE:
                if failures is not None:
                    failures.append(err.decode(errors="replace").strip()[-200:])
                    continue
                raise RuntimeError(f"OpenSSH fan-out failed: {process.returncode} {out[:200]!r} {err[-400:]!r}")
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
    env = common.no_config_env(home, WB_HOME=str(home))
    samples = []
    for _ in range(repetitions):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        common.run_timed([common.WB, "--wb-internal-agent-remote"], env=env, stdin_path=request)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        samples.append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
    return common.median(samples)


SIZES = (1, 4, 16, 64)


def _courier_machines(env: dict[str, str]) -> list[dict[str, object]]:
    done = subprocess.run([common.WB, "courier", "status", "--json"], env=env, capture_output=True, text=True)
    rows = json.loads(done.stdout).get("machines") or [] if done.returncode == 0 else []
    return [row for row in rows if isinstance(row, dict)]


def _until_serving(env: dict[str, str], ours: list[str], size: int) -> None:
    """Until every machine answers on its serve process (the first call's side work is done)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if sum(1 for row in _courier_machines(env) if row.get("mode") == "serve") >= size:
            return
        common.run_timed(ours, env=env)
        time.sleep(0.2)


def _warm(report: common.Report, machines: common.Fleet, size: int, request: Path, repetitions: int) -> None:
    """list --all with the courier: its first call (opens every connection), then the steady state.

    Each first call comes from a courier just started (`wb courier stop`, then a local `list` that starts it);
    it is paired with an OpenSSH fan-out made once that courier serves every machine, so both meet the
    same machine (issue 35: the first call ≤ the fan-out)."""
    config = common.write_config(machines.factory, f"fleet-warm-{size}", machines.servers[:size])
    env = machines.env(WB_CONFIG=str(config), WB_COURIER="on")
    ours = [common.WB, "agent", "list", "--all", "--json"]
    failures: list[str] = []  # the yardstick's: 64 parallel ssh on a loaded 2-core machine can fail
    firsts: list[float] = []
    paired: list[float] = []
    try:
        for _ in range(repetitions):
            subprocess.run([common.WB, "courier", "stop"], env=env, capture_output=True)
            common.run_timed([common.WB, "agent", "list", "--json"], env=env)  # starts the courier, no machine
            firsts.append(common.run_timed(ours, env=env))
            _until_serving(env, ours, size)
            paired.append(openssh_fanout(machines, size, request, failures))
        samples = common.interleaved(
            {
                "wb": lambda: common.run_timed(ours, env=env),
                "ssh": lambda: openssh_fanout(machines, size, request, failures),
            },
            repetitions,
        )
    finally:
        subprocess.run([common.WB, "courier", "stop"], env=env, capture_output=True)
    wb, ssh = common.median(samples["wb"]), common.median(samples["ssh"])
    first, fanout = common.median(firsts), common.median(paired)
    ratios = sorted(a / b for a, b in zip(firsts, paired, strict=True))
    failed = f"; {len(failures)} of the fan-out's ssh failed ({failures[0]})" if failures else ""
    report.add(
        common.Row(
            f"6f. first list --all of a new courier, N={size}",
            f"wb agent list --all {common.ms(first)}",
            f"OpenSSH parallel fan-out {common.ms(fanout)}",
            f"{first / fanout:.2f}x",
            "<= 1.0x" if size == 64 else "(info)",
            first <= fanout if size == 64 else None,
            f"medians of {repetitions} pairs (ratios {', '.join(f'{r:.2f}' for r in ratios)}); "
            f"the courier restarted before each{failed}",
        )
    )
    report.add(
        common.Row(
            f"6w. warm list --all, N={size}",
            f"wb agent list --all {common.ms(wb)}",
            f"OpenSSH parallel fan-out {common.ms(ssh)}",
            f"{wb / ssh:.2f}x",
            "<= 1.0 s" if size == 64 else "(info)",
            wb <= 1.0 if size == 64 else None,
            f"medians of {repetitions}; courier running, serve mode; {RUNS_PER_MACHINE} runs per machine{failed}",
        )
    )


def run(
    report: common.Report,
    base: Path,
    sizes: tuple[int, ...] = SIZES,
    repetitions: int = 5,
    *,
    cold: bool = True,
    warm: bool = True,
) -> None:
    request = base / "list-request.json"
    request.write_text(json.dumps({"schema_version": 1, "operation": "list"}))
    largest = max(sizes)
    medians: dict[int, float] = {}
    with common.fleet(largest, base, name="fleet-list") as machines:
        for server in machines.servers:
            common.write_records(server.wb_home, RUNS_PER_MACHINE)
        if warm:
            for size in sizes:
                _warm(report, machines, size, request, repetitions)
        for size in sizes if cold else ():
            config = common.write_config(machines.factory, f"fleet-{size}", machines.servers[:size])
            env = machines.env(WB_CONFIG=str(config))
            ours = [common.WB, "agent", "list", "--all", "--json"]
            subjects = {
                "wb": lambda env=env, ours=ours: common.run_timed(ours, env=env),
                "ssh": lambda size=size: openssh_fanout(machines, size, request),
            }
            if size == 1:  # the floors of a cold remote command (bench/common.py Fleet.least_clients)
                for kind, argv in machines.least_clients(machines.servers[0]).items():
                    subjects[kind] = lambda env=env, argv=argv: common.run_timed(argv, env=env, stdin_path=request)
            samples = common.interleaved(subjects, repetitions)
            wb, ssh = common.median(samples["wb"]), common.median(samples["ssh"])
            medians[size] = wb
            report.add(
                common.Row(
                    f"6. cold list --all, N={size}",
                    f"wb agent list --all {common.ms(wb)}",
                    f"OpenSSH parallel fan-out {common.ms(ssh)}",
                    f"{wb / ssh:.2f}x",
                    "<= 1.0x",
                    wb / ssh <= 1.0,
                    f"medians of {repetitions}; {RUNS_PER_MACHINE} runs per machine",
                )
            )
            for kind, label in (("asyncssh", "python + asyncssh"), ("validating", "python + pydantic + asyncssh")):
                if kind not in samples:
                    continue
                floor = common.median(samples[kind])
                report.add(
                    common.Row(
                        f"6c. cold list --all, N=1 / the least {kind} client running the receiver's list",
                        f"wb agent list --all {common.ms(wb)}",
                        f"{label}, same request {common.ms(floor)}",
                        f"{wb / floor:.2f}x",
                        "(info)",
                        None,
                        f"that client is {floor / ssh:.2f}x the fan-out of one (bench/common.py Fleet.least_clients)",
                    )
                )
        cpu = receiver_cpu_s(machines.servers[0].wb_home, request) if cold else 0.0
    if cold and 1 in medians and largest in medians:
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


def _arguments(argv: list[str]) -> tuple[int, tuple[int, ...], bool, bool]:
    repetitions, sizes, cold, warm = 5, SIZES, True, True
    items = iter(argv)
    for item in items:
        if item == "--sizes":
            sizes = tuple(int(part) for part in next(items).split(","))
        elif item == "--cold-only":
            warm = False
        elif item == "--warm-only":
            cold = False
        else:
            repetitions = int(item)
    return repetitions, sizes, cold, warm


if __name__ == "__main__":
    repetitions, sizes, cold, warm = _arguments(sys.argv[1:])
    report = common.Report()
    print(f"load average before: {os.getloadavg()}", flush=True)
    with common.workdir("fleet") as base:
        run(report, base, sizes, repetitions, cold=cold, warm=warm)
    print(f"load average after: {os.getloadavg()}", flush=True)
    print(common.table(report.rows))
