"""Shared pieces of the benchmarks: timing, statistics, records on disk and loopback sshd machines.

Every benchmark measures a subject and its yardstick in the same run, interleaved
(subject, yardstick, subject, …) so that the noise of a shared machine falls on both,
and reports medians and their ratio. Nothing here touches the real ~/.ssh or ~/.wb.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tests.integration.sshd import SshdFactory, SshdServer, sshd_unavailable_reason  # noqa: E402

# The running interpreter and console script, never a pyenv shim (it would add its own start-up).
# sys.executable is kept as is, not resolved: in a virtualenv its path is what finds the venv's packages.
PYTHON = sys.executable
WB = str(Path(sys.executable).parent / "wb")
SSH = shutil.which("ssh") or "/usr/bin/ssh"
SUBPROCESS_TIMEOUT_S = 120.0
# Another checkout's tree (e.g. `git archive` of an older commit) to measure instead of this
# one, for before/after figures: it goes first on PYTHONPATH here and, through a `wb` wrapper
# in each sshd machine's bin dir (first on its PATH), on the remote side too.
TREE = os.environ.get("WB_BENCH_TREE", "")
# Which channel wb reaches the machines with: "ssh" (its own asyncssh) or "exec" (`env WB_HOME=… wb`,
# a local exec channel to the same machine's home, as `docker exec -i` would be; docs/cli.md).
CHANNEL = os.environ.get("WB_BENCH_CHANNEL", "ssh")

# The least asyncssh client: one connection, one command, its stdout; no config file read. The floor of any
# asyncssh client (bench/remote_status.py, diff_remote.py, fleet_list.py).
ASYNCSSH_FLOOR = """
import asyncio, sys
import asyncssh
directory, host, port, command = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
data = sys.stdin.buffer.read()
async def main():
    async with asyncssh.connect(host, port=port, username=sys.argv[5], client_keys=[directory + "/client_key"],
                                known_hosts=directory + "/known_hosts", config=None, agent_path=None) as connection:
        done = await connection.run(command, input=data.decode(), check=True)
        sys.stdout.write(str(done.stdout))
asyncio.run(main())
"""

# The least pydantic pair's caller: the request (stdin) validated with pydantic, sent as it is to the receiver
# argv[2] (a JSON list) over argv[1] "ssh" (keys directory, host, port, user: asyncssh) or "exec" (the exec argv
# as JSON), and the receiver's answer validated. The least client of the contract's shape, one step after
# another (bench/dispatch_latency.py, remote_status.py).
LEAST_PAIR = """
import json, shlex, sys
from pydantic import BaseModel
class Request(BaseModel):
    schema_version: int
    operation: str
    agent_id: str | None = None
payload = sys.stdin.buffer.read()
Request.model_validate_json(payload)
receiver = json.loads(sys.argv[2])
if sys.argv[1] == "ssh":
    import asyncio, asyncssh
    directory, host, port, user = sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6]
    async def call():
        async with asyncssh.connect(host, port=port, username=user, client_keys=[directory + "/client_key"],
                                    known_hosts=directory + "/known_hosts", config=None, agent_path=None) as link:
            return (await link.run(shlex.join(receiver), input=payload, encoding=None, check=True)).stdout
    answer = asyncio.run(call())
else:
    import subprocess
    argv = [*json.loads(sys.argv[3]), *receiver]
    answer = subprocess.run(argv, input=payload, capture_output=True, check=True).stdout
Request.model_validate_json(answer)
"""

# The least pydantic program that answers a request: one model of the request's three fields, the request
# read from stdin and validated, the model printed. Any program that validates its input with pydantic
# pays at least this (an interpreter, pydantic's import, one model's class and schema built at first use):
# the floor beside wb's receiver and caller (docs/benchmarks.md#what-is-left-and-whose-it-is).
LEAST_PYDANTIC = """
import sys
from pydantic import BaseModel
class Request(BaseModel):
    schema_version: int
    operation: str
    agent_id: str | None = None
