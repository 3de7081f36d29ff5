"""Dispatch latency (issue 35, "A run starts in 100 ms"; docs/benchmarks.md#dispatch-latency).

Through the installed `wb` (this interpreter's console script, as a user runs it), the time from
just before `wb agent dispatch` is started to

- **first instruction**: the first instruction of a `command` harness's program
  (`date +%s%N > started-at`: it writes the wall clock, converted here to CLOCK_MONOTONIC);
- **first model request**: the first request of the bundled stand-in Codex
  (`courier.demo.standin_codex`, a wb module, as `wb demo` installs it) reaching the scripted
  model server (`courier.demo.model_server`, in a process of its own that writes the
  CLOCK_MONOTONIC time of every request it receives);

for each way a machine is reached: **local** (this machine), **ssh** (a loopback OpenSSH sshd,
tests/integration/sshd.py), **exec** (`env -i -C HOME … wb`, as tests/integration/exec_machines.py's
exec-env tier) and **ray** (a local cluster of 3 nodes × 2 cpus as bench/ray.py starts it,
reached as the exec machine `lab`, after one run); each **warm** (the courier on, after one
warm-up dispatch) and **cold** (`WB_COURIER=off`), with the profile's `sandbox: "off"` and
`sandbox: auto` (bubblewrap). Each row: `--runs` untraced runs (the headline figures) and as
many traced runs (`WB_STAGE_TRACE` set: courier/stage_trace.py's marks give the breakdown by
stage), interleaved. After each run `wb agent prune --older-than 0s --worktrees` removes it, its
worktree and its `wb/` branch, so every dispatch meets the same clone (the count of `wb/`
branches at each dispatch is printed: confinement's cost grows with it, docs/benchmarks.md#confinement)
and the same store. Also: 20 concurrent warm dispatches to one machine (local, ssh, exec),
`sandbox: "off"`, after a warm-up dispatch on that machine: the spread of the workers' first
instructions, and the time from the first dispatch's start to the last worker's first instruction;
each round twice, with runs that end at their first instruction and with runs that live on (as an
agent's does) until the last one has started (HELD_PROGRAM).

Floors beside each figure: the program (or the stand-in) run directly, `python -c pass`,
`ssh m1 true` (OpenSSH, same sshd, no multiplexing) and the exec argv running `true`. And for the
cold ssh and exec rows, the least pydantic pair (bench/common.py LEAST_PAIR): a caller that validates a request
with pydantic and hands it, over asyncssh or the exec argv, to the least pydantic receiver
(bench/common.py LEAST_PYDANTIC), which validates it again. The protocol has both ends validate
with the same pydantic models, so no cold remote dispatch can come sooner; what a cold row takes
above the pair is wb's own (docs/benchmarks.md#what-is-left-and-whose-it-is).

    python bench/dispatch_latency.py [--quick] [--runs N] [--paths local,ssh,exec,ray] [--json PATH]

Needs root and OpenSSH (the sshd machines), bubblewrap for the confined rows, and for the Ray
rows the extra wb[ray], unshare and nsenter (skipped, and said, when missing).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml

from bench import common

RUNS = 10
QUICK_RUNS = 3
CONCURRENT = 20
CONCURRENT_ROUNDS = 3
REPOSITORY = "acme/widget"
# A run's first instruction (or first model request) normally comes well within a second; one
# that has not come by then on a loaded machine still counts, one that never comes is a failure.
FIRST_WAIT_S = 120.0
POLL_S = 0.005  # the program writes its own time: how often it is looked for only delays the next run
NS_PER_MS = 1_000_000
TRACE_ENV = "WB_STAGE_TRACE"  # courier/stage_trace.py ENV (not imported: the bench must not load wb itself)
# The program's first instruction: one `date` (a builtin would need bash), as bench/confinement.py.
PROGRAM = "#!/bin/sh\ndate +%s%N > started-at\n"
# The same first instruction in a run that lives on, as an agent's does, until the bench lets it go: it
# opens the gate (a FIFO the bench holds open, so the open does not wait), then reads it to its end,
# which comes when the bench closes it. In a burst of runs that end at once, twenty run ends (each
# with its git processes) share the two cores with the starts being measured.
HELD_PROGRAM = "#!/bin/sh\nexec 3<{gate}\ndate +%s%N > started-at\nread _ <&3\nexit 0\n"
HELD_PROFILE = "held"
PROVIDER = "scripted"
MODEL = "gpt-5.5"
CREDENTIAL = "sk-bench-dispatch-latency-0123456789"
# Targets of issue 35, milliseconds; None: "the floor + this many ms" rows are below.
TARGET_MS = {
    ("local", "warm"): 100.0,
    ("local", "cold"): 250.0,
    ("ssh", "warm"): 150.0,
    ("exec", "warm"): 150.0,
    ("ssh-login", "warm"): 150.0,
    ("exec-login", "warm"): 150.0,
    ("ray", "warm"): 500.0,
    ("ray", "cold"): 500.0,
}
QUIET_WAIT_S = 120.0  # before each path's rows, at most this long for the machine to calm down
QUIET_SAMPLE_S = 2.0
QUIET_BUSY = 0.25  # a quarter of the CPUs busy: other agents' idle work, not a cluster starting
ABOVE_FLOOR_MS = 150.0  # ssh and exec cold: at most their floor (`ssh m1 true`, the exec argv's `true`) + this
CONCURRENT_TARGET_MS = 1000.0  # 20 concurrent warm dispatches all started within 1 s
# `-login`: the same machine with `courier.dispatch_over_serve: false`, a new login per dispatch (docs/courier.md,
# "Environment"): warm rows only.
PATHS = ("local", "ssh", "exec", "ssh-login", "exec-login", "ray")
SANDBOXES = {"plain": "off", "confined": "auto"}
HARNESSES = ("command", "model")


def profile_name(harness: str, sandbox: str) -> str:
    return sandbox if harness == "command" else f"model-{sandbox}"


def agents_config(program: Path, held: Path, base_url: str, credential_file: Path) -> dict[str, Any]:
    """The providers and profiles every machine of the benchmark has (docs/config.md)."""
    profiles: dict[str, Any] = {HELD_PROFILE: {"harness": "command", "command": [str(held)], "sandbox": "off"}}
    for sandbox, mode in SANDBOXES.items():
        profiles[profile_name("command", sandbox)] = {"harness": "command", "command": [str(program)], "sandbox": mode}
        profiles[profile_name("model", sandbox)] = {
            "harness": "codex",
            "provider": PROVIDER,
            "model": MODEL,
            "sandbox": mode,
        }
    providers = {
        PROVIDER: {
            "base_url": base_url,
            "credential_file": str(credential_file),
            "wire_api": "responses",
            "request_max_retries": 0,
            "stream_max_retries": 0,
        }
    }
    return {"providers": providers, "profiles": profiles}


def write_yaml(path: Path, document: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    path.chmod(0o600)
    return path


def git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@example.com", "GIT_COMMITTER_NAME": "b",
           "GIT_COMMITTER_EMAIL": "b@example.com", "GIT_CONFIG_GLOBAL": "/dev/null",
           "GIT_CONFIG_NOSYSTEM": "1"}  # fmt: skip
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def make_clone(projects_root: Path) -> Path:
    clone = projects_root / REPOSITORY
    clone.mkdir(parents=True)
    git(clone, "init", "-q", "-b", "main")
    (clone / "README.md").write_text("bench\n")
    git(clone, "add", "README.md")
    git(clone, "commit", "-q", "-m", "initial")
    return clone


def wb_branches(clones: list[Path]) -> int:
    """How many `wb/` branches the clones hold now (each one a read-only bind of a confined run)."""
    count = 0
    for clone in clones:
        if (clone / ".git").exists():
            count += len(git(clone, "for-each-ref", "--format=%(refname)", "refs/heads/wb/").split())
    return count


# -- the scripted model server, in a process of its own ----------------------------------------------


def serve_model(times_path: str, port_path: str) -> int:
    """Run the scripted model server until stdin closes, appending `<CLOCK_MONOTONIC ns> <path>` per request."""
    from courier.demo.model_server import ModelServer
    from courier.demo.scripted_http import RecordedRequest

    class Timed(ModelServer):
        def _record(self, request: RecordedRequest) -> None:
            line = f"{time.monotonic_ns()} {request.method} {request.path}\n".encode()
            fd = os.open(times_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
            super()._record(request)

    server = Timed(scenario="write-file")
    server.start()
    Path(port_path).write_text(server.base_url)
    sys.stdin.read()  # until the benchmark closes it
    server.stop()
    return 0


@dataclass
class ModelProcess:
    process: subprocess.Popen[bytes]
    times: Path
    base_url: str

    @classmethod
    def start(cls, directory: Path, prefix: list[str] | None = None) -> ModelProcess:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        times, port = directory / "requests", directory / "base-url"
        process = subprocess.Popen(
            [*(prefix or []), common.PYTHON, str(Path(__file__).resolve()), "--serve-model", str(times), str(port)],
            stdin=subprocess.PIPE,
            cwd=common.REPO_ROOT,
        )
        deadline = time.monotonic() + FIRST_WAIT_S
        while not port.exists() or not port.read_text():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the scripted model server did not start")
            time.sleep(POLL_S)
        return cls(process, times, port.read_text())

    def size(self) -> int:
        return self.times.stat().st_size if self.times.exists() else 0

    def first_after(self, offset: int) -> int | None:
        """The CLOCK_MONOTONIC ns of the first request recorded after byte `offset`, or None yet."""
        if self.size() <= offset:
            return None
        with open(self.times, "rb") as handle:
            handle.seek(offset)
            line = handle.readline()
        return int(line.split()[0]) if line.endswith(b"\n") else None

    def stop(self) -> None:
        assert self.process.stdin is not None
        with contextlib.suppress(OSError):
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()


# -- where a dispatch goes ----------------------------------------------------------------------------


@dataclass
class Where:
    """One way of reaching a machine: its name in wb.yaml (untraced and traced), the caller's environment,
    where its runs' worktrees appear and its floor."""

    path: str
    machine: str
    traced_machine: str
    env: dict[str, str]  # the caller's, cold; warm and traced are derived
    trace: Path
    projects_roots: list[Path]
    model: ModelProcess
    floor_name: str
    floor_ms: list[float]  # the CLI's own start with no wb in front (the first-instruction rows)
    model_floor_ms: list[float]  # the stand-in run directly (the first-model-request rows)
    # Measured again just before the path's rows, once the machine is quiet (measure_path): the command
    # behind floor_ms, and the information floors beside the cold rows (name → argv).
    floor_argv: list[str] | None = None
    more_floors: dict[str, list[str]] = field(default_factory=dict)

    def caller_env(self, warm: bool, traced: bool) -> dict[str, str]:
        env = dict(self.env)
        env["WB_COURIER"] = "on" if warm else "off"
        if traced:
            env[TRACE_ENV] = str(self.trace)
        return env

    def target(self, traced: bool) -> list[str]:
        machine = self.traced_machine if traced else self.machine
        return ["--to", machine] if machine else []

    def clones(self) -> list[Path]:
        return [root / REPOSITORY for root in self.projects_roots]

    def stamps(self, worktree: str) -> list[Path]:
        owner, repo = REPOSITORY.split("/")
        return [root / ".wb-worktrees" / owner / repo / worktree / "started-at" for root in self.projects_roots]


