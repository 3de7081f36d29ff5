"""`wb agent watch` (docs/cli.md, wb agent watch): the caller's side of the fleet's event stream.

One thread per machine keeps exactly one call pending there: the `watch` long-poll
(docs/protocol.md, watch) with a peer whose `version` lists it, else (an older wb) its `list`
polled every WATCH_LIST_POLL_S. Each answer is a snapshot of the machine's live runs and of
the runs that ended since the last one; `Tracker` turns consecutive snapshots into events.
A machine that does not answer is a `machine_error` event and is asked again with backoff.
The main thread prints the events in the order they arrive and hands each `finished` to the
--exec hook, which runs on a thread of its own so a slow hook never delays a line.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
import queue
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from courier.client.asking import ask, upgrade_message
from courier.config import Config, Problem
from courier.errors import UsageError, WbError
from courier.render import ref_of
from courier.runs.watch_op import FINISHED, QUEUED, RUNNING, STALLED, WAITING, phase_of
from courier.text import sanitize
from protocol import limits
from protocol.documents import MachineErrorEvent, RunEvent, WatchDocument
from protocol.models import RemoteRequest, RemoteResponse, Result
from protocol.timestamps import epoch_seconds, rfc3339, utc_now

WATCH = "watch"  # the capability a peer lists (courier/capabilities.py reads it from the operation table)
_CALL_SLACK_S = limits.AWAIT_CALL_SLACK_MS / limits.MS_PER_SECOND
# The event a run's first line carries, by phase: a stalled run is `running`, then `stalled`.
_FIRST = {QUEUED: "queued", WAITING: "waiting", RUNNING: "running", STALLED: "running"}
# The event that announces entering a phase.
_ENTER = {RUNNING: "started", STALLED: "stalled", WAITING: "waiting", FINISHED: "finished"}

Event = RunEvent | MachineErrorEvent


def now() -> str:
    return rfc3339(utc_now())


def run_event(name: str, result: Result, state: str | None = None) -> RunEvent:
    return RunEvent(
        event=name,
        ref=ref_of(result),
        state=state or result.state,
        at=now(),
        result=result if name == "finished" else None,
    )


@dataclass
class Tracker:
    """One machine's runs as last seen (agent ID → phase), and the events each new snapshot makes."""

    phases: dict[str, str] = field(default_factory=dict)
    ended: set[str] = field(default_factory=set)
    started: bool = False  # the first snapshot was taken

    def apply(self, results: list[Result]) -> list[RunEvent]:
        events: list[RunEvent] = []
        first = not self.started
        self.started = True
        for result in results:
            name, phase = result.agent_id, phase_of(result)
            if name in self.ended:
                continue
            previous = self.phases.get(name)
            if previous is None:
                if first:
                    if phase == FINISHED:
                        continue  # already terminal when watch started: no line
                    events.append(run_event(_FIRST[phase], result))
                    previous = RUNNING if phase == STALLED else phase
                else:
                    events.append(run_event("dispatched", result, "running"))  # also one that ended since
                    previous = QUEUED
            events += self._moves(previous, phase, result)
            if phase == FINISHED:
                self.phases.pop(name, None)
                self.ended.add(name)
            else:
                self.phases[name] = phase
        return events

    def forget_missing(self, live: set[str]) -> None:
        """A live run the machine no longer lists (its record was removed): nothing more will be said of it."""
        for name in set(self.phases) - live:
            del self.phases[name]

    @staticmethod
    def _moves(previous: str, phase: str, result: Result) -> list[RunEvent]:
        if phase == previous:
            return []
        out: list[RunEvent] = []
        # A run seen queued and next running or ended after its worker started: `started` first.
        if previous == QUEUED and phase in (STALLED, FINISHED) and result.worker_pid:
            out.append(run_event("started", result, "running"))  # it ran before it ended
        if previous == STALLED and phase == RUNNING:
            out.append(run_event("running", result))  # it wrote again
        else:
            out.append(run_event(_ENTER.get(phase, "queued"), result))
        return out

    def live(self) -> int:
        return len(self.phases)


