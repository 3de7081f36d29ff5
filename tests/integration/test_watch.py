"""`wb agent watch` (docs/cli.md, wb agent watch): real processes, this machine and exec machines.

The exec machines are `env WB_HOME=… wb` (a machine with a home of its own, as `docker exec -i`
would reach one), behind a small launcher that can make one unreachable or run it as an
older wb without the `watch` operation.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import FAKES, REMOTE_CONFIG, Machine, make_clone, make_machine, wait_for

from courier.runs.store import Store
from protocol.entry import REMOTE_ARGUMENT, SERVE_ARGUMENT
from protocol.timestamps import rfc3339, utc_now
from tests.json_documents import check

WB = str(Path(sys.executable).parent / "wb")
# An exec machine's launcher: unreachable while a `down` file exists beside it; with `old` there,
# the wb it runs is an older one that has no `watch` operation (and does not list it).
LAUNCHER = """#!/bin/sh
here=$(dirname "$0")
if [ -e "$here/down" ]; then echo "box is down" >&2; exit 3; fi
if [ -e "$here/old" ]; then exec "$@" --wb-old; fi
exec "$@"
"""
OLD_WB = """#!{python}
import sys
if sys.argv[-1] == "--wb-old":
    del sys.argv[-1]
    import courier.ops  # installs the wire table, which an older wb had without watch
    from protocol import operations
    del operations.TABLE["watch"]