@dataclass
class Sample:
    first_ms: float
    returned_ms: float
    branches: int
    stages: list[tuple[str, float]] | None = None  # (stage label, ms) in order, traced runs only
    marks_found: int = 0
    marks_expected: int = 0
    # A cold SSH command's carrier, beside the plan (it runs in parallel): asyncssh imported, and the call handed to it.
    carrier_ready_ms: float | None = None
    call_sent_ms: float | None = None


def wb(env: dict[str, str], *args: str, timeout: float = common.SUBPROCESS_TIMEOUT_S) -> str:
    done = subprocess.run([common.WB, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"wb {' '.join(args)} exited {done.returncode}: {done.stderr[-800:]}")
    return done.stdout


class Runner:
    """Numbers each run's worktree and does one measured dispatch at a time."""

    def __init__(self) -> None:
        self.count = 0

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def once(self, where: Where, warm: bool, sandbox: str, harness: str, traced: bool) -> Sample:
        env = where.caller_env(warm, traced)
        worktree = self.name(f"{where.path[0]}{'w' if warm else 'c'}")
        branches = wb_branches(where.clones())
        model_offset = where.model.size()
        trace_offset = where.trace.stat().st_size if where.trace.exists() else 0
        argv = [common.WB, "agent", "dispatch", *where.target(traced), "--new-worktree", worktree, "--profile",
                profile_name(harness, sandbox), "--repo", REPOSITORY, "--task", "bench"]  # fmt: skip
        wall0 = time.time_ns()
        mono0 = time.monotonic_ns()
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=FIRST_WAIT_S, check=False)
        returned = time.monotonic_ns()
        if done.returncode != 0:
            raise RuntimeError(f"dispatch exited {done.returncode}: {done.stderr.strip()[-800:]}")
        reference = done.stdout.split()[0]
        first = self.first(where, worktree, harness, model_offset, wall0 - mono0)
        self.settle(where, env, reference, sandbox, traced)
        sample = Sample((first - mono0) / NS_PER_MS, (returned - mono0) / NS_PER_MS, branches)
        if traced:
            marks = read_marks(where.trace, trace_offset, mono0, first)
            plan = expected_marks(where.path, warm)
            found = match_marks(marks, plan)
            sample.stages = stages_of(found, mono0, first)
            offsets = {name: (ns - mono0) / NS_PER_MS for name, _, ns in reversed(marks)}  # each name's first
            sample.carrier_ready_ms, sample.call_sent_ms = offsets.get("carrier.ready"), offsets.get("call.send")
            sample.marks_found, sample.marks_expected = len(found), len(plan) - (0 if sandbox == "confined" else 1)
        return sample

    def first(self, where: Where, worktree: str, harness: str, model_offset: int, wall_minus_mono: int) -> int:
        """The CLOCK_MONOTONIC ns of the run's first instruction (or first model request)."""
        deadline = time.monotonic() + FIRST_WAIT_S
        while time.monotonic() < deadline:
            if harness == "model":
                seen = where.model.first_after(model_offset)
                if seen is not None:
                    return seen
            else:
                for stamp in where.stamps(worktree):
                    with contextlib.suppress(OSError, ValueError):
                        text = stamp.read_text()
                        if text.endswith("\n"):
                            return int(text) - wall_minus_mono
            time.sleep(POLL_S)
        what = "model request" if harness == "model" else "instruction"
        raise RuntimeError(f"run {worktree} on {where.path}: no first {what} within {FIRST_WAIT_S:.0f} s")

    def settle(self, where: Where, env: dict[str, str], reference: str, sandbox: str, traced: bool) -> None:
        """Await the run (it must have completed, confined as asked), then prune it with its worktree and branch.

        Each machine name is asked with one caller environment only: the courier replaces an exec machine's
        serve process when another environment calls it (courier/channels/exec.py, run_warm), which would
        send the next dispatch to a Ray head as one process while the new serve process is prepared.
        """
        final = json.loads(wb(env, "agent", "await", reference, "--json", timeout=FIRST_WAIT_S))
        if final.get("state") != "completed":
            raise RuntimeError(f"{reference} ended {final.get('state')}: {final.get('failure')}")
        kind = (final.get("sandbox") or {}).get("kind")
        expected = "bwrap" if sandbox == "confined" else "none"
        if kind != expected:
            raise RuntimeError(f"{reference} ran with sandbox {final.get('sandbox')}, not {expected}")
        wb(env, "agent", "prune", *where.target(traced), "--older-than", "0s", "--worktrees")


# -- the stage marks ----------------------------------------------------------------------------------