@dataclass
class MachineState:
    """One machine's watch: what it last said, the receiver's cursor, and how it is asked."""

    tracker: Tracker = field(default_factory=Tracker)
    cursor: str = ""
    listed: set[str] = field(default_factory=set)  # the list fallback: every run listed so far
    mode: str = ""  # "watch", "list", or "" until the peer's capabilities are known
    answered: bool = False
    live: int = 0
    skipped: bool = False

    def export(self) -> dict[str, object]:
        """The state an MCP watch cursor carries between calls (docs/mcp.md)."""
        return {
            "c": self.cursor,
            "p": self.tracker.phases,
            "e": sorted(self.tracker.ended)[-limits.WATCH_ENDED_KEPT :],
            "s": self.tracker.started,
            "m": self.mode,
            "l": sorted(self.listed) if self.mode == "list" else [],
            "a": self.answered,
            "k": self.skipped,
        }

    @classmethod
    def restore(cls, body: object) -> MachineState:
        if not isinstance(body, dict):
            raise ValueError("not an object")
        phases, ended, listed = body.get("p", {}), body.get("e", []), body.get("l", [])
        if not isinstance(phases, dict) or not isinstance(ended, list) or not isinstance(listed, list):
            raise ValueError("bad fields")
        tracker = Tracker({str(k): str(v) for k, v in phases.items()}, {str(e) for e in ended}, bool(body.get("s")))
        state = cls(tracker, str(body.get("c", "")), {str(item) for item in listed}, str(body.get("m", "")))
        state.answered, state.skipped, state.live = bool(body.get("a")), bool(body.get("k")), tracker.live()
        return state


def check_configured(config: Config, machines: list[str]) -> None:
    """A machine that is not configured is a usage error, as in every command; `machine_error` and
    its retry are for configured machines that fail (docs/cli.md, wb agent watch)."""
    for machine in machines:
        if machine and machine not in config.targets:
            config.target(machine)  # raises the usual error, naming the configured machines


class Watch:
    """Every watched machine's thread, and the queue of events they fill."""

    def __init__(
        self,
        config: Config,
        machines: list[str],
        warn: Callable[[str], None],
        states: dict[str, MachineState] | None = None,
        wait_ms: int | None = None,
    ) -> None:
        self.config = config
        self.machines = machines
        self.warn = warn
        self.events: queue.Queue[tuple[str, list[Event]]] = queue.Queue()
        self.states = {machine: (states or {}).get(machine) or MachineState() for machine in machines}
        self.stopping = threading.Event()
        # Held while a reply is turned into events: `stop` then sees every machine between two replies.
        self.lock = threading.Lock()
        self.wait_ms = wait_ms
        self._own_home: str | None = None

    def start(self) -> None:
        from courier.runs.store import Store, home_id

        self._own_home = home_id(Store(self.config.home))
        for machine in self.machines:
            entry = self.config.targets.get(machine) if machine else None
            state = self.states[machine]
            if isinstance(entry, Problem):
                if not state.skipped:
                    self._error(machine, entry.message)
                state.skipped = True
                continue
            if state.skipped:
                continue
            threading.Thread(target=self._loop, args=(machine,), daemon=True, name=f"watch {machine}").start()

    def stop(self) -> dict[str, MachineState]:
        """Stop asking; the machines' states as of the last reply turned into events."""
        with self.lock:
            self.stopping.set()
            return dict(self.states)

    def idle(self) -> bool:
        states = [state for state in self.states.values() if not state.skipped]
        return all(state.answered and state.live == 0 for state in states)

    def _error(self, machine: str, message: str) -> None:
        event = MachineErrorEvent(event="machine_error", machine=machine, error=sanitize(message), at=now())
        self.events.put((machine, [event]))

    def _ask(self, machine: str, state: MachineState) -> tuple[RemoteResponse, list[Result], set[str], str]:
        """One call: (its reply, the snapshot, the live runs, the cursor after it)."""
        if not state.mode:
            state.mode = WATCH if not machine else self._mode_of(machine)
        if state.mode == WATCH:
            wait_ms = self.wait_ms or watch_wait_ms()
            call = request("watch", watch_cursor=state.cursor, wait_timeout_ms=wait_ms)
            response = ask(self.config, machine, call, timeout_s=wait_ms / limits.MS_PER_SECOND + _CALL_SLACK_S)
            results = response.results_of()
            cursor = response.watch_cursor or ""
        else:
            response = ask(self.config, machine, request("list"), timeout_s=limits.WATCH_RETRY_MAX_S)
            results = _list_snapshot(state.tracker, response.results_of(), set(state.listed))
            cursor = ""
        return response, results, {result.agent_id for result in results if not result.terminal}, cursor

    def _loop(self, machine: str) -> None:
        state = self.states[machine]
        pause = limits.WATCH_RETRY_FIRST_S
        while not self.stopping.is_set():
            try:
                response, results, live, cursor = self._ask(machine, state)
            except WbError as exc:
                with self.lock:
                    if self.stopping.is_set():
                        return
                    self._error(machine, exc.message)
                    state.mode = ""  # ask its capabilities again: it may come back upgraded
                if self.stopping.wait(pause):
                    return
                pause = min(pause * 2, limits.WATCH_RETRY_MAX_S)
                continue
            pause = limits.WATCH_RETRY_FIRST_S
            with self.lock:
                if self.stopping.is_set():
                    return  # not turned into events: the next watch asks again from the cursor before it
                if machine and not state.answered and self._own_home and response.home_id == self._own_home:
                    state.skipped = True  # the same WB_HOME as this machine: its runs are watched as this machine's
                    self.events.put((machine, []))
                    return
                for result in results:
                    if machine:
                        result.machine = machine
                if state.mode == "list":
                    state.listed.update(result.agent_id for result in response.results_of())
                state.cursor = cursor
                events: list[Event] = list(state.tracker.apply(results))
                state.tracker.forget_missing(live)
                state.answered, state.live = True, state.tracker.live()
                self.events.put((machine, events))
            if state.mode != WATCH and self.stopping.wait(limits.WATCH_LIST_POLL_S):
                return

    def _mode_of(self, machine: str) -> str:
        version = ask(self.config, machine, request("version"), timeout_s=limits.WATCH_RETRY_MAX_S)
        if WATCH in (version.capabilities or []):
            return WATCH
        self.warn(
            upgrade_message(machine, version.wb_version, "watch")
            + f"; polling its list every {limits.WATCH_LIST_POLL_S:g}s instead"
        )
        return "list"