from courier.main import main
main()
"""


class Watcher:
    """A running `wb agent watch`: its stdout lines as they come."""

    def __init__(self, machine: Machine, *args: str, env: dict[str, str] | None = None) -> None:
        self.args = ("agent", "watch", *args)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "courier.main", *self.args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**machine.env, **(env or {})},
            cwd=machine.root,
        )
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in list(self.lines)]

    def saw(self, **wanted: str) -> bool:
        return any(all(event.get(k) == v for k, v in wanted.items()) for event in self.events())

    def finish(self, timeout: float = 90) -> tuple[int, str]:
        try:
            self.process.wait(timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
        self.reader.join(10)
        assert self.process.stderr is not None
        stderr = self.process.stderr.read()
        self.process.stderr.close()
        assert self.process.stdout is not None
        self.process.stdout.close()
        if "--json" in self.args:
            for line in self.lines:
                check("event", json.loads(line))
        return self.process.returncode, stderr


@pytest.fixture
def watcher_cleanup() -> Iterator[list[Watcher]]:
    made: list[Watcher] = []
    yield made
    for watcher in made:
        if watcher.process.poll() is None:
            watcher.process.kill()
            watcher.process.wait()


def _events_of(lines: list[dict[str, Any]], ref: str) -> list[str]:
    return [line["event"] for line in lines if line.get("ref") == ref]


def _release(machine: Machine, ref: str) -> None:
    """Let a `scenario:wait-release` run complete (the fake codex waits for this file in its home)."""
    home = machine.home / "agents" / ref / "harness-home"
    assert wait_for((home / "ready").exists, 60)
    (home / "release").write_text("go\n")


def test_a_local_watch_prints_each_run_until_idle_and_every_line_follows_the_event_schema(
    machine: Machine, watcher_cleanup: list[Watcher]
) -> None:
    machine.clone()
    done_before = machine.dispatch(task="scenario:complete", worktree="w0")
    assert machine.wb("agent", "await", done_before, "--wait-timeout", "60s").returncode == 0
    first = machine.dispatch(task="scenario:wait-release", worktree="w1")
    watcher = Watcher(machine, "--json", "--until-idle")
    watcher_cleanup.append(watcher)
    assert wait_for(lambda: watcher.saw(ref=first), 60), watcher.lines
    second = machine.dispatch(task="scenario:wait-release", worktree="w2")  # while watching
    assert wait_for(lambda: watcher.saw(ref=second, event="started"), 60), watcher.lines
    _release(machine, first)
    assert wait_for(lambda: watcher.saw(ref=first, event="finished"), 60), watcher.lines
    assert watcher.process.poll() is None  # the second run is still live
    _release(machine, second)
    code, stderr = watcher.finish(90)  # each line checked against the event schema
    assert code == 0, stderr
    lines = watcher.events()
    assert _events_of(lines, done_before) == []  # terminal when watch started: no line
    assert _events_of(lines, first)[0] in ("running", "queued") and _events_of(lines, first)[-1] == "finished"
    assert _events_of(lines, second) == ["dispatched", "started", "finished"]
    for ref in (first, second):
        finished = next(line for line in lines if line.get("ref") == ref and line["event"] == "finished")
        assert finished["state"] == "completed" and finished["result"]["agent_id"] == ref
    assert all("result" not in line for line in lines if line["event"] != "finished")

    text = machine.wb("agent", "watch", "--until-idle")  # nothing live: exits at once
    assert text.returncode == 0 and text.stdout == ""


def test_text_lines_name_time_ref_event_and_state(machine: Machine, watcher_cleanup: list[Watcher]) -> None:
    machine.clone()
    ref = machine.dispatch(task="scenario:wait-release", worktree="w1")
    watcher = Watcher(machine, "--until-idle")
    watcher_cleanup.append(watcher)
    assert wait_for(lambda: len(watcher.lines) >= 1, 60)
    _release(machine, ref)
    code, stderr = watcher.finish(90)
    assert code == 0, stderr
    rows = [line.split(" ") for line in watcher.lines]
    assert all(len(row) == 4 and row[0].endswith("Z") and row[1] == ref for row in rows), rows
    assert rows[-1][2:] == ["finished", "completed\n"]


def test_exec_hook_gets_the_result_and_a_failing_hook_does_not_stop_watching(
    machine: Machine, tmp_path: Path, watcher_cleanup: list[Watcher]
) -> None:
    machine.clone()
    hook = tmp_path / "on finished"
    record = tmp_path / "calls.jsonl"
    hook.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        "result = json.load(sys.stdin)\n"
        "seen = [os.environ['WB_REF'], os.environ['WB_STATE'], result['agent_id'], sys.argv[1]]\n"
        f"first = not os.path.exists({str(record)!r})\n"
        f"with open({str(record)!r}, 'a') as out:\n"
        "    out.write(json.dumps(seen) + '\\n')\n"
        "sys.exit(7 if first else 0)\n"
    )
    hook.chmod(0o755)
    first = machine.dispatch(task="scenario:hang", worktree="w1")
    second = machine.dispatch(task="scenario:hang", worktree="w2")
    command = f"'{hook}' 'one arg'"  # split like a shell's words: a quoted path with a space, one argument
    watcher = Watcher(machine, "--until-idle", "--exec", command)
    watcher_cleanup.append(watcher)
    assert wait_for(lambda: len(watcher.lines) >= 2, 60), watcher.lines
    assert machine.wb("agent", "stop", first).returncode == 0
    assert wait_for(lambda: record.exists(), 60)
    assert machine.wb("agent", "stop", second).returncode == 0
    code, stderr = watcher.finish(90)
    assert code == 0, stderr
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    assert calls == [[first, "failed", first, "one arg"], [second, "failed", second, "one arg"]]
    assert stderr.count("warning: --exec") == 1, stderr
    assert f"for {first} exited with status 7; watching goes on" in stderr
    assert any(line.split()[1:] == [second, "finished", "failed"] for line in watcher.lines), watcher.lines


def test_a_bad_exec_command_is_a_usage_error(machine: Machine) -> None:
    done = machine.wb("agent", "watch", "--exec", "'unterminated")
    assert done.returncode == 2 and done.stderr.startswith("error: --exec") and done.stdout == ""
    both = machine.wb("agent", "watch", "--to", "x", "--all")
    assert both.returncode == 2 and "either --to MACHINE or --all" in both.stderr


def test_an_exec_cmd_past_its_bound_is_killed_with_its_group_and_until_idle_still_exits(
    machine: Machine, tmp_path: Path, watcher_cleanup: list[Watcher]
) -> None:
    """`--exec 'sleep 600'` must not keep watch (or an orphan) alive: past --exec-timeout the CMD's
    process group is killed and reported, and --until-idle exits 0 once idle."""
    from conftest import pid_alive

    machine.clone()
    ref = machine.dispatch(task="scenario:wait-release", worktree="w1")
    pids = tmp_path / "pids"
    script = f"echo $$ > {pids}.cmd; sleep 600 & echo $! > {pids}.child; wait"
    command = f"/bin/sh -c '{script}'"
    watcher = Watcher(machine, "--until-idle", "--exec", command, "--exec-timeout", "2s")
    watcher_cleanup.append(watcher)
    assert wait_for(lambda: len(watcher.lines) >= 1, 60), watcher.lines
    _release(machine, ref)
    assert wait_for(lambda: Path(f"{pids}.child").exists() and Path(f"{pids}.child").read_text().strip(), 60)
    started = time.monotonic()
    code, stderr = watcher.finish(30)
    assert code == 0, stderr
    assert time.monotonic() - started < 20
    assert f"for {ref} ran past its 2s bound (--exec-timeout) and was killed; watching goes on" in stderr, stderr
    for name in ("cmd", "child"):
        pid = int(Path(f"{pids}.{name}").read_text())
        assert wait_for(lambda pid=pid: not pid_alive(pid), 10), f"the CMD's {name} {pid} outlived watch"
    bad = machine.wb("agent", "watch", "--exec", "true", "--exec-timeout", "soon")
    assert bad.returncode == 2 and bad.stderr.startswith("error: --exec-timeout"), bad.stderr
    zero = machine.wb("agent", "watch", "--exec", "true", "--exec-timeout", "0s")
    assert zero.returncode == 2 and "--exec-timeout must be more than 0" in zero.stderr, zero.stderr


def test_ctrl_c_exits_130(machine: Machine, watcher_cleanup: list[Watcher]) -> None:
    machine.clone()
    ref = machine.dispatch(task="scenario:hang", worktree="w1")
    watcher = Watcher(machine, "--json")
    watcher_cleanup.append(watcher)
    assert wait_for(lambda: watcher.saw(ref=ref), 60)
    watcher.process.send_signal(signal.SIGINT)
    code, _ = watcher.finish(30)
    assert code == 130
    machine.wb("agent", "stop", ref)


# -- exec machines -----------------------------------------------------------------------------


def _exec_box(caller: Machine, base: Path, name: str) -> tuple[Machine, dict[str, Any]]:
    """A machine reached with `launcher env WB_HOME=… wb`: its own home, projects, config and fake codex."""
    box = make_machine(base / name)
    make_clone(box.projects / "acme" / "widget")
    credential = box.root / "credential"
    credential.write_text("sk-test-box-credential-0d4f7c1e")
    credential.chmod(0o600)
    box.write_config(REMOTE_CONFIG.format(credential=credential))
    launcher = box.root / "launch"
    launcher.write_text(LAUNCHER)
    launcher.chmod(0o755)
    old_wb = box.root / "wb"
    old_wb.write_text(OLD_WB.format(python=sys.executable))
    old_wb.chmod(0o755)
    argv = [
        str(launcher), "env", f"WB_HOME={box.home}", f"WB_CONFIG={box.config_path}",
        f"WB_PROJECTS_ROOT={box.projects}", f"PATH={FAKES}:{Path(sys.executable).parent}:/usr/bin:/bin",
        f"PYTHONPATH={Path(__file__).resolve().parents[2]}",
    ]  # fmt: skip
    return box, {"exec": {"argv": argv, "wb_path": str(old_wb)}}


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[Machine, dict[str, Machine]]]:
    from conftest import _kill_leftovers

    caller = make_machine(tmp_path / "caller")
    caller.clone()
    boxes: dict[str, Machine] = {}
    targets: dict[str, Any] = {}
    for name in ("alpha", "beta"):
        boxes[name], targets[name] = _exec_box(caller, tmp_path, name)
    config = yaml.safe_load(caller.config_path.read_text())
    config["session_move"] = {"targets": targets}
    caller.write_config(yaml.safe_dump(config))
    yield caller, boxes
    _kill_leftovers(tmp_path)


def _end_receivers(box: Machine) -> None:
    """End the wb receivers (one-call and serve processes) this test's courier or watch started for `box`."""
    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if REMOTE_ARGUMENT not in cmdline and SERVE_ARGUMENT not in cmdline:  # never a run's owner
            continue
        try:
            if proc.environ().get("WB_HOME") == str(box.home):
                proc.kill()
        except psutil.Error:
            continue