Mark = tuple[str, int, int]  # name, pid, CLOCK_MONOTONIC ns

OWNER_MARKS = ("main.owner", "owner.main", "sandbox.probe", "sandbox.decided", "sandbox.plan", "sandbox.planned",
               "sandbox.argv", "owner.exec")  # fmt: skip
ADMISSION_MARKS = ("perform.start", "admission.start", "admission.locked", "worktree.start", "worktree.added",
                   "record.created")  # fmt: skip

# (previous mark, this mark) → (what happened between them, its category). "t0": just before the dispatch
# was started; "first": the first instruction (or model request).
STAGES: dict[tuple[str, str], tuple[str, str]] = {
    ("t0", "main.cli"): ("interpreter start to wb's main", "caller"),
    ("main.cli", "courier.child"): ("thin client → the courier's child (socket, fork)", "channel"),
    ("courier.child", "client.start"): ("command parsed, wb.yaml read, request built (courier's child)", "caller"),
    ("main.cli", "client.start"): ("imports, command parsed, wb.yaml read, request built", "caller"),
    ("client.start", "perform.start"): ("local transport: request checked", "caller"),
    ("client.start", "call.send"): ("caller: transport and call set-up", "caller"),
    ("call.send", "ssh.connect"): ("caller: asyncssh imported", "caller"),
    ("ssh.connect", "ssh.connected"): ("SSH connection: TCP, key exchange, authentication", "channel"),
    ("ssh.connected", "main.receiver"): ("SSH session, remote shell, receiver's interpreter start", "channel"),
    ("call.send", "main.receiver"): ("channel: receiver started (session/exec) to its main", "channel"),
    ("call.send", "session.request"): ("channel: courier → the head's serve session", "channel"),
    ("main.receiver", "receiver.imported"): ("receiver: models imported", "receiver"),
    ("main.cli", "main.receiver"): ("exec receiver started before the caller's imports, to its main", "channel"),
    # Started early, the receiver waits here for the caller's request; a Ray head joins its cluster first.
    ("receiver.imported", "receiver.read"): ("receiver: request read (a head: its cluster joined first)", "receiver"),
    ("receiver.read", "perform.start"): ("receiver: request decoded and checked", "receiver"),
    ("session.request", "perform.start"): ("serve session: request decoded and checked", "receiver"),
    ("perform.start", "ray.place"): ("head: executor chosen, wb.yaml loaded", "receiver"),
    ("ray.place", "ray.checked"): ("Ray head: profile checked, nodes with the clone found", "ray"),
    ("ray.checked", "ray.submitted"): ("Ray head: placement recorded, holder task submitted", "ray"),
    # The holder may start on its node before the head's submission call has returned (ray.submitted is later).
    ("ray.checked", "ray.holder"): ("Ray: placement recorded, holder submitted and started (submit not yet returned)",
                                    "ray"),
    ("ray.submitted", "ray.holder"): ("Ray: holder task scheduled and started on a node", "ray"),
    ("ray.holder", "ray.claimed"): ("Ray: holder claimed the run from the head's service", "ray"),
    ("ray.claimed", "perform.start"): ("Ray node: request handed to perform", "ray"),
    ("perform.start", "admission.start"): ("admission: executor chosen, wb.yaml loaded", "admission and record"),
    ("admission.start", "admission.locked"): (
        "admission: checks (profile, credential, clone, branch name), the worktree's lock",
        "admission and record",
    ),
    ("admission.locked", "worktree.start"): ("admission: worktree in use? (its holder), HEAD", "admission and record"),
    ("worktree.start", "worktree.added"): ("the clone's lock, git worktree add", "worktree"),
    ("worktree.added", "record.created"): ("record created (run directory, run.json)", "admission and record"),
    ("record.created", "main.owner"): ("owner spawned (double fork, exec) to its main", "owner start"),
    ("main.owner", "owner.main"): ("owner: imports", "owner start"),
    ("owner.main", "sandbox.probe"): ("owner: record claimed, run lock, harness loaded", "owner start"),
    ("sandbox.probe", "sandbox.decided"): ("sandbox: bubblewrap probe", "sandbox"),
    ("sandbox.decided", "sandbox.plan"): ("owner: metering relay started (a run with a provider)", "owner start"),
    ("sandbox.plan", "sandbox.planned"): ("sandbox: plan (directories, relay socket)", "sandbox"),
    ("sandbox.planned", "sandbox.argv"): ("owner: harness home, environment", "owner start"),
    ("sandbox.planned", "owner.exec"): ("owner: harness home, environment", "owner start"),
    ("sandbox.argv", "owner.exec"): ("sandbox: bubblewrap's command line (binds)", "sandbox"),
    ("owner.exec", "first"): ("harness start: exec to first instruction (inside bubblewrap when confined)", "harness"),
}
CATEGORIES = ("caller", "channel", "receiver", "ray", "admission and record", "worktree", "owner start", "sandbox",
              "harness")  # fmt: skip


def expected_marks(path: str, warm: bool) -> list[tuple[str, str]]:
    """The marks on the way from the dispatch to the worker, in order, each with its process's group: the marks
    of one group come from one process (a stray mark of another process is not taken for them)."""
    caller = [("main.cli", "thin" if warm else "cli"), *([("courier.child", "cli")] if warm else []),
              ("client.start", "cli")]  # fmt: skip
    owner = [(name, "owner") for name in OWNER_MARKS]
    if path == "local":
        return [*caller, *((name, "cli") for name in ADMISSION_MARKS), *owner]
    if path == "ray":
        head = [("session.request", "head")] if warm else [
            ("main.receiver", "head"), ("receiver.imported", "head"), ("receiver.read", "head")]  # fmt: skip
        ray = [("perform.start", "head"), ("ray.place", "head"), ("ray.checked", "head"), ("ray.submitted", "head"),
               ("ray.holder", "node"), ("ray.claimed", "node")]  # fmt: skip
        return [*caller, ("call.send", "cli"), *head, *ray, *((name, "node") for name in ADMISSION_MARKS), *owner]
    connect = [("ssh.connect", "cli"), ("ssh.connected", "cli")] if path == "ssh" and not warm else []
    receiver = [("main.receiver", "recv"), ("receiver.imported", "recv"), ("receiver.read", "recv")]
    return [*caller, ("call.send", "cli"), *connect, *receiver, *((name, "recv") for name in ADMISSION_MARKS), *owner]


def read_marks(trace: Path, offset: int, start: int, end: int) -> list[Mark]:
    if not trace.exists():
        return []
    with open(trace, "rb") as handle:
        handle.seek(offset)
        lines = handle.read().decode().splitlines()
    marks = []
    for line in lines:
        name, pid, ns = line.split()
        if start <= int(ns) <= end:
            marks.append((name, int(pid), int(ns)))
    return sorted(marks, key=lambda mark: mark[2])


def match_marks(marks: list[Mark], plan: list[tuple[str, str]]) -> list[tuple[str, int]]:
    """The plan's marks found, in order: each the first of its name after the previous one found, from its
    group's process."""
    pids: dict[str, int] = {}
    found: list[tuple[str, int]] = []
    at = 0
    for name, pid, ns in marks:
        for index in range(at, len(plan)):
            wanted, group = plan[index]
            if wanted == name and pids.get(group, pid) == pid:
                pids[group] = pid
                found.append((name, ns))
                at = index + 1
                break
    return found


def stages_of(found: list[tuple[str, int]], start: int, first: int) -> list[tuple[str, float]]:
    points = [("t0", start), *found, ("first", first)]
    return [
        (f"{before[0]} → {after[0]}", (after[1] - before[1]) / NS_PER_MS)
        for before, after in itertools.pairwise(points)
    ]


def describe(stage: str) -> tuple[str, str]:
    before, _, after = stage.partition(" → ")
    return STAGES.get((before, after), (stage, "other"))


# -- rows ---------------------------------------------------------------------------------------------