def _list_snapshot(tracker: Tracker, results: list[Result], listed: set[str]) -> list[Result]:
    """The list fallback's snapshot: the live runs, and the ended runs that were live or not yet listed."""
    first = not tracker.started
    return [
        result
        for result in results
        if not result.terminal or result.agent_id in tracker.phases or (not first and result.agent_id not in listed)
    ]


def request(operation: str, **fields: object) -> RemoteRequest:
    return RemoteRequest.of(operation, **fields)


def watch_wait_ms() -> int:
    """WATCH_WAIT_DEFAULT_MS; a shorter wait can be set for tests (WB_WATCH_WAIT_MS)."""
    override = os.environ.get("WB_WATCH_WAIT_MS", "")
    if override.isdigit() and 0 < int(override) <= limits.WATCH_WAIT_DEFAULT_MS:
        return int(override)
    return limits.WATCH_WAIT_DEFAULT_MS


# -- printing and the --exec hook ---------------------------------------------------------------


def event_line(event: Event, as_json: bool) -> str:
    if as_json:
        return json.dumps(event.to_json(), ensure_ascii=True, separators=(",", ":")) + "\n"
    if isinstance(event, MachineErrorEvent):
        return f"{event.at} {event.machine or '(local)'} machine_error {event.error}\n"
    return f"{event.at} {sanitize(event.ref)} {event.event} {sanitize(event.state)}\n"


def hook_argv(command: str) -> list[str]:
    """--exec CMD split like a shell's words (never given to a shell); a bad one is a usage error."""
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise UsageError(f"--exec {command!r} cannot be split into words: {exc}") from None
    if not argv:
        raise UsageError("--exec needs a command (e.g. --exec ./on-finished)")
    return argv