sys.stdout.write(Request.model_validate_json(sys.stdin.buffer.read()).model_dump_json())
"""


def machine_description() -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = ""
    with contextlib.suppress(OSError, ValueError, IndexError):
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kib / 1024 / 1024:.1f} GiB RAM"
    ssh_version = subprocess.run([SSH, "-V"], capture_output=True, text=True, check=False).stderr.strip()
    scratch = tempfile.gettempdir()
    return (
        f"{platform.system()} {platform.release()}, {os.cpu_count()} CPUs ({cpu}){mem}; "
        f"Python {platform.python_version()}; {ssh_version}; {scratch} on {disk_description(Path(scratch))}"
    )


def disk_description(path: Path) -> str:
    """The filesystem `path` is on (where the benches' clones, worktrees and records live), and for ext4 whether
    it has a journal: without one, each new file scans past the inodes deleted in the last minute, which a
    dispatch after many pruned runs pays for (docs/benchmarks.md, the fifth session of 2026-12-07)."""
    try:
        device = os.stat(path).st_dev
        wanted = f"{os.major(device)}:{os.minor(device)}"
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            before, _, after = line.partition(" - ")
            if before.split()[2] != wanted:
                continue
            fstype, source = after.split()[:2]
            if fstype != "ext4":
                return fstype
            journal = Path("/sys/fs/ext4", os.path.basename(source), "journal_task").read_text().strip()
            return "ext4 without a journal" if journal == "<none>" else "ext4 with a journal"
    except (OSError, ValueError, IndexError):
        pass
    return "an unknown filesystem"


# -- timing --------------------------------------------------------------------------------


def run_timed(
    argv: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    stdin_path: Path | None = None,
    expect: int | None = 0,
) -> float:
    """Wall seconds of one command from spawn to exit; its output is discarded."""
    stdin = open(stdin_path, "rb") if stdin_path else subprocess.DEVNULL  # noqa: SIM115
    try:
        started = time.perf_counter()
        completed = subprocess.run(
            list(argv),
            env=env,
            stdin=stdin,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=SUBPROCESS_TIMEOUT_S,
            check=False,
        )
        elapsed = time.perf_counter() - started
    finally:
        if stdin_path:
            stdin.close()  # type: ignore[union-attr]
    if expect is not None and completed.returncode != expect:
        raise RuntimeError(
            f"{' '.join(argv)} exited {completed.returncode}: {completed.stderr.decode(errors='replace')[-800:]}"
        )
    return elapsed


def run_output(argv: Sequence[str], *, env: dict[str, str] | None = None, stdin_path: Path | None = None) -> str:
    stdin = open(stdin_path, "rb") if stdin_path else subprocess.DEVNULL  # noqa: SIM115
    try:
        completed = subprocess.run(
            list(argv), env=env, stdin=stdin, capture_output=True, timeout=SUBPROCESS_TIMEOUT_S, check=False
        )
    finally:
        if stdin_path:
            stdin.close()  # type: ignore[union-attr]
    if completed.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {completed.returncode}: {completed.stderr.decode()[-800:]}")
    return completed.stdout.decode()


def interleaved(subjects: dict[str, Callable[[], float]], repetitions: int, warmup: int = 1) -> dict[str, list[float]]:
    """Run each subject once per round, in turn, for `repetitions` rounds after `warmup` unrecorded ones."""
    samples: dict[str, list[float]] = {name: [] for name in subjects}
    for round_number in range(warmup + repetitions):
        for name, subject in subjects.items():
            value = subject()
            if round_number >= warmup:
                samples[name].append(value)
    return samples


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (p99 of 40 samples is the largest but one... or the largest)."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-pct * len(ordered) // 100))))
    return ordered[rank - 1]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


@dataclass
class Row:
    """One line of the results table."""

    benchmark: str
    subject: str
    yardstick: str
    ratio: str
    target: str
    ok: bool | None
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    details: list[str] = field(default_factory=list)

    def add(self, row: Row) -> None:
        self.rows.append(row)
        print(f"  {row.benchmark}: {row.subject} vs {row.yardstick} -> {row.ratio} (target {row.target})", flush=True)

    def detail(self, text: str) -> None:
        self.details.append(text)
        print(f"  {text}", flush=True)


def table(rows: Sequence[Row]) -> str:
    header = ["benchmark", "ours", "yardstick", "ratio / figure", "target", "met", "note"]
    body = [
        [
            r.benchmark,
            r.subject,
            r.yardstick,
            r.ratio,
            r.target,
            "-" if r.ok is None else ("yes" if r.ok else "NO"),
            r.note,
        ]
        for r in rows
    ]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    out = ["| " + " | ".join(cell.ljust(w) for cell, w in zip(header, widths, strict=True)) + " |"]
    out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for line in body:
        out.append("| " + " | ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)) + " |")
    return "\n".join(out)


# -- records on disk -----------------------------------------------------------------------


def _record_body(agent_id: str, started_at: str, state: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "schema_version": 1,
        "agent_id": agent_id,
        "state": state,
        "profile": "fake",
        "resolved": {
            "profile": "fake",
            "harness": "codex",
            "provider": "mock",
            "model": "gpt-5.5",
            "reasoning": "high",
            "routing": {
                "base_url": "http://127.0.0.1:9/v1",
                "credential_env": "TEST_PROVIDER_KEY",
                "wire_api": "responses",
            },
        },
        "repository": "acme/widget",
        "worktree_mode": "new",
        "worktree": "w1",
        "branch": "wb/w1",
        "base": "main",
        "base_sha": "0123456789abcdef0123456789abcdef01234567",
        "timeout_ms": 1_800_000,
        "started_at": started_at,
    }
    if state != "running":
        body.update(
            finished_at=started_at,
            duration_ms=61_000,
            exit_code=0,
            result="Done: the widget now validates its input.",
            tool_calls=12,
            usage={"input_tokens": 12000, "cached_input_tokens": 9000, "output_tokens": 800},
            changes={"files_changed": 2, "files": ["src/a.py", "tests/test_a.py"], "insertions": 40, "deletions": 3},
        )
    return body


def write_records(home: Path, count: int, *, state: str = "completed") -> list[str]:
    """`count` records as the store writes them (run.json 0600 in a 0700 dir), without a harness.

    Written without the store's per-file fsync, so 10,000 of them take seconds, not minutes;
    the bytes on disk are the same shape `Store.save` produces (validated through `Record`).
    """
    from courier.runs.store import HARNESS_HOME, RECORD, TASK, Record, Store
    from protocol.refs import new_run_id

    store = Store(home).ensure()
    ids: list[str] = []
    base = time.time() - count
    for index in range(count):
        agent_id = new_run_id()
        moment = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(base + index)) + ".000Z"
        body = _record_body(agent_id, moment, state)
        if index == 0:
            Record.model_validate(body)  # the shape is the store's own
        run_dir = store.run_dir(agent_id)
        os.mkdir(run_dir, 0o700)
        os.mkdir(run_dir / HARNESS_HOME, 0o700)
        for name, data in ((TASK, b"bench task\n"), (RECORD, json.dumps(body, indent=2).encode() + b"\n")):
            fd = os.open(run_dir / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        ids.append(agent_id)
    return ids


# -- environments and machines -------------------------------------------------------------


def base_env(**extra: str) -> dict[str, str]:
    """The environment every measured command gets: no pyenv shims in front, no real config."""
    env = {
        key: value for key, value in os.environ.items() if not key.startswith(("WB_", "PYENV_VERSION", "PYTHONPROFILE"))
    }
    env["PATH"] = f"{Path(PYTHON).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    env.pop("PYTHONPATH", None)
    if TREE:
        env["PYTHONPATH"] = TREE
    env["WB_COURIER"] = "off"  # the cold path unless a benchmark asks for the warm one (bench/warm.py)
    env.update(extra)
    return env


def no_config_env(base: Path, **extra: str) -> dict[str, str]:
    """`base_env` for a machine without a wb.yaml: the built-in settings (docs/config.md#where-the-file-is).

    Not a WB_CONFIG naming a missing file: wb refuses that (a file WB_CONFIG names must exist).
    The default location is under XDG_CONFIG_HOME, pointed at a directory that holds nothing.
    """
    return base_env(XDG_CONFIG_HOME=str(base / "no-config-here"), **extra)


def ensure_bytecode() -> None:
    """Compile the measured tree's modules, as `pip install` does for a user's wb.

    An editable checkout leaves bytecode to the first import, and an environment with
    PYTHONDONTWRITEBYTECODE=1 (this workplace's shells have it) never writes it: every measured
    `wb` would then compile its sources again, 25-35 ms of each start that no installed wb pays.
    """
    tree = Path(TREE) if TREE else REPO_ROOT
    dirs = [str(tree / name) for name in ("courier", "protocol") if (tree / name).is_dir()]
    subprocess.run([PYTHON, "-m", "compileall", "-q", *dirs], check=True, stdout=subprocess.DEVNULL)


@contextlib.contextmanager
def workdir(prefix: str) -> Iterator[Path]:
    ensure_bytecode()
    path = Path(tempfile.mkdtemp(prefix=f"wb-bench-{prefix}-"))
    path.chmod(0o700)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@dataclass
class Fleet:
    """Loopback sshd machines m1..mN, a wb.yaml naming them and the client env that reaches them."""

    factory: SshdFactory
    servers: list[SshdServer]
    config_path: Path
    local_home: Path

    def machine(self, index: int) -> str:
        return f"m{index + 1}"

    def env(self, **extra: str) -> dict[str, str]:
        settings = {
            "WB_CONFIG": str(self.config_path),
            "WB_SSH_CONFIG": str(self.factory.client_config),
            "WB_HOME": str(self.local_home),
        }
        settings.update(extra)
        return base_env(**settings)

    def ssh_argv(self, server: SshdServer, *command: str) -> list[str]:
        """OpenSSH with the same config, key and known_hosts as wb: a fresh connection, no multiplexing."""
        return [
            SSH,
            "-F",
            str(self.factory.client_config),
            "-o",
            "ControlMaster=no",
            "-o",
            "ControlPath=none",
            "-o",
            "BatchMode=yes",
            "-T",
            "-p",
            str(server.port),
            f"root@{server.host}",
            *command,
        ]

    def least_clients(self, server: SshdServer, command: str = "wb --wb-internal-agent-remote") -> dict[str, list[str]]:
        """The two floors of a cold remote command, each running `command` on `server` with the request on stdin:
        "asyncssh", the least asyncssh client (ASYNCSSH_FLOOR: no validation), and "validating", the least client
        of the contract's shape (LEAST_PAIR: the request and the answer validated with pydantic)."""
        keys = str(self.factory.client_config.parent)
        user = getpass.getuser()
        where = [keys, server.host, str(server.port)]
        return {
            "asyncssh": [PYTHON, "-c", ASYNCSSH_FLOOR, *where, command, user],
            "validating": [PYTHON, "-c", LEAST_PAIR, "ssh", json.dumps(command.split()), *where, user],
        }


def exec_target(server: SshdServer) -> dict[str, Any]:
    """The same machine as an exec target: its home, projects and config, reached without SSH."""
    argv = [
        "env",
        f"WB_HOME={server.wb_home}",
        f"WB_PROJECTS_ROOT={server.projects_root}",
        f"WB_CONFIG={server.root / 'remote-wb.yaml'}",
    ]
    if TREE:
        argv.append(f"PYTHONPATH={TREE}")
    return {"exec": {"argv": argv, "wb_path": WB}}


def write_config(factory: SshdFactory, name: str, servers: Sequence[SshdServer]) -> Path:
    """A wb.yaml naming m1..mN over `CHANNEL`."""
    if CHANNEL != "exec":
        return factory.write_wb_config(name, {f"m{i + 1}": factory.target(s) for i, s in enumerate(servers)})
    import yaml

    path = factory.config_dir / f"{name}.yaml"
    targets = {f"m{i + 1}": exec_target(s) for i, s in enumerate(servers)}
    path.write_text(yaml.safe_dump({"session_move": {"targets": targets}}))
    path.chmod(0o600)
    return path


@contextlib.contextmanager
def fleet(size: int, base: Path, *, name: str = "fleet") -> Iterator[Fleet]:
    """Start `size` sshd machines on 127.0.0.2.. (loopback only); all are stopped on the way out."""
    if size > 200:
        raise ValueError("a fleet is at most 200 loopback machines")
    reason = sshd_unavailable_reason()
    if reason:
        raise RuntimeError(f"cannot start loopback sshd: {reason}")
    factory = SshdFactory(base / name)
    try:
        servers = [factory.start(f"127.0.0.{index + 2}") for index in range(size)]
        if TREE:
            for server in servers:
                server.script("wb", f'PYTHONPATH={TREE} exec {WB} "$@"\n')
        config_path = write_config(factory, name, servers)
        local_home = base / name / "local-wbhome"
        local_home.mkdir(mode=0o700)
        yield Fleet(factory, servers, config_path, local_home)
    finally:
        factory.close()