@dataclass
class RowResult:
    path: str
    warm: bool
    sandbox: str
    harness: str
    untraced: list[Sample]
    traced: list[Sample]
    floor_name: str
    floor_ms: float
    load: tuple[float, float]
    paired: dict[str, list[float]] = field(default_factory=dict)  # floor name → its time beside each untraced run

    @property
    def courier(self) -> str:
        return "warm" if self.warm else "cold"

    def target_ms(self) -> float | None:
        if self.harness != "command":
            return None
        target = TARGET_MS.get((self.path, self.courier))
        if target is None and self.path in ("ssh", "exec"):
            return self.floor_ms + ABOVE_FLOOR_MS
        return target

    def figures(self) -> dict[str, Any]:
        firsts = [sample.first_ms for sample in self.untraced]
        traced = [sample.first_ms for sample in self.traced]
        branches = [sample.branches for sample in self.untraced + self.traced]
        target = self.target_ms()
        return {
            "path": self.path,
            "courier": self.courier,
            "sandbox": self.sandbox,
            "to": "first instruction" if self.harness == "command" else "first model request",
            "median_ms": round(statistics.median(firsts), 1),
            "min_ms": round(min(firsts), 1),
            "max_ms": round(max(firsts), 1),
            "returned_ms": round(statistics.median(sample.returned_ms for sample in self.untraced), 1),
            "traced_median_ms": round(statistics.median(traced), 1) if traced else None,
            "floor": f"{self.floor_name} {self.floor_ms:.1f} ms",
            "target_ms": round(target, 1) if target is not None else None,
            "met": None if target is None else statistics.median(firsts) <= target,
            "wb_branches": f"{min(branches)}–{max(branches)}" if min(branches) != max(branches) else str(branches[0]),
            "load": [round(value, 2) for value in self.load],
            "runs": len(firsts),
        }

    def breakdown(self) -> list[tuple[str, str, float, float]]:
        """(stage, category, median ms, share of the traced median) over the traced runs, in order."""
        by_stage: dict[str, list[float]] = {}
        for sample in self.traced:
            for stage, duration in sample.stages or []:
                by_stage.setdefault(stage, []).append(duration)
        total = statistics.median(sample.first_ms for sample in self.traced)
        rows = []
        for stage, durations in by_stage.items():
            label, category = describe(stage)
            middle = statistics.median(durations)
            rows.append((f"{label} ({stage}; {len(durations)} runs)", category, middle, middle / total))
        return rows

    def categories(self) -> dict[str, float]:
        """Per category, the median over the traced runs of its stages' sum."""
        sums: dict[str, list[float]] = {}
        for sample in self.traced:
            per: dict[str, float] = {}
            for stage, duration in sample.stages or []:
                category = describe(stage)[1]
                per[category] = per.get(category, 0.0) + duration
            for category, value in per.items():
                sums.setdefault(category, []).append(value)
        return {category: statistics.median(values) for category, values in sums.items()}


def courier_modes(where: Where) -> dict[str, str]:
    """The courier's mode for each of the row's machines (`serve`, `session`, `probing`; docs/courier.md)."""
    done = subprocess.run([common.WB, "courier", "status", "--json"], env=where.caller_env(True, False),
                          capture_output=True, text=True, check=False)  # fmt: skip
    rows = json.loads(done.stdout).get("machines") or [] if done.returncode == 0 else []
    return {row.get("machine", ""): row.get("mode", "") for row in rows}


def warm_up(runner: Runner, where: Where, sandbox: str, harness: str, notes: list[str]) -> None:
    """The courier on, its connection (or serve process) to this machine open: one run each way first.

    A machine the courier reaches in a serve session must be in one before the row counts as warm: a
    `version` probe that failed (a Ray head asked while its cluster was still starting) leaves the courier
    calling it one process at a time until it restarts (courier/channels/exec.py, ExecPeer).
    """
    for attempt in range(3):
        runner.once(where, True, sandbox, harness, traced=False)
        runner.once(where, True, sandbox, harness, traced=True)
        if where.path == "local":  # no serve session to check
            return
        modes = courier_modes(where)
        wanted = [where.machine, where.traced_machine]
        if all(modes.get(machine) == "serve" for machine in wanted):
            return
        notes.append(f"{where.path}: after warm-up {attempt + 1} the courier's modes were "
                     f"{ {m: modes.get(m) for m in wanted} }; courier restarted")  # fmt: skip
        print(f"  note: {notes[-1]}", flush=True)
        stop_courier(where.caller_env(True, False))
    raise RuntimeError(f"{where.path}: the courier did not reach serve mode")


def measure_row(
    runner: Runner, where: Where, warm: bool, sandbox: str, harness: str, runs: int, notes: list[str]
) -> RowResult:
    load_before = os.getloadavg()[0]
    if warm:
        warm_up(runner, where, sandbox, harness, notes)
    untraced: list[Sample] = []
    traced: list[Sample] = []
    # A cold row's floors of the contract's shape run beside each of its runs, so wb's part above them is read
    # pair by pair (this machine's speed drifts within a row).
    beside = where.more_floors if not warm and harness == "command" else {}
    paired: dict[str, list[float]] = {name: [] for name in beside}
    for _ in range(runs):
        untraced.append(runner.once(where, warm, sandbox, harness, traced=False))
        for name, times in paired.items():
            times.append(common.run_timed(where.more_floors[name]) * 1000)
        traced.append(runner.once(where, warm, sandbox, harness, traced=True))
    floor = statistics.median(where.floor_ms if harness == "command" else where.model_floor_ms)
    floor_name = where.floor_name if harness == "command" else "the stand-in run directly"
    result = RowResult(where.path, warm, sandbox, harness, untraced, traced, floor_name, floor,
                       (load_before, os.getloadavg()[0]), paired)  # fmt: skip
    figures = result.figures()
    print(
        f"  {where.path:5} {result.courier} {sandbox:8} {harness:7}: median {figures['median_ms']} ms "
        f"(min {figures['min_ms']}, max {figures['max_ms']}; traced {figures['traced_median_ms']}), "
        f"returned {figures['returned_ms']} ms, floor {figures['floor']}, wb/ branches {figures['wb_branches']}, "
        f"load {figures['load']}",
        flush=True,
    )
    return result


# -- floors -------------------------------------------------------------------------------------------

RAY_JOIN_FLOOR = "a new Ray driver on the head joining the cluster (RAY_JOIN)"
# A new Ray driver joining the cluster as courier/executor/ray_cluster.py's connect does, then leaving as wb's
# receiver does (os._exit, no ray.shutdown: courier/main.py exit_now).
RAY_JOIN = """
import logging, os, ray
ray.init(address="{address}", namespace="wb-bench-floor", log_to_driver=False, logging_level=logging.ERROR,
         include_dashboard=False)
os._exit(0)
"""

PAIR_FLOOR = "the least pydantic pair over {}"


def least_pair(how: list[str], base: Path, receiver: str = common.LEAST_PYDANTIC) -> list[str]:
    """The least pydantic pair (bench/common.py LEAST_PAIR) over `how` (["ssh", keys, host, port, user] or
    ["exec", argv json]), as one command: its request from a file of this run's directory; `receiver` the far
    side's program (Python source)."""
    request = base / "least-pair-request.json"
    request.write_text(json.dumps({"schema_version": 1, "operation": "dispatch", "agent_id": None}))
    script = [common.PYTHON, "-c", common.LEAST_PAIR, how[0], json.dumps([common.PYTHON, "-c", receiver]), *how[1:]]
    return ["sh", "-c", 'exec "$@" < "$0"', str(request), *script]


def program_floor(program: Path, scratch: Path, runs: int) -> list[float]:
    """The program run directly: from just before its start to its first instruction, ms."""
    scratch.mkdir(exist_ok=True)
    stamp = scratch / "started-at"
    out = []
    for _ in range(runs):
        stamp.unlink(missing_ok=True)
        wall0, mono0 = time.time_ns(), time.monotonic_ns()
        subprocess.run([str(program)], cwd=scratch, check=True)
        out.append((int(stamp.read_text()) - (wall0 - mono0) - mono0) / NS_PER_MS)
    return out


