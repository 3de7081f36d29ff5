"""The detached run owner: starts the harness, watches it, and records the outcome (docs/runs.md#the-owner;
docs/runs.md#terminal-state).

wb --wb-internal-agent-run --run-dir <home>/agents/<id>
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import select
import shutil
import signal
import subprocess
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from courier.config import Provider
from courier.errors import WbError
from courier.runs import (
    bwrap_probe,
    descendants,
    event_times,
    own_branch,
    privacy,
    process,
    sandbox,
    usage_wait,
    worktrees,
)
from courier.runs import store as store_mod
from courier.runs.changes import summarize_changes
from courier.runs.environment import Credential, resolve_credential, worker_environment
from courier.runs.harness import harness_for, spec_for
from courier.runs.harness.interface import EventParser, Harness, Launch
from courier.runs.harness.lines import NETWORK_REFUSED
from courier.runs.harness.message import bounded_message
from courier.runs.metering import RunMeter, relay_needed
from courier.runs.store import Record, Store, rfc3339, utc_now, within_admission_grace
from courier.stage_trace import mark
from protocol import limits
from protocol.durations import format_duration_ms
from protocol.models import Usage

if TYPE_CHECKING:
    from courier.runs.connect_proxy import ConnectProxy

_READ_CHUNK = limits.READ_CHUNK_BYTES
_POLL_S = 0.1
_DRAIN_POLL_S = 0.05
_DRAIN_AFTER_EXIT_S = 2.0
_OUTPUT_MARK_S = 2.0  # at most one extra mtime update per this many seconds of output
_USAGE_SAVE_S = 1.0  # a running run's usage so far is saved at most this often (await's live line)
REDACTED = b"[redacted]"


def owner_main(argv: list[str]) -> int:
    mark("owner.main")  # its imports done (docs/benchmarks.md#dispatch-latency)
    if len(argv) != 2 or argv[0] != "--run-dir":
        return 2
    run_dir = Path(argv[1])
    if not run_dir.is_absolute():
        return 2
    store = Store(run_dir.parent.parent)
    try:
        record = store.load(run_dir.name)
    except WbError:
        return 1
    if record.state != "running" or record.owner_pid:
        return 0
    if not within_admission_grace(record):
        finish(store, record, "failed", "owner started too late (after the 60 s admission grace)")
        return 0
    record.owner_pid = os.getpid()
    record.owner_token = process.start_token(os.getpid())
    store.save(record)
    # The owner must outlive a terminal that closes: SIGHUP is not for it.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    Owner(store, record).run()
    return 0


def finish(store: Store, record: Record, state: str, failure: str | None, secret: bytes = b"") -> None:
    finished = utc_now()
    record.state = state
    record.failure = failure
    store.release_reserve(record.agent_id)  # its space is for this save on a full disk; the run ends here
    privacy.end_of_run(store.run_dir(record.agent_id), record, secret)
    record.finished_at = rfc3339(finished)
    with contextlib.suppress(ValueError):
        started = store_mod.parse_rfc3339(record.started_at)
        record.duration_ms = max(0, int((finished - started).total_seconds() * limits.MS_PER_SECOND))
    save_terminal(store, record)


def save_terminal(store: Store, record: Record) -> None:
    """Retry the terminal save; if it is lost, say why in owner-error.

    `limits.TERMINAL_SAVE_TRIES` tries, the pause doubling from `TERMINAL_SAVE_FIRST_PAUSE_S`:
    5 tries and 1 + 2 + 4 + 8 = 15 s of pauses, well within the 40 s a `stop` waits for the lock.
    """
    delay = limits.TERMINAL_SAVE_FIRST_PAUSE_S
    last_error: OSError | None = None
    for attempt in range(limits.TERMINAL_SAVE_TRIES):
        try:
            store.save(record)
            return
        except OSError as exc:
            last_error = exc
            if attempt + 1 < limits.TERMINAL_SAVE_TRIES:
                time.sleep(delay)
                delay *= 2
    with contextlib.suppress(OSError):
        store_mod.write_private(
            store.run_dir(record.agent_id) / store_mod.OWNER_ERROR,
            f"the owner could not save the terminal state {record.state}: {last_error}".encode(),
        )


class Owner:
    def __init__(self, store: Store, record: Record) -> None:
        self.store = store
        self.record = record
        self.run_dir = store.run_dir(record.agent_id)
        self.harness: Harness = harness_for(record.resolved.harness)
        self.summary: EventParser = self.harness.parser()
        self.launch: Launch | None = None
        self.diagnostics: list[str] = []
        self.timed_out = False
        self.stalled_since_output: str | None = None  # set when stop_when_stalled stopped the run
        self.secret = b""
        self.events_lost = False
        self.usage_saved_at = 0.0
        self.times_fd: int | None = None  # events.times (courier/runs/event_times.py), opened with the first line
        # budgets and usage limits (docs/cli.md#budgets, docs/cli.md#waiting-out-a-usage-limit)
        self.meter = RunMeter(record, stream_reports_messages=self.summary.reports_message_usage)
        self.carried_diagnostics: list[str] = []
        self.carried_tool_calls = 0
        self.worker_s = 0.0  # time spent in workers so far: the run's --timeout bounds it, not the waits
        self.confinement: sandbox.Plan | None = None  # docs/security.md#confined-runs: None runs the worker as it is
        self.proxy: ConnectProxy | None = None  # for `network: [hosts]`
        self.refused_hosts: list[str] = []  # by the proxy's threads; the pump stores them as lines
        self.refused_lock = threading.Lock()

    def run(self) -> None:
        record = self.record
        # Held until the worker is recorded (or the owner exits): a stop sees the worker or keeps it from starting.
        self.store.hold_run_lock(record.agent_id)
        if self.store.stop_requested_at(record.agent_id):
            self.decide_and_save(exit_code=None)
            return
        try:
            credential, argv = self.prepare()
        except (WbError, ValueError) as exc:
            finish(self.store, record, "failed", f"could not start the harness: {exc}")
            return
        assert self.launch is not None
        self.secret = credential.value.encode() if credential else b""
        # With the relay in front, the worker holds the run's placeholder, never the credential (docs/security.md).
        worker_env = worker_environment(self.meter.worker_credential(credential))
        env = self.harness.environment(self.launch, self.confined_environment(worker_env))
        stdin = self.store.read_task(record.agent_id).encode()
        try:
            while True:
                started, exit_code = self.attempt(argv, env, stdin)
                if not started:
                    return
                if not self.meter.limit_stopped and not self.meter.limit_after_exit(self.summary, exit_code):
                    break
                resumed = self.wait_for_limit()
                if resumed is None:
                    return
                argv, stdin = resumed
        finally:
            # The relay's servers take up to their poll interval to shut down: not on the way to the terminal
            # state (a `stop` returns once the worker is gone, and `status` then should say how it ended).
            stopping = threading.Thread(target=self.meter.stop, name="wb-relay-stop", daemon=True)
            stopping.start()
            if self.proxy is not None:
                self.proxy.stop()
            if self.confinement is not None:
                self.carry_branch(limits.BRANCH_LOCK_PATIENCE_S)  # whatever ended the run, the owner's failure too
                self.confinement.cleanup()
        self.decide_and_save(exit_code=exit_code)
        stopping.join(limits.TERMINAL_SAVE_FIRST_PAUSE_S)

    def attempt(
        self, argv: list[str], env: dict[str, str], stdin: bytes, *, set_up_again: bool = True
    ) -> tuple[bool, int | None]:
        """Run the worker once, to its end: (started, its exit code); not started, the run was finished here."""
        record = self.record
        events_path = self.run_dir / store_mod.EVENTS
        tracker = descendants.track_worker_tree()
        harness_argv, status_read, status_write = argv, -1, -1
        if self.confinement is not None:
            mark("sandbox.argv")  # bubblewrap's command line: the binds (docs/benchmarks.md#confinement)
            if shutil.which(argv[0], path=env.get("PATH")) is None:  # inside, bwrap would only say "execvp"
                finish(self.store, record, "failed", f"could not start the harness: {self.missing(argv[0])}")
                return False, None
            self.confinement.snapshot_branch()  # each worker sees the branches as they are when it starts
            status_read, status_write = os.pipe()
            argv = self.confinement.command_line(argv, status_fd=status_write)
        mark("owner.exec")  # what follows is the harness's start (inside bubblewrap when confined)
        try:
            worker = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                cwd=record.worktree_dir,
                env=env,
                start_new_session=True,
                close_fds=True,
                pass_fds=(status_write,) if status_write >= 0 else (),
            )
        except OSError as exc:
            if status_read >= 0:
                os.close(status_read)
            missing = isinstance(exc, FileNotFoundError)
            why = f": {self.missing(argv[0])}" if missing else f" {argv[0]}: {exc.strerror or exc}"
            finish(self.store, record, "failed", f"could not start the harness{why}")
            return False, None
        finally:
            if status_write >= 0:
                os.close(status_write)
        record.worker_pid = worker.pid
        record.worker_token = process.start_token(worker.pid)
        record.log_path = str(events_path)
        self.store.save(record)
        self.store.release_run_lock(record.agent_id)
        threading.Thread(target=_feed_stdin, args=(worker, stdin), daemon=True).start()
        assert worker.stdout is not None
        started = time.monotonic()
        self.pump(worker, events_path)
        self.worker_s += time.monotonic() - started
        if self.confinement is not None:
            # The sandbox's PID namespace ends with the harness: the kernel kills what is left in it (the
            # forwarder's carrier, anything the harness left behind) as bubblewrap exits. Not leftovers to report.
            process.wait_until(lambda: process.group_empty(worker.pid), limits.TIMEOUT_KILL_GRACE_S)
        left = process.terminate_group(worker.pid, limits.TIMEOUT_KILL_GRACE_S)
        if left:
            self.diagnostics.append(
                f"killed {left} leftover process(es) of the worker's group after the harness exited"
            )
        # Nothing of the worker moves its branch's copy any more: its last moves, before a usage-limit wait too.
        self.carry_branch(limits.BRANCH_LOCK_PATIENCE_S)
        # Also those that left the group (setsid): found by ancestry, the owner being their subreaper.
        self.diagnostics += descendants.describe(*tracker.end(limits.TIMEOUT_KILL_GRACE_S))
        if status_read >= 0 and self.set_up_again(worker.returncode, status_read, set_up_again):
            return self.attempt(harness_argv, env, stdin, set_up_again=False)
        return True, _exit_code(worker.returncode)

    def set_up_again(self, returncode: int | None, status_read: int, allowed: bool) -> bool:
        """Whether to start the confined worker once more: bubblewrap could not set the sandbox up because a
        directory it covers (a socket's, in /tmp) went away between the command line and the mounts."""
        os.set_blocking(status_read, False)  # bubblewrap has written all it will: it has exited
        try:
            ran = sandbox.worker_ran(os.read(status_read, limits.RELAY_READ_CHUNK_BYTES))
        except BlockingIOError:
            ran = False
        finally:
            os.close(status_read)
        assert self.confinement is not None
        gone = self.confinement.hidden_gone()
        if ran or returncode != 1 or not gone or not allowed or self.store.stop_requested_at(self.record.agent_id):
            return False
        self.diagnostics.append(f"the sandbox was set up again: {', '.join(gone)} went away as it was set up")
        return True

    def carry_branch(self, patience_s: float = 0.0, *, when_changed: bool = False) -> None:
        """The confined worker's own branch, carried back from its copy (courier/runs/own_branch.py); what kept
        it from being carried is one of the run's diagnostics."""
        if self.confinement is not None:
            self.diagnostics += self.confinement.carry_branch(patience_s, when_changed=when_changed)

    def missing(self, program: str) -> str:
        executable = spec_for(self.record.resolved.harness).executable
        return f'harness executable "{program}" not found on PATH' if executable else f"{program} does not exist"

    def wait_for_limit(self) -> tuple[list[str], bytes] | None:
        """Wait out a usage limit (docs/cli.md#waiting-out-a-usage-limit); the resumed command line and its prompt,
        or None when the run ended."""
        record = self.record
        policy = record.usage_limit
        limit = self.meter.take_limit(self.summary)
        assert policy is not None and limit is not None
        now = time.time()
        until = usage_wait.resume_at(limit, now)
        session = self.summary.session_id or record.session_id or record.resume_session_id
        failure = usage_wait.refusal(policy, len(record.waits or []), until, now, limit)
        if failure is None and session is None:
            failure = f"{limit.failure} (no session to resume: the harness reported none)"
        if failure is not None or self.store.stop_requested_at(record.agent_id):
            self.meter.give_up(failure)
            self.decide_and_save(exit_code=None)
            return None
        self.fold_attempt()
        record.waits = [*(record.waits or []), usage_wait.wait_record(limit, now, until)]
        record.max_waits = policy.max_waits
        record.worker_pid = None
        record.worker_token = None
        self.store.save(record)
        if usage_wait.wait_out(until, lambda: bool(self.store.stop_requested_at(record.agent_id))):
            self.decide_and_save(exit_code=None)
            return None
        self.store.hold_run_lock(record.agent_id)  # released once the resumed worker is recorded
        if self.store.stop_requested_at(record.agent_id):
            self.decide_and_save(exit_code=None)
            return None
        assert self.launch is not None
        self.launch = dataclasses.replace(self.launch, resume_session=session)
        self.meter.resumed()
        return self.harness.argv(self.launch), policy.prompt.encode()

    def fold_attempt(self) -> None:
        """Keep what the ended attempt counted; the resumed worker gets a fresh parser."""
        self.meter.fold(self.summary)
        self.carried_diagnostics += self.summary.diagnostics
        self.carried_tool_calls += self.summary.tool_calls
        self.summary = self.harness.parser()

    def prepare(self) -> tuple[Credential | None, list[str]]:
        """The credential and the command line; the harness's private home made ready."""
        record = self.record
        harness = self.harness
        provider: Provider | None = None
        credential: Credential | None = None
        if spec_for(record.resolved.harness).wire_apis:
            routing = record.resolved.routing
            provider = Provider.model_validate(
                {
                    "base_url": routing.base_url,
                    "credential_env": routing.credential_env,
                    "credential_file": routing.credential_file,
                    "wire_api": routing.wire_api,
                    **(record.provider_options or {}),
                }
            )
            credential = resolve_credential(record.resolved.provider, provider)
        mark("sandbox.probe")
        record.sandbox = sandbox.decide(
            record, None if record.sandbox_mode == "off" else bwrap_probe.usable(os.environ.get("PATH"))
        )
        mark("sandbox.decided")  # then the metering relay's start, when there is one
        self.meter.needed = relay_needed(record)  # a confined run with a provider is always relayed
        if provider is not None:
            assert credential is not None
            provider = self.meter.wrap(provider, routing.wire_api, credential)
        mark("sandbox.plan")
        if record.sandbox.kind == "bwrap":
            self.confinement = self.plan()
        mark("sandbox.planned")
        self.launch = Launch(
            worktree=record.worktree_dir or "",
            run_dir=self.run_dir,
            home=self.run_dir / store_mod.HARNESS_HOME,
            model=record.resolved.model,
            provider_name=record.resolved.provider,
            provider=provider,
            env_key=credential.env_name if credential else "",
            reasoning=record.resolved.reasoning,
            network=bool(record.network),
            confined=self.confinement is not None,
            resume_session=record.resume_session_id,
            permissions=record.permissions,
            command=tuple(record.command) if record.command else None,
        )
        harness.prepare_home(self.launch)
        return credential, harness.argv(self.launch)

    def plan(self) -> sandbox.Plan:
        """What the confined worker may see and touch; the relay also listening inside the sandbox's reach."""
        record = self.record
        found = bwrap_probe.usable(os.environ.get("PATH"))
        assert found.path is not None
        codex = record.resolved.harness == "codex"
        files = [self.run_dir / store_mod.LAST_MESSAGE] if codex else []
        # Codex makes /tmp/codex-daemon-<uid> before its own sandbox starts, whatever TMPDIR says (docs/harnesses.md).
        tmp_dirs = [f"/tmp/codex-daemon-{os.getuid()}"] if codex else []
        plan = sandbox.Plan(
            bwrap=found.path,
            worktree=record.worktree_dir or "",
            git=self.git_dirs(),
            run_dir=self.run_dir,
            harness_home=self.run_dir / store_mod.HARNESS_HOME,
            wb_home=self.store.home,
            path_env=os.environ.get("PATH", ""),
            writable=tuple(record.sandbox_writable or ()),
            share_network=record.network is True,
            files=files,
            tmp_dirs=tmp_dirs,
            parent_home=self.store.run_dir(record.parent_id) / store_mod.HARNESS_HOME if record.parent_id else None,
        )
        plan.prepare()
        relay = self.meter.relay
        if relay is not None and not plan.share_network:  # with the machine's network it reaches the relay as is
            relay.listen_unix(plan.socket_dir, sandbox.RELAY_SOCKET)
            plan.forwards.append((relay.port, sandbox.RELAY_SOCKET))
        if isinstance(record.network, list):
            from courier.runs.connect_proxy import ConnectProxy

            self.proxy = ConnectProxy(record.network, self.note_refused)
            fd = os.open(plan.socket_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:  # through the directory's descriptor: a run's path may be longer than a socket address holds
                self.proxy.start_unix(f"/proc/self/fd/{fd}/{sandbox.PROXY_SOCKET}")
            finally:
                os.close(fd)
            taken = {port for port, _ in plan.forwards}
            plan.forwards.append((next(p for p in sandbox.PROXY_PORTS if p not in taken), sandbox.PROXY_SOCKET))
        return plan

    def git_dirs(self) -> own_branch.GitDirs | None:
        """The worktree's git dirs the sandbox may bind, checked against the run's record (its canonical clone,
        its branch), not taken from files an earlier worker in that worktree could have written."""
        record = self.record
        clone = worktrees.clone_of(record.worktree_dir or "", record.repository, record.worktree)
        if clone is None:
            return None
        return own_branch.git_dirs(record.worktree_dir or "", clone_git=str(clone / ".git"), branch=record.branch)

    def note_refused(self, host: str) -> None:
        with self.refused_lock:
            self.refused_hosts.append(host)

    def store_refused(self, log_fd: int) -> None:
        """The proxy's refusals as the owner's own transcript lines (`network refused: HOST`)."""
        with self.refused_lock:
            hosts, self.refused_hosts = self.refused_hosts, []
        for host in hosts:
            self.store_event(log_fd, json.dumps({"type": NETWORK_REFUSED, "host": host}).encode() + b"\n")

    def confined_environment(self, env: dict[str, str]) -> dict[str, str]:
        """A confined worker's TMPDIR is its own; without the machine's network, the machine's proxies are
        unreachable (and would catch the relay's loopback address)."""
        plan = self.confinement
        if plan is None:
            return env
        if not plan.share_network:
            for name in [name for name in env if name.lower().endswith("_proxy")]:
                del env[name]
        proxy = next((port for port, name in plan.forwards if name == sandbox.PROXY_SOCKET), None)
        if proxy is not None:
            for name in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
                env[name] = f"http://127.0.0.1:{proxy}"
            env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"  # the relay is reached directly
        for name in ("TMPDIR", "TMP", "TEMP"):
            env[name] = str(plan.tmp_dir)
        return env

    def pump(self, worker: subprocess.Popen[bytes], events_path: Path) -> None:
        """Read the worker's output live: parse each line, store up to the cap, enforce the deadline."""
        assert worker.stdout is not None
        fd = worker.stdout.fileno()
        deadline = time.monotonic() + self.record.timeout_ms / limits.MS_PER_SECOND - self.worker_s
        log_fd = os.open(events_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        stored = 0
        pending = b""
        skipping = False
        line_number = 0
        exited_at: float | None = None
        stall_stop_s = self.stall_stop_after_s()
        last_output = marked_at = carried_at = time.monotonic()
        try:
            while True:
                now = time.monotonic()
                if not self.timed_out and now >= deadline and worker.poll() is None:
                    self.timed_out = True
                    self.end_worker(worker)
                if (
                    stall_stop_s is not None
                    and self.stalled_since_output is None
                    and not self.timed_out
                    and now - last_output >= stall_stop_s
                    and worker.poll() is None
                ):
                    silent_for = now - last_output
                    self.stalled_since_output = rfc3339(utc_now() - timedelta(seconds=silent_for))
                    self.end_worker(worker)
                if self.refused_hosts:
                    self.store_refused(log_fd)
                if now - carried_at >= limits.BRANCH_SYNC_INTERVAL_S:
                    carried_at = now  # `git log wb/NAME` outside is about a second behind the run at most
                    self.carry_branch(when_changed=True)
                if self.meter.should_stop_worker() and worker.poll() is None:
                    self.end_worker(worker)  # a budget crossed, or a usage limit to wait out
                if exited_at is None and worker.poll() is not None:
                    exited_at = now
                # A child that outlives the harness may hold the pipe open: after the exit, read
                # what is already there, then stop (bounded, in case that child keeps writing).
                if exited_at is not None and now - exited_at > _DRAIN_AFTER_EXIT_S:
                    break
                ready, _, _ = select.select([fd], [], [], _POLL_S if exited_at is None else _DRAIN_POLL_S)
                if not ready:
                    if exited_at is not None:
                        break
                    continue
                chunk = os.read(fd, _READ_CHUNK)
                if not chunk:
                    worker.wait()
                    break
                last_output = time.monotonic()
                if last_output - marked_at >= _OUTPUT_MARK_S:
                    # The transcript's mtime is the run's last output (stall, docs/cli.md#stalled-runs): keep it true
                    # when what arrived is not stored (a partial line, a skipped line, past the 128 MiB cap).
                    marked_at = last_output
                    with contextlib.suppress(OSError):
                        os.utime(log_fd)
                pending += chunk
                while True:
                    newline = pending.find(b"\n")
                    if newline < 0:
                        if len(pending) > limits.EVENT_LINE_MAX_BYTES:
                            if not skipping:
                                line_number += 1
                                self.summary.skipped_oversize_line(len(pending))
                            skipping = True
                            pending = b""
                        break
                    line, pending = pending[: newline + 1], pending[newline + 1 :]
                    if skipping:
                        skipping = False
                        continue
                    line_number += 1
                    if len(line) > limits.EVENT_LINE_MAX_BYTES:
                        self.summary.skipped_oversize_line(len(line))
                        continue
                    # Parse the line as the harness wrote it; store what the harness returns for it
                    # (it may mask the task it echoes), redacted.
                    line = self.redact(self.summary.feed(line))
                    if stored + len(line) <= limits.EVENTS_STORED_MAX_BYTES:
                        self.store_event(log_fd, line)
                        stored += len(line)
                    self.note_session()
                    self.meter.observe(self.summary)  # per-message usage and cost against the budget
                    self.note_usage()
            if pending and not skipping:
                line = self.redact(self.summary.feed(pending))
                if stored + len(line) <= limits.EVENTS_STORED_MAX_BYTES:
                    self.store_event(log_fd, line)
        finally:
            self.store_refused(log_fd)
            os.close(log_fd)
            if self.times_fd is not None and self.times_fd >= 0:
                os.close(self.times_fd)
            self.times_fd = None
            worker.stdout.close()
        worker.wait()

    def note_session(self) -> None:
        """Save the harness's session ID as soon as it is known, so even an abandoned run can be continued."""
        thread = self.summary.session_id
        if thread and self.record.session_id != thread:
            self.record.session_id = thread
            with contextlib.suppress(OSError):
                self.store.save(self.record)

    def note_usage(self) -> None:
        """Save the usage so far while the run goes on (at most once a second), so `await`'s live line and
        `status` show it before the end; the end saves the final count."""
        now = time.monotonic()
        if now - self.usage_saved_at < _USAGE_SAVE_S:
            return
        usage = self.meter.usage(self.summary)
        meter = self.meter
        if meter.input_tokens + meter.output_tokens > (usage.input_tokens + usage.output_tokens if usage else 0):
            # Per-message counts (Claude Code's) come before the harness's own total, which comes at the end.
            usage = Usage(input_tokens=meter.input_tokens, output_tokens=meter.output_tokens)
        if usage is None or usage == self.record.usage:
            return
        self.usage_saved_at = now
        self.record.usage = usage
        with contextlib.suppress(OSError):
            self.store.save(self.record)

    def stall_stop_after_s(self) -> float | None:
        """Seconds of silence after which the owner stops the run (stall_after + stop_when_stalled), if ever."""
        record = self.record
        stall_ms = store_mod.stall_after_ms(record)
        if record.stop_when_stalled_ms is None or stall_ms <= 0:
            return None
        return (stall_ms + record.stop_when_stalled_ms) / limits.MS_PER_SECOND

    def end_worker(self, worker: subprocess.Popen[bytes]) -> None:
        process.signal_group(worker.pid, signal.SIGTERM)
        if not process.wait_until(lambda: worker.poll() is not None, limits.TIMEOUT_KILL_GRACE_S):
            process.signal_group(worker.pid, signal.SIGKILL)

    def store_event(self, log_fd: int, line: bytes) -> None:
        """Append one line to events.jsonl; a failed write (a full disk) stops storing, never the run."""
        if self.events_lost:
            return
        try:
            store_mod.write_all(log_fd, line)
        except OSError as exc:
            self.events_lost = True
            self.diagnostics.append(f"stopped storing events in {store_mod.EVENTS}: {exc.strerror or exc}")
            return
        if self.times_fd is None:
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                self.times_fd = os.open(self.run_dir / event_times.TIMES, flags, 0o600)
            except OSError:
                self.times_fd = -1  # the run goes on without the times of its actions
        if self.times_fd >= 0:
            with contextlib.suppress(OSError):
                offset = os.lseek(log_fd, 0, os.SEEK_CUR)
                event_times.note(self.times_fd, offset, int(time.time() * limits.MS_PER_SECOND))

    def redact(self, line: bytes) -> bytes:
        return privacy.redact_line(line, self.secret)

    def decide_and_save(self, exit_code: int | None) -> None:
        record = self.record
        summary = self.summary
        record.exit_code = exit_code
        record.result = self.final_message()
        record.tool_calls = self.carried_tool_calls + summary.tool_calls
        self.meter.settle()
        record.usage = self.meter.usage(summary)
        record.session_id = summary.session_id or record.session_id or record.resume_session_id
        if record.worktree_dir:
            record.changes = summarize_changes(record.worktree_dir, record.base_sha, record.preexisting_changes)
        diagnostics = [*self.carried_diagnostics, *summary.diagnostics, *self.diagnostics]
        record.harness_diagnostics = diagnostics or None
        # From here to the saved terminal state, stop waits: it either came first (and is honoured)
        # or finds the run terminal and is refused; never a stop the state does not show (docs/cli.md, wb agent stop;
        # docs/runs.md#terminal-state).
        self.store.hold_run_lock(record.agent_id)
        stop_at = self.store.stop_requested_at(record.agent_id)
        failure: str | None
        if stop_at:
            state, failure = "failed", f"stopped on request at {stop_at}"
        elif self.meter.budget_failure is not None:
            state, failure = "failed", self.meter.budget_failure
        elif self.meter.limit_failure is not None:
            state, failure = "failed", self.meter.limit_failure
        elif self.timed_out:
            state, failure = "timeout", f"timed out after {format_duration_ms(record.timeout_ms)}"
        elif self.stalled_since_output is not None:
            state, failure = "failed", f"stalled: no output since {self.stalled_since_output}"
        else:
            failure = summary.failure(exit_code)
            state = "failed" if failure else "completed"
        finish(self.store, record, state, failure, self.secret)
        self.store.release_run_lock(record.agent_id)

    def final_message(self) -> str | None:
        if self.launch is None:
            return None
        found = self.harness.final_message(self.launch, self.summary, extra=len(self.secret))
        return None if found is None else bounded_message(*found, secret=self.secret, mask=REDACTED)


def _feed_stdin(worker: subprocess.Popen[bytes], task: bytes) -> None:
    assert worker.stdin is not None
    with contextlib.suppress(OSError):
        worker.stdin.write(task)
    with contextlib.suppress(OSError):
        worker.stdin.close()


def _exit_code(returncode: int | None) -> int | None:
    if returncode is None:
        return None
    return 128 + -returncode if returncode < 0 else returncode
