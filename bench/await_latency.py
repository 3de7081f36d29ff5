"""Benchmark 3 — await latency (docs/benchmarks.md#targets: local p50 ≤ 150 ms, p99 ≤ 300 ms; docs/cli.md, wb agent
await).

A record is written `running`, owned by this benchmark's own process (so it is neither
abandoned nor in the admission grace), and `wb agent await <ref>` is started. Once that
process has finished starting (its CPU time stops growing: it is sleeping between polls),
the benchmark saves the terminal record the way an owner does (`Store.save`: temp file,
fsync, rename) after a random extra pause within one poll period, and measures from the
save returning to the await process exiting. Remote: the same with the record in a
loopback sshd machine's home and `wb agent await m1:<id>`.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common

SETTLE_TIMEOUT_S = 20.0


def _cpu_ticks(pid: int) -> int | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])  # utime + stime (fields 14 and 15)


def _poller_pid(process: subprocess.Popen[bytes], server: common.SshdServer | None) -> int | None:
    """The process that polls the record: the CLI itself, or the receiver under the remote sshd."""
    if server is None:
        return process.pid
    for candidate in server.session_processes():
        try:
            if "--wb-internal-agent-remote" in " ".join(candidate.cmdline()):
                return int(candidate.pid)
        except Exception:  # it may have exited between listing and reading
            continue
    return None


def wait_until_polling(
    process: subprocess.Popen[bytes], server: common.SshdServer | None = None, quiet_s: float = 0.15
) -> None:
    """Until the poller exists and has used no CPU for `quiet_s` (it is between polls), bounded."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    time.sleep(0.2)
    last: int | None = None
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"await exited early with {process.returncode}: {process.stderr.read()!r}")  # type: ignore[union-attr]
        time.sleep(0.03)
        pid = _poller_pid(process, server)
        ticks = None if pid is None else _cpu_ticks(pid)
        # One tick of CPU per window is the poller itself; start-up burns many more.
        if ticks is not None and last is not None and ticks - last <= 1:
            if time.monotonic() - quiet_since >= quiet_s:
                return
        else:
            quiet_since = time.monotonic()
        last = ticks
    raise RuntimeError("await did not settle into polling")


def one_sample(
    home: Path, reference: str, agent_id: str, env: dict[str, str], server: common.SshdServer | None = None
) -> float:
    from courier.runs import process as proc
    from courier.runs.store import Record, Store, rfc3339, utc_now

    store = Store(home)
    record = store.load(agent_id)
    await_process = subprocess.Popen(
        [common.WB, "agent", "await", reference, "--wait-timeout", "60s", "--json"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_until_polling(await_process, server)
        time.sleep(random.uniform(0, 0.05))  # a uniformly random phase of the 50 ms poll
        done = Record.model_validate(
            {**record.to_wire(), "state": "completed", "finished_at": rfc3339(utc_now()), "exit_code": 0}
        )
        store.save(done)
        saved = time.perf_counter()
        code = await_process.wait(timeout=60)
        exited = time.perf_counter()
    finally:
        if await_process.poll() is None:
            await_process.kill()
            await_process.wait()
    if code != 0:
        raise RuntimeError(f"await exited {code}: {await_process.stderr.read()!r}")  # type: ignore[union-attr]
    # The next sample starts from a running record again.
    store.save(
        Record.model_validate(
            {**record.to_wire(), "owner_pid": os.getpid(), "owner_token": proc.start_token(os.getpid())}
        )
    )
    return exited - saved


def _running_record(home: Path) -> str:
    from courier.runs import process as proc
    from courier.runs.store import Record, Store

    agent_id = common.write_records(home, 1, state="running")[0]
    store = Store(home)
    record = store.load(agent_id)
    store.save(
        Record.model_validate(
            {**record.to_wire(), "owner_pid": os.getpid(), "owner_token": proc.start_token(os.getpid())}
        )
    )
    return agent_id


def run(report: common.Report, base: Path, local_samples: int = 30, remote_samples: int = 12) -> None:
    home = base / "await-home"
    agent_id = _running_record(home)
    env = common.no_config_env(base, WB_HOME=str(home))
    local = [one_sample(home, agent_id, agent_id, env) for _ in range(local_samples)]
    p50, p99 = common.percentile(local, 50), common.percentile(local, 99)
    report.add(
        common.Row(
            "3. await latency, local",
            f"p50 {common.ms(p50)}, p99 {common.ms(p99)}",
            "save → await exits",
            f"p50 {common.ms(p50)} / p99 {common.ms(p99)}",
            "p50 <= 150 ms, p99 <= 300 ms",
            p50 <= 0.150 and p99 <= 0.300,
            f"{local_samples} samples; max {common.ms(max(local))}",
        )
    )
    with common.fleet(1, base, name="await") as machines:
        server = machines.servers[0]
        remote_id = _running_record(server.wb_home)
        remote = [
            one_sample(server.wb_home, f"m1:{remote_id}", remote_id, machines.env(), server)
            for _ in range(remote_samples)
        ]
    r50, r99 = common.percentile(remote, 50), common.percentile(remote, 99)
    report.add(
        common.Row(
            "3b. await latency, remote",
            f"p50 {common.ms(r50)}, p99 {common.ms(r99)}",
            "save → await exits",
            f"p50 {common.ms(r50)} / p99 {common.ms(r99)}",
            "(no remote target)",
            None,
            f"{remote_samples} samples; max {common.ms(max(remote))}",
        )
    )


if __name__ == "__main__":
    report = common.Report()
    with common.workdir("await") as base:
        run(report, base, *(int(a) for a in sys.argv[1:3]))
    print(common.table(report.rows))