def command_floor(argv: list[str], runs: int) -> list[float]:
    return [common.run_timed(argv) * 1000 for _ in range(runs)]


def session_shell_ms(runs: int) -> tuple[float, float]:
    """What the remote session's shell costs before it runs wb: root's login shell as sshd starts it (`SSH_CLIENT`
    set, so bash reads ~/.bashrc) and the same shell without any rc file, medians in ms. Every command over
    ssh on this machine pays the first, `ssh m1 true` included."""
    import pwd

    entry = pwd.getpwuid(os.getuid())
    shell = entry.pw_shell or "/bin/sh"
    base = ["env", "-i", "PATH=/usr/bin:/bin"]
    as_sshd = [*base, f"HOME={entry.pw_dir}", "SSH_CLIENT=127.0.0.1 22 22", shell, "-c", "true"]
    bare = [*base, "HOME=/nonexistent", shell, "-c", "true"]
    return statistics.median(command_floor(as_sshd, runs)), statistics.median(command_floor(bare, runs))


def mark_cost_us(directory: Path, marks: int = 1000) -> float:
    """What one stage mark costs when tracing is on (an open, a write, a close), µs."""
    from courier import stage_trace

    saved = stage_trace._path
    stage_trace._path = str(directory / "mark-cost")
    try:
        started = time.perf_counter()
        for _ in range(marks):
            stage_trace.mark("cost")
        return (time.perf_counter() - started) / marks * 1e6
    finally:
        stage_trace._path = saved


def standin_floor(model: ModelProcess, bin_dir: Path, scratch: Path, runs: int) -> list[float]:
    """The stand-in Codex run directly with the command line wb gives it: to its first model request, ms."""
    from courier.config import Provider
    from courier.runs.harness.codex import codex_argv

    provider = Provider.model_validate({"base_url": model.base_url, "credential_env": "BENCH_KEY",
                                        "wire_api": "responses", "request_max_retries": 0,
                                        "stream_max_retries": 0})  # fmt: skip
    out = []
    for index in range(runs):
        work = scratch / f"standin-{index}"  # each run its own: the scenario adds a file there
        home = work / "codex-home"
        home.mkdir(parents=True)
        argv = codex_argv(worktree=str(work), model=MODEL, provider_name=PROVIDER, provider=provider,
                          reasoning=None, network=False, last_message_path=str(work / "last-message"),
                          env_key="BENCH_KEY")  # fmt: skip
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(work), "LANG": "C.UTF-8", "CODEX_HOME": str(home),
               "BENCH_KEY": CREDENTIAL}  # fmt: skip
        offset = model.size()
        mono0 = time.monotonic_ns()
        subprocess.run([str(bin_dir / "codex"), *argv[1:]], input=b"bench", env=env, cwd=work,
                       capture_output=True, check=True, timeout=FIRST_WAIT_S)  # fmt: skip
        first = model.first_after(offset)
        assert first is not None, "the stand-in sent no request"
        out.append((first - mono0) / NS_PER_MS)
    return out


# -- 20 at once ---------------------------------------------------------------------------------------


@dataclass
class Burst:
    path: str
    spread_ms: float  # first to last worker's first instruction
    all_started_ms: float  # first dispatch's start to the last worker's first instruction
    returned_ms: float  # first dispatch's start to the last dispatch's exit
    branches: int
    live_on: bool  # the runs live on until every one has started (HELD_PROGRAM), or end at once (PROGRAM)


def burst(runner: Runner, where: Where, gate: Path | None = None) -> Burst:
    """20 dispatches at once; with `gate`, of HELD_PROGRAM's runs, let go once the last one has started."""
    env = where.caller_env(True, False)
    names = [runner.name(f"{where.path[0]}b") for _ in range(CONCURRENT)]
    branches = wb_branches(where.clones())
    together = threading.Barrier(CONCURRENT)
    wall_minus_mono = time.time_ns() - time.monotonic_ns()
    profile = "plain" if gate is None else HELD_PROFILE

    def go(name: str) -> tuple[int, int, str]:
        argv = [common.WB, "agent", "dispatch", *where.target(False), "--new-worktree", name, "--profile", profile,
                "--repo", REPOSITORY, "--task", "bench"]  # fmt: skip
        together.wait()
        started = time.monotonic_ns()
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=FIRST_WAIT_S, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"dispatch exited {done.returncode}: {done.stderr.strip()[-800:]}")
        return started, time.monotonic_ns(), done.stdout.split()[0]

    held = None if gate is None else os.open(gate, os.O_RDWR)  # a FIFO opened read-write never waits
    try:
        with ThreadPoolExecutor(CONCURRENT) as pool:
            dispatched = list(pool.map(go, names))
        firsts = [runner.first(where, name, "command", 0, wall_minus_mono) for name in names]
    finally:
        if held is not None:
            os.close(held)  # every held run reads the gate's end and ends
    for _, _, reference in dispatched:
        final = json.loads(wb(env, "agent", "await", reference, "--json", timeout=FIRST_WAIT_S))
        if final.get("state") != "completed":
            raise RuntimeError(f"{reference} ended {final.get('state')}: {final.get('failure')}")
    wb(env, "agent", "prune", *where.target(False), "--older-than", "0s", "--worktrees")
    begun = min(started for started, _, _ in dispatched)
    return Burst(
        where.path,
        (max(firsts) - min(firsts)) / NS_PER_MS,
        (max(firsts) - begun) / NS_PER_MS,
        (max(ended for _, ended, _ in dispatched) - begun) / NS_PER_MS,
        branches,
        gate is not None,
    )


# -- set-up -------------------------------------------------------------------------------------------


@dataclass
class Bench:
    """What every path shares: the program, the stand-in, the credential, the model server, the trace."""

    base: Path
    program: Path
    bin_dir: Path  # the stand-in `codex`, first on every machine's PATH
    credential: Path
    trace: Path
    model: ModelProcess
    held: Path  # HELD_PROGRAM
    gate: Path  # the FIFO it reads
    program_floor_ms: list[float] = field(default_factory=list)
    model_floor_ms: list[float] = field(default_factory=list)

    @classmethod
    def make(cls, base: Path) -> Bench:
        shared = base / "shared"
        shared.mkdir(mode=0o700)
        program = shared / "program.sh"
        program.write_text(PROGRAM)
        program.chmod(0o755)
        bin_dir = shared / "bin"
        bin_dir.mkdir()
        standin = bin_dir / "codex"
        # The stand-in as `wb demo` installs it (courier/demo/run.py): this interpreter, which has wb installed.
        standin.write_text(f'#!/bin/sh\nexec {common.PYTHON} -m courier.demo.standin_codex "$@"\n')
        standin.chmod(0o755)
        secrets = shared / "secrets"
        secrets.mkdir(mode=0o700)
        credential = secrets / "provider-key"
        credential.write_text(CREDENTIAL)
        credential.chmod(0o600)
        trace = shared / "stage-trace"
        gate = shared / "gate"
        os.mkfifo(gate, 0o600)
        held = shared / "held.sh"
        held.write_text(HELD_PROGRAM.format(gate=gate))
        held.chmod(0o755)
        model = ModelProcess.start(shared / "model")
        return cls(base, program, bin_dir, credential, trace, model, held, gate)

    def agents(self, model: ModelProcess | None = None) -> dict[str, Any]:
        return agents_config(self.program, self.held, (model or self.model).base_url, self.credential)

    def measure_floors(self, runs: int) -> None:
        scratch = self.base / "floor"
        self.program_floor_ms = program_floor(self.program, scratch, runs)
        self.model_floor_ms = standin_floor(self.model, self.bin_dir, scratch, runs)