def _dispatch_to(caller: Machine, machine: str, task: str, worktree: str) -> str:
    done = caller.wb(
        "agent", "dispatch", "--to", machine, "--new-worktree", worktree, "--profile", "fake",
        "--repo", "acme/widget", "--task", task,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.split()[0]


def test_all_watches_this_machine_and_every_exec_machine(
    fleet: tuple[Machine, dict[str, Machine]], watcher_cleanup: list[Watcher]
) -> None:
    caller, _ = fleet
    local = caller.dispatch(task="scenario:hang", worktree="l1")
    alpha = _dispatch_to(caller, "alpha", "scenario:hang", "a1")
    beta = _dispatch_to(caller, "beta", "scenario:hang", "b1")
    assert alpha.startswith("alpha:agt-") and beta.startswith("beta:agt-")
    watcher = Watcher(caller, "--all", "--json", "--until-idle")
    watcher_cleanup.append(watcher)
    assert wait_for(lambda: all(watcher.saw(ref=ref) for ref in (local, alpha, beta)), 60), watcher.lines
    for ref in (local, alpha, beta):
        assert caller.wb("agent", "stop", ref).returncode == 0
    code, stderr = watcher.finish(90)
    assert code == 0, stderr
    lines = watcher.events()
    for ref in (local, alpha, beta):
        assert _events_of(lines, ref)[0] == "running" and _events_of(lines, ref)[-1] == "finished", (ref, lines)
    finished = {line["ref"]: line["result"].get("machine") for line in lines if line["event"] == "finished"}
    assert finished == {local: None, alpha: "alpha", beta: "beta"}


def test_a_machine_that_is_not_configured_is_a_usage_error_naming_the_configured_ones(
    fleet: tuple[Machine, dict[str, Machine]],
) -> None:
    caller, _ = fleet
    for args in (("--until-idle",), ("--json",), ()):
        done = caller.wb("agent", "watch", "--to", "nowhere", *args, timeout=30)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stdout == ""
        assert done.stderr.startswith('error: unknown machine "nowhere": configured machines: alpha, beta'), done.stderr


def test_a_machine_that_goes_away_is_a_machine_error_then_watched_again(
    fleet: tuple[Machine, dict[str, Machine]], watcher_cleanup: list[Watcher]
) -> None:
    caller, boxes = fleet
    first = _dispatch_to(caller, "alpha", "scenario:hang", "a1")
    watcher = Watcher(caller, "--to", "alpha", "--json", "--until-idle", env={"WB_WATCH_WAIT_MS": "1000"})
    watcher_cleanup.append(watcher)
    assert wait_for(lambda: watcher.saw(ref=first), 60), watcher.lines
    (boxes["alpha"].root / "down").write_text("")
    _end_receivers(boxes["alpha"])  # the courier's serve process for it too: the machine is gone
    assert wait_for(lambda: any("box is down" in e.get("error", "") for e in watcher.events()), 60), watcher.lines
    assert watcher.process.poll() is None  # never an exit: asked again, with backoff
    # While it is away, its run ends; once it is back, watch reports that.
    box_env = {**boxes["alpha"].env}
    stopped = subprocess.run(
        [sys.executable, "-m", "courier.main", "agent", "stop", first.split(":", 1)[1]],
        env=box_env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert stopped.returncode == 0, stopped.stderr
    (boxes["alpha"].root / "down").unlink()
    code, stderr = watcher.finish(90)
    assert code == 0, stderr
    events = watcher.events()
    errors = [event for event in events if event["event"] == "machine_error"]
    assert all(set(error) == {"event", "machine", "error", "at"} and error["machine"] == "alpha" for error in errors)
    assert _events_of(events, first)[-1] == "finished"
    assert [e["state"] for e in events if e.get("ref") == first and e["event"] == "finished"] == ["failed"]


def test_an_older_peer_without_watch_is_polled_with_list(
    fleet: tuple[Machine, dict[str, Machine]], watcher_cleanup: list[Watcher]
) -> None:
    caller, boxes = fleet
    (boxes["beta"].root / "old").write_text("")
    ref = _dispatch_to(caller, "beta", "scenario:hang", "b1")
    watcher = Watcher(caller, "--to", "beta", "--json", "--until-idle")
    watcher_cleanup.append(watcher)
    assert wait_for(lambda: watcher.saw(ref=ref), 60), watcher.lines
    later = _dispatch_to(caller, "beta", "scenario:hang", "b2")
    assert wait_for(lambda: watcher.saw(ref=later, event="dispatched"), 60), watcher.lines
    for run in (ref, later):
        assert caller.wb("agent", "stop", run).returncode == 0
    code, stderr = watcher.finish(90)
    assert code == 0, stderr
    assert "machine beta runs wb" in stderr and "which does not support watch" in stderr
    assert "polling its list every 1s instead" in stderr
    events = watcher.events()
    assert _events_of(events, ref) == ["running", "finished"]
    assert _events_of(events, later)[0] == "dispatched" and _events_of(events, later)[-1] == "finished"


def test_with_the_courier_a_machine_costs_one_pending_call(
    fleet: tuple[Machine, dict[str, Machine]], watcher_cleanup: list[Watcher]
) -> None:
    if not sys.platform.startswith("linux"):
        pytest.fail("the courier runs on Linux")
    caller, _ = fleet
    on = {"WB_COURIER": "on"}
    refs = [_dispatch_to(caller, "alpha", "scenario:hang", f"a{i}") for i in range(3)]
    watcher = Watcher(caller, "--to", "alpha", "--json", env={**on, "WB_WATCH_WAIT_MS": "30000"})
    watcher_cleanup.append(watcher)

    def working(ref: str) -> bool:  # its worker started: nothing about it changes until it is stopped
        events = _events_of(watcher.events(), ref)
        return bool(events) and events[-1] in ("running", "started")

    assert wait_for(lambda: all(working(ref) for ref in refs), 60), watcher.lines

    def calls() -> int:
        done = caller.wb("courier", "status", "--json", env=on)
        rows = [row for row in json.loads(done.stdout).get("machines") or [] if row["machine"] == "alpha"]
        return int(rows[0]["calls"]) if rows else -1

    last = [calls()]

    def settled() -> bool:  # the call after the last change has reached the courier
        now = calls()
        steady = now == last[0]
        last[0] = now
        return steady

    assert wait_for(settled, 30, interval=0.5)
    before = last[0]
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:  # three live runs, no change: the one watch call stays pending
        assert calls() == before
    for ref in refs:
        assert caller.wb("agent", "stop", ref, env=on).returncode == 0
    assert wait_for(lambda: sum(e["event"] == "finished" for e in watcher.events()) == 3, 60), watcher.lines
    watcher.process.send_signal(signal.SIGINT)
    code, _ = watcher.finish(30)
    assert code == 130
    # Three runs, each stopped: far fewer calls than a poll per run would make.
    assert calls() - before <= 8
    caller.wb("courier", "stop", env=on)


# -- --since -----------------------------------------------------------------------------------


def _finished_ago(machine: Machine, agent_id: str, seconds: float) -> None:
    """Move a finished run's end back in time, as if it had ended `seconds` ago."""
    store = Store(machine.home)
    record = store.load(agent_id)
    record.finished_at = rfc3339(utc_now() - timedelta(seconds=seconds))
    store.save(record)


def test_since_first_reports_each_run_that_ended_that_recently_oldest_first_and_runs_exec_for_it(
    fleet: tuple[Machine, dict[str, Machine]], tmp_path: Path, watcher_cleanup: list[Watcher]
) -> None:
    caller, boxes = fleet
    old = caller.dispatch(task="scenario:complete", worktree="l0")
    recent = caller.dispatch(task="scenario:complete", worktree="l1")
    remote = _dispatch_to(caller, "alpha", "scenario:complete", "a1")
    for ref in (old, recent, remote):
        assert caller.wb("agent", "await", ref, "--wait-timeout", "60s").returncode == 0
    _finished_ago(caller, old, 2 * 3600)  # outside --since 1h
    _finished_ago(caller, recent, 1800)
    _finished_ago(boxes["alpha"], remote.split(":", 1)[1], 600)
    live = caller.dispatch(task="scenario:wait-release", worktree="l2")
    record = tmp_path / "hooked.txt"
    hook = tmp_path / "hook"
    hook.write_text(f"#!/bin/sh\necho \"$WB_REF\" >> '{record}'\n")
    hook.chmod(0o755)
    watcher = Watcher(caller, "--all", "--json", "--until-idle", "--since", "1h", "--exec", str(hook))
    watcher_cleanup.append(watcher)
    assert wait_for(lambda: watcher.saw(ref=live), 60), watcher.lines
    _release(caller, live)
    code, stderr = watcher.finish(90)
    assert code == 0, stderr
    lines = watcher.events()
    assert [(line["ref"], line["event"]) for line in lines[:2]] == [(recent, "finished"), (remote, "finished")]
    assert _events_of(lines, old) == [] and _events_of(lines, recent) == ["finished"]
    assert _events_of(lines, live)[-1] == "finished" and lines[2]["ref"] == live  # then the live lines
    assert record.read_text().splitlines() == [recent, remote, live]  # --exec for each finished line, in order


def test_since_must_be_a_duration_above_0(machine: Machine) -> None:
    for value in ("0", "soon"):
        done = machine.wb("agent", "watch", "--since", value)
        assert done.returncode == 2 and done.stdout == "" and done.stderr.startswith("error: "), done.stderr