class Hooks:
    """Runs --exec once per finished event, in order, on one thread, each within its bound;
    failures are reported, never fatal."""

    def __init__(self, argv: list[str], warn: Callable[[str], None], timeout_s: float) -> None:
        self.argv = argv
        self.warn = warn
        self.timeout_s = timeout_s
        self.current: subprocess.Popen[bytes] | None = None  # the CMD running now
        self.abandoned = threading.Event()  # a killed CMD did not end: drain no longer waits
        self.pending: queue.Queue[RunEvent | None] = queue.Queue()
        self.thread = threading.Thread(target=self._work, daemon=True, name="watch --exec")
        self.thread.start()

    def submit(self, event: RunEvent) -> None:
        self.pending.put(event)

    def drain(self) -> None:
        """Run what is pending, each CMD within its bound, then return; a CMD that outlives even its
        kill is not waited on (the thread is a daemon)."""
        self.pending.put(None)
        while self.thread.is_alive():
            self.thread.join(0.2)
            if self.abandoned.is_set():
                return

    def kill(self) -> None:
        """Kill the CMD running now, its group with it (watch is interrupted: none outlives it)."""
        child = self.current
        if child is not None:
            _kill_group(child.pid)

    def _work(self) -> None:
        while (event := self.pending.get()) is not None:
            self._run(event)

    def _run(self, event: RunEvent) -> None:
        assert event.result is not None
        document = json.dumps(event.result.to_wire(), ensure_ascii=False).encode() + b"\n"
        env = {**os.environ, "WB_REF": event.ref, "WB_STATE": event.state}
        shown = shlex.join(self.argv)
        try:
            # Its stdout goes to stderr: stdout is the event stream a supervisor parses. Its own
            # session, so that past its bound the whole group it made is killed, not only CMD.
            child = subprocess.Popen(
                self.argv, stdin=subprocess.PIPE, stdout=sys.stderr, env=env, start_new_session=True
            )
        except OSError as exc:
            self.warn(f"--exec {shown} for {event.ref} could not be started: {exc.strerror or exc}; watching goes on")
            return
        self.current = child
        try:
            self._wait(child, document, shown, event.ref)
        finally:
            self.current = None

    def _wait(self, child: subprocess.Popen[bytes], document: bytes, shown: str, ref: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        # On a thread of its own: a CMD that never reads a large Result must not block its bound.
        threading.Thread(target=_feed, args=(child, document), daemon=True, name="watch --exec stdin").start()
        try:
            code = child.wait(max(deadline - time.monotonic(), 0))
        except subprocess.TimeoutExpired:
            _kill_group(child.pid)
            self.warn(
                f"--exec {shown} for {ref} ran past its {self.timeout_s:g}s bound (--exec-timeout) "
                "and was killed; watching goes on"
            )
            try:
                child.wait(limits.WATCH_EXEC_REAP_S)
            except subprocess.TimeoutExpired:
                self.warn(f"--exec {shown} for {ref} (PID {child.pid}) did not end when killed; left behind")
                self.abandoned.set()
            return
        if code != 0:
            how = f"status {code}" if code > 0 else f"signal {-code}"
            self.warn(f"--exec {shown} for {ref} exited with {how}; watching goes on")


def _feed(child: subprocess.Popen[bytes], document: bytes) -> None:
    """The Result on CMD's stdin, then EOF; a CMD that does not read it (or has exited) is no error."""
    assert child.stdin is not None
    with contextlib.suppress(OSError):  # BrokenPipeError included
        child.stdin.write(document)
    with contextlib.suppress(OSError):
        child.stdin.close()


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def watch(
    config: Config,
    machines: list[str],
    *,
    as_json: bool,
    hook: list[str] | None,
    until_idle: bool,
    write: Callable[[str], None],
    warn: Callable[[str], None],
    exec_timeout_s: float = limits.WATCH_EXEC_TIMEOUT_DEFAULT_MS / limits.MS_PER_SECOND,
    since_ms: int = 0,
) -> None:
    """Print every event until Ctrl-C (KeyboardInterrupt, exit 130), or with `until_idle` until no run is live.
    With `since_ms`, first a `finished` line for each run that ended that long before watch started (`ended_since`).
    """
    check_configured(config, machines)
    started_at = time.time()
    fleet = Watch(config, machines, warn)
    hooks = Hooks(hook, warn, exec_timeout_s) if hook else None

    def emit(events: list[Event]) -> None:
        for event in events:
            write(event_line(event, as_json))
            if hooks is not None and isinstance(event, RunEvent) and event.event == "finished":
                hooks.submit(event)

    fleet.start()
    try:
        if since_ms:
            for events in ended_since(fleet, started_at - since_ms / limits.MS_PER_SECOND):
                emit(events)
        while True:
            try:
                _, events = fleet.events.get(timeout=0.5)
            except queue.Empty:
                continue
            emit(events)
            if until_idle and fleet.events.empty() and fleet.idle():
                break
    except BaseException:
        if hooks is not None:
            hooks.kill()
        raise
    finally:
        fleet.stop()
    if hooks is not None:
        hooks.drain()


def ended_since(fleet: Watch, since: float) -> list[list[Event]]:
    """`watch --since` (docs/cli.md, wb agent watch): the `finished` events of the runs that ended at or after
    `since` (epoch seconds) and that the watch will not report, oldest first, then the watch's events so far.

    The watch is started first and each machine's first answer awaited, so a run is either live in that
    snapshot (the watch reports its end) or listed here: none is missed between the list and the watch.
    While the list is read, the watch holds its replies (its lock), so none is reported twice either.
    """
    waiting = {machine for machine, state in fleet.states.items() if not state.skipped}
    held: list[list[Event]] = []
    deadline = time.monotonic() + limits.WATCH_RETRY_MAX_S
    while waiting and time.monotonic() < deadline:
        try:
            machine, events = fleet.events.get(timeout=0.2)
        except queue.Empty:
            continue
        held.append(events)
        waiting.discard(machine)
    ended: list[tuple[float, RunEvent]] = []
    with fleet.lock:
        while not fleet.events.empty():
            held.append(fleet.events.get_nowait()[1])
        reported = {event.ref for events in held for event in events if isinstance(event, RunEvent)}
        for machine, state in fleet.states.items():
            if state.skipped or not state.answered:
                continue  # its error is among the held events; its runs are reported when it answers
            try:
                results = ask(fleet.config, machine, request("list"), timeout_s=limits.WATCH_RETRY_MAX_S).results_of()
            except WbError as exc:
                fleet._error(machine, f"--since: {exc.message}")
                continue
            for result in results:
                if machine:
                    result.machine = machine
                finished = epoch_seconds(result.finished_at or "", 0.0)
                tracked = result.agent_id in state.tracker.phases or result.agent_id in state.tracker.ended
                if result.terminal and finished >= since and not tracked and ref_of(result) not in reported:
                    state.tracker.ended.add(result.agent_id)  # a later snapshot that lists it says nothing
                    ended.append((finished, run_event("finished", result)))
    ended.sort(key=lambda pair: pair[0])
    return [[event for _, event in ended], *held]


# -- the MCP watch tool (docs/mcp.md): one bounded call, a cursor to call again with ----------------

# After the first event, how long a watch call goes on collecting before it answers (one batch, not one per line).
_BATCH_S = 0.2


def encode_cursor(machines: list[str], states: dict[str, MachineState]) -> str:
    body = {"machines": machines, "states": {machine: states[machine].export() for machine in machines}}
    return base64.urlsafe_b64encode(json.dumps(body, separators=(",", ":")).encode()).decode()


def decode_cursor(text: str, machines: list[str]) -> dict[str, MachineState]:
    refused = UsageError("cursor is not one a watch call returned for these machines; call watch without it")
    try:
        body = json.loads(base64.urlsafe_b64decode(text.encode("ascii")))
        if not isinstance(body, dict) or body.get("machines") != machines:
            raise refused
        states = body["states"]
        return {machine: MachineState.restore(states[machine]) for machine in machines}
    except (ValueError, KeyError, TypeError, UnicodeError, binascii.Error):
        raise refused from None


def watch_once(
    config: Config, machines: list[str], cursor: str | None, wait_s: float, warn: Callable[[str], None]
) -> WatchDocument:
    """The events seen within `wait_s` (returning soon after the first), and the cursor to go on from."""
    check_configured(config, machines)
    states = decode_cursor(cursor, machines) if cursor else None
    wait_ms = max(1, min(int(wait_s * limits.MS_PER_SECOND), watch_wait_ms()))
    fleet = Watch(config, machines, warn, states, wait_ms=wait_ms)
    fleet.start()
    deadline = time.monotonic() + wait_s
    events: list[Event] = []
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (events and fleet.events.empty()) or (not events and fleet.idle()):
                break
            try:
                _, batch = fleet.events.get(timeout=min(remaining, _BATCH_S if events else remaining))
            except queue.Empty:
                continue
            events += batch
    finally:
        final = fleet.stop()
    while not fleet.events.empty():  # turned into events before the stop: they belong to this answer
        events += fleet.events.get_nowait()[1]
    return WatchDocument(events=events, cursor=encode_cursor(machines, final), idle=fleet.idle())