def local_and_remote(bench: Bench, runs: int, stack: contextlib.ExitStack) -> dict[str, Where]:
    """This machine, and one loopback sshd machine reached over ssh and over exec (the same home and clone)."""
    from tests.integration.sshd import SshdFactory, sshd_unavailable_reason

    base = bench.base
    reason = sshd_unavailable_reason()
    if reason:
        raise RuntimeError(f"cannot start loopback sshd: {reason}")
    factory = SshdFactory(base / "sshd")
    stack.callback(factory.close)
    server = factory.start("127.0.0.2")
    (server.root / "home").mkdir(mode=0o700)
    make_clone(server.projects_root)
    write_yaml(server.root / "remote-wb.yaml", {"agents": bench.agents()})
    # The stand-in first on the machine's PATH (its bin dir already is, tests/integration/sshd.py).
    shutil.copy(bench.bin_dir / "codex", server.bin_dir / "codex")
    # The traced machine: the same sshd, wb behind a wrapper that sets the variable (bench/common.py does the
    # same for WB_BENCH_TREE); a separate name, so the courier keeps it a connection of its own.
    traced_wb = server.script("wb-traced", f'{TRACE_ENV}={bench.trace} exec {common.WB} "$@"\n')
    machine_env = {
        "HOME": str(server.root / "home"), "USER": "root", "LOGNAME": "root", "SHELL": "/bin/sh",
        "WB_HOME": str(server.wb_home), "WB_PROJECTS_ROOT": str(server.projects_root),
        "WB_CONFIG": str(server.root / "remote-wb.yaml"),
        "PATH": f"{server.bin_dir}:{Path(common.PYTHON).parent}:/usr/local/bin:/usr/bin:/bin",
    }  # fmt: skip
    exec_argv = ["env", "-i", "-C", machine_env["HOME"], *(f"{k}={v}" for k, v in machine_env.items())]
    if common.TREE:
        exec_argv.append(f"PYTHONPATH={common.TREE}")
    targets = {
        "m1": {"ssh": factory.target(server)},
        "m1t": {"ssh": factory.target(server, wb_path=str(traced_wb))},
        "e1": {"exec": {"argv": exec_argv, "wb_path": common.WB}},
        "e1t": {"exec": {"argv": [*exec_argv, f"{TRACE_ENV}={bench.trace}"], "wb_path": common.WB}},
    }
    local = base / "local"
    for sub in ("home", "wbhome", "projects"):
        (local / sub).mkdir(mode=0o700, parents=True)
    make_clone(local / "projects")
    config = write_yaml(local / "wb.yaml", {"session_move": {"targets": targets}, "agents": bench.agents()})
    new_login = write_yaml(
        local / "wb-login.yaml",
        {"session_move": {"targets": targets}, "agents": bench.agents(), "courier": {"dispatch_over_serve": False}},
    )
    env = common.base_env(
        HOME=str(local / "home"),
        WB_HOME=str(local / "wbhome"),
        WB_PROJECTS_ROOT=str(local / "projects"),
        WB_CONFIG=str(config),
        WB_SSH_CONFIG=str(factory.client_config),
    )
    env["PATH"] = f"{bench.bin_dir}:{env['PATH']}"
    ssh_true = [common.SSH, "-F", str(factory.client_config), "-o", "ControlMaster=no", "-o", "ControlPath=none",
                "-o", "BatchMode=yes", "-T", "-p", str(server.port), f"root@{server.host}", "true"]  # fmt: skip
    exec_true = [*exec_argv, "true"]
    login_env = {**env, "WB_CONFIG": str(new_login)}
    keys = str(factory.client_config.parent)
    pairs = {
        "ssh": {PAIR_FLOOR.format("ssh"): least_pair(["ssh", keys, server.host, str(server.port), "root"], base)},
        "exec": {PAIR_FLOOR.format("exec"): least_pair(["exec", json.dumps(exec_argv)], base)},
    }
    return {
        "local": Where("local", "", "", env, bench.trace, [local / "projects"], bench.model, "the program directly",
                       bench.program_floor_ms, bench.model_floor_ms),
        "ssh": Where("ssh", "m1", "m1t", env, bench.trace, [server.projects_root], bench.model, "ssh m1 true",
                     [], bench.model_floor_ms, ssh_true, pairs["ssh"]),
        "exec": Where("exec", "e1", "e1t", env, bench.trace, [server.projects_root], bench.model, "exec argv true",
                      [], bench.model_floor_ms, exec_true, pairs["exec"]),
        "ssh-login": Where("ssh-login", "m1", "m1t", login_env, bench.trace, [server.projects_root], bench.model,
                           "ssh m1 true", [], bench.model_floor_ms, ssh_true),
        "exec-login": Where("exec-login", "e1", "e1t", login_env, bench.trace, [server.projects_root], bench.model,
                            "exec argv true", [], bench.model_floor_ms, exec_true),
    }  # fmt: skip


def ray_where(bench: Bench, runs: int, stack: contextlib.ExitStack) -> Where:
    """A local Ray cluster as bench/ray.py starts it, its head reached as the exec machine `lab` (docs/ray.md)."""
    from bench import ray as ray_bench
    from tests.integration.ray_cluster import HEAD_PORT, RayCluster, RayNode

    base = bench.base / "ray"

    @dataclass
    class Node(RayNode):
        """A node whose Ray workers (and so the runs' owners) mark stages and find the stand-in first on PATH."""

        def environment(self) -> dict[str, str]:
            env = super().environment()
            env["PATH"] = f"{bench.bin_dir}:{env['PATH']}"
            env[TRACE_ENV] = str(bench.trace)
            return env

        def configure(self, model: ModelProcess) -> None:
            """Its wb.yaml: the cluster's executor and the benchmark's profiles (read again by every request)."""
            executor = {"ray": {"address": f"127.0.0.1:{HEAD_PORT}"}}
            write_yaml(self.config_path, {"agents": {"executor": executor, **bench.agents(model)}})

    nodes = [Node(f"n{i}", base / "cluster" / f"n{i}", ray_bench.CPUS, (REPOSITORY,)) for i in range(ray_bench.NODES)]
    cluster = RayCluster(base / "cluster", list(nodes))
    started = time.monotonic()
    stack.callback(cluster.stop)
    cluster.start()
    # The scripted model server inside the cluster's network namespace, whose only interface is lo.
    model = ModelProcess.start(base / "model", cluster.enter())
    stack.callback(model.stop)
    for node in nodes:
        node.configure(model)
    print(f"  the Ray cluster started in {time.monotonic() - started:.0f} s", flush=True)
    # The head's own processes (its serve session, a cold receiver) mark only for `labt`; the nodes' Ray
    # workers (holders, their dispatch, the owners) were started with the variable and always mark.
    head_env = [f"{key}={value}" for key, value in cluster.head.environment().items() if key != TRACE_ENV]
    head_argv = [*cluster.enter(), "env", "-i", "-C", str(cluster.head.home), *head_env]  # as cluster.head_argv()
    config_dir = base / "caller"
    config_dir.mkdir(mode=0o700)
    targets = {
        "lab": {"exec": {"argv": head_argv, "wb_path": common.WB}},
        "labt": {"exec": {"argv": [*head_argv, f"{TRACE_ENV}={bench.trace}"], "wb_path": common.WB}},
    }
    config = write_yaml(config_dir / "wb.yaml", {"session_move": {"targets": targets}})
    env = common.base_env(WB_CONFIG=str(config), WB_HOME=str(config_dir / "wbhome"), HOME=str(config_dir))
    where = Where("ray", "lab", "labt", env, bench.trace, [node.projects_root for node in nodes], model,
                  "the program directly", bench.program_floor_ms, bench.model_floor_ms)  # fmt: skip
    # A cluster that has run work (bench/ray.py's second batch): one run, unmeasured, before any row.
    Runner().once(where, True, "plain", "command", traced=False)
    # The floor of a cold Ray row: a new driver on the head joining the cluster as wb's does
    # (courier/executor/ray_cluster.py connect), then leaving; no wb in it.
    joining = RAY_JOIN.format(address=f"127.0.0.1:{HEAD_PORT}")
    where.more_floors[RAY_JOIN_FLOOR] = [*head_argv, common.PYTHON, "-c", joining]
    # And the least pydantic pair over the head's exec argv whose receiver, the request validated, joins the
    # cluster before it exits: the least a cold Ray dispatch of the contract's shape can take.
    receiver = common.LEAST_PYDANTIC + "sys.stdout.flush()\n" + joining
    where.more_floors[PAIR_FLOOR.format("the head's exec argv, joining Ray")] = least_pair(
        ["exec", json.dumps(head_argv)], base, receiver
    )
    return where


# -- the report ---------------------------------------------------------------------------------------


def markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def headline_table(results: list[RowResult]) -> str:
    rows = []
    for result in results:
        f = result.figures()
        target = "—" if f["target_ms"] is None else f"≤ {f['target_ms']:.0f} ms"
        met = "—" if f["met"] is None else ("yes" if f["met"] else "**no**")
        rows.append([f["path"], f["courier"], f["sandbox"], f["to"], f"{f['median_ms']:.0f}", f"{f['min_ms']:.0f}",
                     f"{f['max_ms']:.0f}", f"{f['returned_ms']:.0f}", f["floor"], target, met, f["wb_branches"],
                     f"{f['traced_median_ms']:.0f}", f"{f['load'][0]:.1f}→{f['load'][1]:.1f}"])  # fmt: skip
    header = ["path", "courier", "sandbox", "to", "median ms", "min", "max", "dispatch returned", "floor", "target",
              "met", "wb/ branches", "traced median", "load"]  # fmt: skip
    return markdown(header, rows)


def pair_table(results: list[RowResult]) -> str:
    """The cold rows beside their floors of the contract's shape, run pair by pair: what is wb's own."""
    rows = []
    for result in results:
        for name, times in result.paired.items():
            mine = [sample.first_ms for sample in result.untraced]
            above = statistics.median(a - b for a, b in zip(mine, times, strict=True))
            floor = statistics.median(times)
            rows.append([result.path, SANDBOXES[result.sandbox], f"{statistics.median(mine):.0f}", name,
                         f"{floor:.0f}", f"{above:.0f}", f"{result.floor_name} {result.floor_ms:.0f}",
                         f"{floor - result.floor_ms:.0f}"])  # fmt: skip
    header = ["path", "sandbox", "wb cold ms", "beside it", "its median ms", "wb above it (pair by pair)",
              "the row's floor", "it above the row's floor"]  # fmt: skip
    return markdown(header, rows)


def category_table(results: list[RowResult]) -> str:
    rows = []
    for result in results:
        per = result.categories()
        total = statistics.median(sample.first_ms for sample in result.traced)
        biggest = max(per, key=lambda category: per[category])
        rows.append([f"{result.path} {result.courier} {result.sandbox} {result.harness}",
                     *(f"{per[c]:.0f}" if c in per else "" for c in CATEGORIES), f"{total:.0f}",
                     f"{biggest} ({per[biggest] / total:.0%})"])  # fmt: skip
    return markdown(["row", *CATEGORIES, "traced median", "biggest"], rows)


def breakdown_text(result: RowResult) -> str:
    complete = sum(1 for sample in result.traced if sample.marks_found >= sample.marks_expected)
    title = (f"{result.path}, {result.courier}, sandbox {SANDBOXES[result.sandbox]}, "
             f"{'first instruction' if result.harness == 'command' else 'first model request'}: traced median "
             f"{statistics.median(s.first_ms for s in result.traced):.1f} ms, {complete}/{len(result.traced)} runs "
             f"with every mark")  # fmt: skip
    stages = result.breakdown()
    rows = [[label, category, f"{ms:.1f}", f"{share:.0%}"] for label, category, ms, share in stages]
    rows.append(["sum of the medians above", "", f"{sum(ms for _, _, ms, _ in stages):.1f}", ""])
    text = f"{title}\n\n" + markdown(["stage", "category", "median ms", "share"], rows)
    carried = [s for s in result.traced if s.carrier_ready_ms is not None and s.call_sent_ms is not None]
    if carried:
        ready = statistics.median(s.carrier_ready_ms or 0.0 for s in carried)
        sent = statistics.median(s.call_sent_ms or 0.0 for s in carried)
        later = sum(1 for s in carried if (s.carrier_ready_ms or 0.0) > (s.call_sent_ms or 0.0))
        text += (f"\n\nIn parallel: the SSH carrier had imported asyncssh (carrier.ready) at a median {ready:.1f} ms, "
                 f"the call was handed to it (call.send) at {sent:.1f} ms; in {later} of {len(carried)} runs the call "
                 "waited for the carrier.")  # fmt: skip
    return text


def burst_shape(round_: Burst) -> str:
    return "live on" if round_.live_on else "end at once"


def burst_table(bursts: list[Burst]) -> str:
    rows = []
    for path, shape in dict.fromkeys((b.path, burst_shape(b)) for b in bursts):
        mine = [b for b in bursts if b.path == path and burst_shape(b) == shape]
        spread = statistics.median(b.spread_ms for b in mine)
        started = statistics.median(b.all_started_ms for b in mine)
        rows.append([path, shape, f"{spread:.0f}", f"{started:.0f}",
                     f"{statistics.median(b.returned_ms for b in mine):.0f}",
                     ", ".join(f"{b.all_started_ms:.0f}" for b in mine), f"≤ {CONCURRENT_TARGET_MS:.0f} ms",
                     "yes" if started <= CONCURRENT_TARGET_MS else "**no**"])  # fmt: skip
    header = ["machine", "runs", "spread of first instructions ms", "first dispatch → last first instruction ms",
              "first dispatch → last dispatch returned ms", "each round", "target", "met"]  # fmt: skip
    return markdown(header, rows)


# -- the whole benchmark ------------------------------------------------------------------------------


@dataclass
class Outcome:
    results: list[RowResult] = field(default_factory=list)
    bursts: list[Burst] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    floors: dict[str, float] = field(default_factory=dict)  # what each floor named here measured, median ms


def stop_courier(env: dict[str, str]) -> None:
    subprocess.run([common.WB, "courier", "stop"], env=env, capture_output=True, check=False)


def ray_unavailable() -> str:
    if importlib.util.find_spec("ray") is None:
        return "the extra wb[ray] is not installed"
    missing = [tool for tool in ("unshare", "nsenter") if shutil.which(tool) is None]
    return f"{', '.join(missing)} not found" if missing else ""


def quiet(progress: Callable[[str], None]) -> None:
    """Wait (at most QUIET_WAIT_S) until this machine's CPUs are mostly idle: a Ray cluster's start, or the
    previous rows' last runs, must not land on the next row (every figure is a wall time on 2 shared cores)."""
    deadline = time.monotonic() + QUIET_WAIT_S
    while True:
        before = busy_cpu_s()
        time.sleep(QUIET_SAMPLE_S)
        busy = (busy_cpu_s() - before) / QUIET_SAMPLE_S / (os.cpu_count() or 1)
        if busy <= QUIET_BUSY or time.monotonic() > deadline:
            progress(f"CPUs {busy:.0%} busy before the next rows; load {os.getloadavg()[0]:.2f}")
            return


def busy_cpu_s() -> float:
    """CPU seconds spent outside idle and iowait since boot, all cores (/proc/stat; bench/ray.py's)."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def measure_path(runner: Runner, where: Where, runs: int, outcome: Outcome, progress: Callable[[str], None]) -> None:
    quiet(progress)
    # The path's floors now, on the quiet machine its rows meet (not at set-up, after whatever ran before).
    if where.floor_argv is not None:
        where.floor_ms = command_floor(where.floor_argv, runs)
        outcome.floors[where.floor_name] = statistics.median(where.floor_ms)
    for name, argv in where.more_floors.items():
        outcome.floors[name] = statistics.median(command_floor(argv, runs))
    if where.floor_argv is not None or where.more_floors:
        progress(f"floors of {where.path}: {where.floor_name} {statistics.median(where.floor_ms):.1f}; "
                 + "; ".join(f"{name} {outcome.floors[name]:.1f}" for name in where.more_floors))  # fmt: skip
    for warm in (True,) if where.path.endswith("-login") else (True, False):
        for sandbox in SANDBOXES:
            for harness in HARNESSES:
                outcome.results.append(measure_row(runner, where, warm, sandbox, harness, runs, outcome.notes))


def measure(
    base: Path,
    runs: int,
    rounds: int,
    paths: tuple[str, ...],
    progress: Callable[[str], None],
    rows: bool = True,
) -> Outcome:
    outcome = Outcome()
    runner = Runner()
    with contextlib.ExitStack() as stack:
        bench = Bench.make(base)
        stack.callback(bench.model.stop)
        bench.measure_floors(runs)
        floors = outcome.floors
        floors["the program run directly, to its first instruction"] = statistics.median(bench.program_floor_ms)
        floors["the stand-in run directly, to its first model request"] = statistics.median(bench.model_floor_ms)
        floors["python -c pass"] = statistics.median(command_floor([common.PYTHON, "-c", "pass"], runs))
        with_rc, bare = session_shell_ms(runs)
        floors["the login shell as sshd starts it (reading ~/.bashrc)"] = with_rc
        floors["the same shell without rc files"] = bare
        floors["one stage mark with tracing on (µs)"] = mark_cost_us(base)
        progress("floors: " + "; ".join(f"{name} {value:.1f}" for name, value in floors.items()))
        if set(paths) - {"ray"}:
            wheres = local_and_remote(bench, runs, stack)
            stack.callback(stop_courier, wheres["local"].caller_env(True, False))  # one courier for the three
            for path in (path for path in paths if path in wheres and rows):
                measure_path(runner, wheres[path], runs, outcome, progress)
            for path in (path for path in paths if path in wheres):
                # Warm means warm: the cold rows ran minutes ago, long enough for the courier to have let the
                # machine's serve session go (courier.md, "Settings"); 20 dispatches must not open it.
                warm_up(runner, wheres[path], "plain", "command", outcome.notes)
                quiet(progress)  # the previous path's last runs, or its rows, must not land on these rounds
                for _ in range(rounds):
                    for gate in (None, bench.gate):  # alternated: the machine's speed moves between rounds
                        round_ = burst(runner, wheres[path], gate)
                        outcome.bursts.append(round_)
                        progress(f"20 at once, {path}, runs {burst_shape(round_)}: spread {round_.spread_ms:.0f}"
                                 f" ms, all started {round_.all_started_ms:.0f} ms after the first")  # fmt: skip
            stop_courier(wheres["local"].caller_env(True, False))  # and its serve processes, before the Ray rows
        if "ray" in paths:
            reason = ray_unavailable()
            if reason:
                outcome.notes.append(f"Ray rows skipped: {reason}")
            else:
                # The cluster only while its own rows run: its idle daemons (about 20 processes) would
                # otherwise take a share of this 2-core machine from every other row.
                with contextlib.ExitStack() as cluster:
                    where = ray_where(bench, runs, cluster)
                    cluster.callback(stop_courier, where.caller_env(True, False))
                    measure_path(runner, where, runs, outcome, progress)
    return outcome


def run(report: common.Report, base: Path, runs: int = RUNS, paths: tuple[str, ...] = PATHS) -> None:
    """For bench/run_all.py: the headline rows as Rows, the breakdown by category as details."""
    directory = base / "dispatch-latency"
    directory.mkdir(mode=0o700)
    outcome = measure(directory, runs, 1 if runs < RUNS else CONCURRENT_ROUNDS, paths, report.detail)
    for result in outcome.results:
        f = result.figures()
        report.add(
            common.Row(
                f"35. dispatch → {f['to']}, {f['path']} {f['courier']} sandbox {SANDBOXES[result.sandbox]}",
                f"{f['median_ms']:.0f} ms (min {f['min_ms']:.0f}, max {f['max_ms']:.0f})",
                f["floor"],
                f"{f['median_ms']:.0f} ms",
                "(info)" if f["target_ms"] is None else f"<= {f['target_ms']:.0f} ms",
                f["met"],
                f"medians of {f['runs']}; wb/ branches {f['wb_branches']}; load {f['load']}",
            )
        )
    for path, shape in dict.fromkeys((b.path, burst_shape(b)) for b in outcome.bursts):
        mine = [b for b in outcome.bursts if b.path == path and burst_shape(b) == shape]
        started = statistics.median(b.all_started_ms for b in mine)
        report.add(
            common.Row(
                f"35b. {CONCURRENT} concurrent warm dispatches, {path}, runs {shape}",
                f"all started {started:.0f} ms after the first",
                "-",
                f"{started:.0f} ms",
                f"<= {CONCURRENT_TARGET_MS:.0f} ms",
                started <= CONCURRENT_TARGET_MS,
                "median of rounds",
            )
        )
    if any(result.paired for result in outcome.results):
        table = pair_table(outcome.results)
        report.detail("cold rows beside the least program of their shape, pair by pair (ms):\n" + table)
    if outcome.results:
        report.detail("dispatch latency by stage (traced runs, medians, ms):\n" + category_table(outcome.results))
    for note in outcome.notes:
        report.detail(note)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_RUNS} runs a row, one round of 20 at once")
    parser.add_argument("--runs", type=int, help=f"untraced (and as many traced) runs a row; default {RUNS}")
    parser.add_argument("--paths", default=",".join(PATHS), help=f"which of {','.join(PATHS)}")
    parser.add_argument("--bursts-only", action="store_true", help="only the 20-at-once rounds (not Ray's)")
    parser.add_argument("--rounds", type=int, help=f"rounds of 20 at once, each shape; default {CONCURRENT_ROUNDS}")
    parser.add_argument("--json", type=Path, help="also write every figure and the breakdowns here")
    parser.add_argument("--serve-model", nargs=2, metavar=("TIMES", "PORT_FILE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_model:
        return serve_model(*args.serve_model)
    runs = args.runs or (QUICK_RUNS if args.quick else RUNS)
    rounds = args.rounds or (1 if args.quick else CONCURRENT_ROUNDS)
    paths = tuple(path for path in args.paths.split(",") if path)
    unknown = set(paths) - set(PATHS)
    if unknown:
        parser.error(f"unknown paths: {', '.join(sorted(unknown))}")
    load_before = os.getloadavg()
    print(f"machine: {common.machine_description()}", flush=True)
    print(f"load before: {load_before}", flush=True)
    started = time.monotonic()
    with common.workdir("latency") as base:
        outcome = measure(
            base, runs, rounds, paths, lambda text: print(f"  {text}", flush=True), rows=not args.bursts_only
        )
    load_after = os.getloadavg()
    print(f"\nload before {load_before}, after {load_after}; {time.monotonic() - started:.0f} s\n")
    print("Floors (medians, ms unless said):\n")
    print(markdown(["floor", "median"], [[name, f"{value:.1f}"] for name, value in outcome.floors.items()]))
    print()
    print("Headline (untraced runs):\n")
    print(headline_table(outcome.results))
    if any(result.paired for result in outcome.results):
        print("\nCold rows beside the least program of their shape, run pair by pair (first instruction, ms):\n")
        print(pair_table(outcome.results))
    print("\nBy category (traced runs; medians per category, ms):\n")
    print(category_table(outcome.results))
    if outcome.bursts:
        print(f"\n{CONCURRENT} concurrent warm dispatches to one machine (sandbox off, untraced):\n")
        print(burst_table(outcome.bursts))
    print("\nBy stage (traced runs):")
    for result in outcome.results:
        print()
        print(breakdown_text(result))
    for note in outcome.notes:
        print(f"\nnote: {note}")
    if args.json:
        document = {
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "machine": common.machine_description(),
            "load_before": load_before,
            "load_after": load_after,
            "floors": outcome.floors,
            "rows": [
                {**r.figures(), "categories": r.categories(),
                 "stages": [{"stage": s, "category": c, "median_ms": m} for s, c, m, _ in r.breakdown()]}
                for r in outcome.results
            ],
            "bursts": [b.__dict__ for b in outcome.bursts],
            "notes": outcome.notes,
        }  # fmt: skip
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
