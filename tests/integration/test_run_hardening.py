"""Issue 10's security and reliability items on one machine: private run directories, store files
opened without links, redaction after parsing, a full disk, escaped descendants, record identity,
and stop racing a run's end."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import CREDENTIAL_ENV, CREDENTIAL_VALUE, Machine, git, pid_alive, wait_for

# What these tests check holds for an unconfined worker (docs/config.md#sandbox): it holds the credential itself, so
# its echo is masked; the PIDs it reports are the machine's. Confined, it holds a placeholder and its PIDs are its
# own namespace's (tests/integration/test_confined_runs.py). Their machine runs its workers unconfined.
UNCONFINED = "sandbox:\n  default: \"off\"\n"


def _status(machine: Machine, ref: str) -> dict[str, Any]:
    result = machine.wb_json("agent", "status", ref)
    assert isinstance(result, dict)
    return result


def _await(machine: Machine, ref: str) -> dict[str, Any]:
    done = machine.wb("agent", "await", ref, "--json", "--wait-timeout", "120s")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert isinstance(result, dict)
    return result


def _run_dir(machine: Machine, ref: str) -> Path:
    return machine.home / "agents" / ref


@contextlib.contextmanager
def _umask(mask: int) -> Iterator[None]:
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


# -- 1. every file 0600 and every directory 0700 when the run ends --------------------------


def _modes_not_private(run_dir: Path) -> list[str]:
    wrong = []
    for top, dirs, files in os.walk(run_dir):
        for name in [*dirs, *files]:
            path = Path(top, name)
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                continue
            want = 0o700 if stat.S_ISDIR(info.st_mode) else 0o600
            if stat.S_IMODE(info.st_mode) != want:
                wrong.append(f"{path.relative_to(run_dir)} {oct(stat.S_IMODE(info.st_mode))}")
    if stat.S_IMODE(os.lstat(run_dir).st_mode) != 0o700:
        wrong.append(f". {oct(stat.S_IMODE(os.lstat(run_dir).st_mode))}")
    return wrong


@pytest.mark.parametrize(
    ("task", "extra", "outcome"),
    [
        ("scenario:complete", (), "completed"),
        ("scenario:fail", (), "failed"),
        ("scenario:hang", ("--timeout", "2s"), "timeout"),
        ("scenario:hang", (), "stopped"),
    ],
)
def test_every_file_is_0600_and_every_directory_0700_when_the_run_ends(
    machine: Machine, task: str, extra: tuple[str, ...], outcome: str
) -> None:
    machine.clone()
    with _umask(0o022):  # the harness writes its own files with the usual umask (0644, 0755)
        ref = machine.dispatch(*extra, task=task)
        run_dir = _run_dir(machine, ref)
        if outcome == "stopped":
            assert wait_for(lambda: (run_dir / "harness-home" / "logs_2.sqlite").exists(), 30)
            assert machine.wb("agent", "stop", ref).returncode == 0
        result = _await(machine, ref)
    expected_state = "failed" if outcome == "stopped" else outcome
    assert result["state"] == expected_state, result
    assert (run_dir / "harness-home" / "logs_2.sqlite").exists()
    assert (run_dir / "harness-home" / "skills" / ".system").is_dir()
    if outcome == "completed":
        assert (run_dir / "last-message.txt").exists()
    assert _modes_not_private(run_dir) == []


# -- 3. store files: no link followed, no FIFO blocking, a finding naming the file ---------


def _completed_run(machine: Machine) -> tuple[str, Path]:
    machine.clone()
    ref = machine.dispatch(task="scenario:complete")
    assert _await(machine, ref)["state"] == "completed"
    return ref, _run_dir(machine, ref)


@pytest.mark.parametrize("kind", ["symlink", "hardlink", "fifo"])
def test_logs_refuse_a_linked_or_special_transcript_naming_it(machine: Machine, tmp_path: Path, kind: str) -> None:
    ref, run_dir = _completed_run(machine)
    events = run_dir / "events.jsonl"
    events.unlink()
    big = tmp_path / "elsewhere.jsonl"
    big.write_bytes(b'{"type":"turn.started"}\n' * 130_000)  # about 3 MB
    if kind == "symlink":
        events.symlink_to(big)
        reason = "is a symbolic link"
    elif kind == "hardlink":
        os.link(big, events)
        reason = "has 2 hard links"
    else:
        os.mkfifo(events, 0o600)
        reason = "is a FIFO"
    for args in (("logs", ref), ("logs", ref, "--raw"), ("logs", ref, "--follow")):
        done = machine.wb("agent", *args, timeout=20)  # a FIFO must never hang
        assert done.returncode == 1, (args, done.stdout, done.stderr)
        assert done.stdout == ""
        assert f"error: {events} {reason}" in done.stderr
        assert "internal" not in done.stderr


@pytest.mark.parametrize("name", ["run.json", "task"])
def test_a_fifo_or_symlink_in_place_of_a_store_file_is_a_finding(machine: Machine, name: str) -> None:
    ref, run_dir = _completed_run(machine)
    target = run_dir / name
    target.unlink()
    os.mkfifo(target, 0o600)
    if name == "run.json":
        done = machine.wb("agent", "status", ref, timeout=20)
        assert done.returncode == 1 and f"{target} is a FIFO" in done.stderr, done.stderr
        listed = machine.wb("agent", "list", timeout=20)
        assert listed.returncode == 1 and f"warning: {ref}: {target} is a FIFO" in listed.stderr
    else:
        from courier.runs.store import Store, UnsafeStoreFile

        with pytest.raises(UnsafeStoreFile, match="is a FIFO"):
            Store(machine.home).read_task(ref)
        target.unlink()
        target.symlink_to(run_dir / "run.json")
        with pytest.raises(UnsafeStoreFile, match="is a symbolic link"):
            Store(machine.home).read_task(ref)


# -- 4. parse first, redact after; no credential left in the run directory ----------------


def test_a_credential_shorter_than_8_bytes_is_unusable_naming_its_variable(machine: Machine) -> None:
    machine.clone()
    machine.env[CREDENTIAL_ENV] = " e "  # one letter once trimmed: its mask would rewrite every `e`
    done = machine.wb(
        "agent", "dispatch", "--new-worktree", "w1", "--profile", "fake", "--repo", "acme/widget", "--task", "x"
    )
    assert done.returncode == 1, done.stderr
    assert f"the credential variable {CREDENTIAL_ENV} holds a credential shorter than 8 bytes" in done.stderr
    assert done.stdout == "" and list(machine.home.glob("agents/agt-*")) == []


def _stored_events(machine: Machine, ref: str) -> list[Any]:
    """Every line of the run's events.jsonl, a JSON one decoded (one that no longer is fails the test);
    the CLI's own text line on stderr stays text."""
    lines = (_run_dir(machine, ref) / "events.jsonl").read_bytes().splitlines()
    return [json.loads(line) if line.startswith((b"{", b'"')) else line.decode() for line in lines if line.strip()]


def test_a_credential_spelled_by_the_json_itself_leaves_every_stored_line_valid_json(machine: Machine) -> None:
    machine.clone()
    credential = '":"item.'  # 8 bytes that occur across the syntax of every Codex item event
    machine.env[CREDENTIAL_ENV] = credential
    ref = machine.dispatch(task="scenario:complete")
    result = _await(machine, ref)
    assert result["state"] == "completed", result  # parsed before it was redacted
    events = _stored_events(machine, ref)
    assert events and credential not in json.dumps(events, ensure_ascii=False)
    # An event without the credential in its text is stored as it was.
    assert any(isinstance(event, dict) and event.get("type") == "turn.completed" for event in events)


def test_a_json_escaped_credential_is_redacted_in_actions_diagnostics_and_the_transcript(machine: Machine) -> None:
    machine.write_config(machine.config_path.read_text() + UNCONFINED)  # see UNCONFINED
    machine.clone()
    ref = machine.dispatch(task="scenario:echo-credential-escaped")
    result = _await(machine, ref)
    assert result["state"] == "completed", result
    assert CREDENTIAL_VALUE not in json.dumps(result)
    assert CREDENTIAL_VALUE not in json.dumps(_stored_events(machine, ref), ensure_ascii=False)
    for args in (("logs", ref), ("logs", ref, "--follow"), ("logs", ref, "--raw"), ("status", ref, "--json")):
        done = machine.wb("agent", *args)
        assert done.returncode == 0, done.stderr
        assert CREDENTIAL_VALUE not in done.stdout + done.stderr, args
    logs = machine.wb("agent", "logs", ref).stdout
    assert "  ran: curl -H x-api-key:[redacted] http://x\n" in logs
    assert "  diagnostic: rejected key [redacted]\n" in logs
    # The harness's own JSON files in its home are redacted on their decoded strings too.
    home = _run_dir(machine, ref) / "harness-home"
    session = (home / "session-escaped.jsonl").read_bytes().splitlines()
    assert [json.loads(line) for line in session] == [{"note": "key [redacted]"}, {"other": 1}]
    assert json.loads((home / "chat-escaped.json").read_bytes()) == {"messages": ["key [redacted]"]}


def test_an_echoed_credential_is_redacted_in_every_file_the_harness_left(machine: Machine) -> None:
    machine.write_config(machine.config_path.read_text() + UNCONFINED)  # see UNCONFINED
    machine.clone()
    ref = machine.dispatch(task="scenario:echo-credential")
    result = _await(machine, ref)
    assert result["state"] == "completed"
    assert result["result"] == "The key is [redacted]."
    run_dir = _run_dir(machine, ref)
    leaks = [str(p) for p in run_dir.rglob("*") if p.is_file() and CREDENTIAL_VALUE.encode() in p.read_bytes()]
    assert leaks == []
    assert (run_dir / "last-message.txt").read_text() == "The key is [redacted]."
    assert (run_dir / "harness-home" / "session-notes.txt").read_text() == "the tool printed [redacted]\n"
    assert b"[redacted]" in (run_dir / "harness-home" / "logs_2.sqlite").read_bytes()
    assert _modes_not_private(run_dir) == []


def _spellings(value: str) -> list[bytes]:
    """The credential as written and JSON-escaped (lower- and upper-case hex), as bytes."""
    return [
        value.encode(),
        "".join(f"\\u{ord(char):04x}" for char in value).encode(),
        "".join(f"\\u{ord(char):04X}" for char in value).encode(),
    ]


def test_no_spelling_of_the_credential_is_left_in_any_file_whatever_its_format(machine: Machine) -> None:
    """An SQLite database (text, blob, a deleted row), a log, a TOML file and a binary file in the
    harness's home, each holding the credential raw and JSON-escaped: after the run, no file under
    the run directory holds any spelling of it, and the database is still a database."""
    import sqlite3

    machine.write_config(machine.config_path.read_text() + UNCONFINED)  # see UNCONFINED
    machine.clone()
    ref = machine.dispatch(task="scenario:echo-credential-everywhere")
    result = _await(machine, ref)
    assert result["state"] == "completed", result
    run_dir = _run_dir(machine, ref)
    leaks = [
        f"{path.relative_to(run_dir)}: {spelling[:12]!r}"
        for path in run_dir.rglob("*")
        if path.is_file()
        for spelling in _spellings(CREDENTIAL_VALUE)
        if spelling in path.read_bytes()
    ]
    assert leaks == []
    database = run_dir / "harness-home" / "state_5.sqlite"
    with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as connection:
        logs = connection.execute("SELECT body, raw FROM logs ORDER BY id").fetchall()
        cells = [*logs, *connection.execute("SELECT * FROM threads")]
    assert cells == [
        ("sent key [redacted]", b"[redacted]"),
        ('{"header":"[redacted]"}', b"[redacted]"),
        ("plain", None),
        ("t1", '{"auth":"Bearer [redacted]"}'),
    ]
    home = run_dir / "harness-home"
    assert (home / "codex-tui.log").read_text() == "request header x-api-key: [redacted]\nraw [redacted]\n"
    assert (home / "config-cache.toml").read_text() == 'key = "[redacted]"\n'
    assert _modes_not_private(run_dir) == []


# -- 5. a full disk ------------------------------------------------------------------------


@contextlib.contextmanager
def _small_tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir(mode=0o700)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], check=False)
    if mounted.returncode != 0:
        pytest.skip("mounting a small tmpfs needs root (CAP_SYS_ADMIN) on this machine")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _fill(directory: Path) -> Path:
    filler = directory / "filler"
    with open(filler, "wb") as handle, contextlib.suppress(OSError):
        while True:
            handle.write(b"\0" * 65536)
            handle.flush()
    return filler


def test_a_full_disk_at_dispatch_leaves_nothing_and_names_the_path(machine: Machine, tmp_path: Path) -> None:
    clone = machine.clone()
    with _small_tmpfs(tmp_path / "disk", "1m") as disk:
        machine.env["WB_HOME"] = str(disk / "wbhome")
        assert machine.wb("agent", "list").returncode == 0  # the home exists before the disk fills
        filler = _fill(disk)
        done = machine.wb(
            "agent", "dispatch", "--new-worktree", "w1", "--profile", "fake", "--repo", "acme/widget", "--task", "x"
        )
        assert done.returncode == 1, done.stderr
        assert done.stdout == ""
        assert "no space left on device" in done.stderr
        # The first thing a dispatch writes is which run holds the worktree (docs/runs.md#dispatch).
        assert f"cannot read or note the worktree's run under {disk / 'wbhome' / 'holders'}: " in done.stderr
        assert "internal" not in done.stderr
        assert [p.name for p in (disk / "wbhome" / "agents").iterdir()] == []
        assert [p.name for p in (disk / "wbhome" / "holders").iterdir()] == []
        # Room for that one page, none for the record: the worktree made before it goes again.
        os.truncate(filler, filler.stat().st_size - 4096)
        done = machine.wb(
            "agent", "dispatch", "--new-worktree", "w1", "--profile", "fake", "--repo", "acme/widget", "--task", "x"
        )
        assert done.returncode == 1, done.stderr
        assert f"cannot create the run record {disk / 'wbhome' / 'agents'}/agt-" in done.stderr
        assert "no space left on device" in done.stderr and "internal" not in done.stderr
        assert [p.name for p in (disk / "wbhome" / "agents").iterdir()] == []
        assert not (machine.projects / ".wb-worktrees" / "acme" / "widget" / "w1").exists()
        assert "wb/w1" not in git(clone, "branch", "--list")
        assert str(machine.projects / ".wb-worktrees") not in git(clone, "worktree", "list")
        assert machine.wb("agent", "list").returncode == 0
        filler.unlink()
        again = machine.wb(
            "agent", "dispatch", "--new-worktree", "w1", "--profile", "fake", "--repo", "acme/widget",
            "--task", "scenario:complete",
        )  # fmt: skip
        assert again.returncode == 0, again.stderr
        assert _await(machine, again.stdout.split()[0])["state"] == "completed"


def test_a_disk_that_fills_during_a_run_ends_it_with_a_recorded_reason(machine: Machine, tmp_path: Path) -> None:
    machine.clone()
    with _small_tmpfs(tmp_path / "disk", "3m") as disk:
        machine.env["WB_HOME"] = str(disk / "wbhome")
        ref = machine.dispatch(task="scenario:huge-output")
        result = _await(machine, ref)
        assert result["state"] in ("failed", "completed"), result
        said = " ".join([result.get("failure") or "", *(result.get("harness_diagnostics") or [])])
        assert "No space left on device" in said, result
        assert not [p for p in (disk / "wbhome" / "agents" / ref).iterdir() if p.name.endswith(".tmp")]


# -- 7. a worker's child in its own session ------------------------------------------------


def _setsid_pid(machine: Machine, ref: str, *, alive: bool = True) -> int:
    path = _run_dir(machine, ref) / "harness-home" / "setsid.pid"
    assert wait_for(path.exists, 30)
    pid = int(path.read_text())
    if not alive:  # the run may already have ended it: its diagnostics say so
        return pid
    assert pid_alive(pid)
    stat_fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    assert stat_fields[3] == str(pid)  # it leads its own session: the worker's group does not hold it
    return pid


@pytest.mark.parametrize("ending", ["stop", "timeout", "exit"])
def test_a_child_that_calls_setsid_is_ended_with_the_run(machine: Machine, ending: str) -> None:
    machine.write_config(machine.config_path.read_text() + UNCONFINED)  # see UNCONFINED
    machine.clone()
    task = "scenario:setsid-child after:" + ("complete" if ending == "exit" else "hang")
    ref = machine.dispatch(*(("--timeout", "3s") if ending == "timeout" else ()), task=task)
    # A run that completes on its own may end the child before the test looks at it.
    pid = _setsid_pid(machine, ref, alive=ending != "exit")
    try:
        if ending == "stop":
            done = machine.wb("agent", "stop", ref)
            assert done.returncode == 0 and "worker process" in done.stdout, done.stderr
        result = _await(machine, ref)
        assert result["state"] == {"stop": "failed", "timeout": "timeout", "exit": "completed"}[ending]
        assert wait_for(lambda: not pid_alive(pid), 10), f"setsid child {pid} survived {ending}"
        if ending != "stop":  # (on stop, stop itself may have ended it first)
            assert any(f"pids {pid}" in line for line in result.get("harness_diagnostics") or []), result
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# -- 11. a record's identity and its directory's owner and mode ----------------------------


def _two_runs(machine: Machine) -> tuple[str, str]:
    machine.clone()
    first = machine.dispatch(task="scenario:complete", worktree="a")
    second = machine.dispatch(task="scenario:complete", worktree="b")
    for ref in (first, second):
        assert _await(machine, ref)["state"] == "completed"
    return first, second


@pytest.mark.parametrize("how", ["hardlink", "copy"])
def test_a_run_json_from_another_run_is_not_shown_under_this_id(machine: Machine, how: str) -> None:
    first, second = _two_runs(machine)
    target = _run_dir(machine, second) / "run.json"
    target.unlink()
    source = _run_dir(machine, first) / "run.json"
    if how == "hardlink":
        os.link(source, target)
        reason = "has 2 hard links"
    else:
        target.write_bytes(source.read_bytes())
        target.chmod(0o600)
        reason = f"names run {first}, not {second}"
    listed = machine.wb("agent", "list", "--json")
    assert listed.returncode == 1
    ids = [r["agent_id"] for r in json.loads(listed.stdout)]
    assert second not in ids and ids.count(first) == (0 if how == "hardlink" else 1)
    assert f"warning: {second}: " in listed.stderr and reason in listed.stderr
    status = machine.wb("agent", "status", second)
    assert status.returncode == 1 and reason in status.stderr and status.stdout == ""


@pytest.mark.parametrize("how", ["mode", "owner"])
def test_a_record_directory_open_to_others_or_not_yours_is_refused(machine: Machine, how: str) -> None:
    first, second = _two_runs(machine)
    run_dir = _run_dir(machine, second)
    if how == "mode":
        run_dir.chmod(0o777)
        reason = "is writable by group or others"
    else:
        if os.getuid() != 0:
            pytest.skip("giving a directory to another uid needs root")
        os.chown(run_dir, 12345, 12345)
        run_dir.chmod(0o777)
        reason = "is owned by uid 12345, not by you"
    listed = machine.wb("agent", "list")
    assert listed.returncode == 1 and first in listed.stdout and second not in listed.stdout
    assert f"warning: {second}: {run_dir} {reason}" in listed.stderr
    status = machine.wb("agent", "status", second)
    assert status.returncode == 1 and f"{run_dir} {reason}" in status.stderr


# -- 13. stop just as the run finishes ------------------------------------------------------


def _released_and_exited(machine: Machine, ref: str) -> tuple[dict[str, Any], Path]:
    home = _run_dir(machine, ref) / "harness-home"
    assert wait_for((home / "ready").exists, 30)
    status = _status(machine, ref)
    return status, home / "release"


def test_stop_after_the_worker_exited_but_before_the_owner_saved_says_so_and_the_owner_records_it(
    machine: Machine,
) -> None:
    machine.clone()
    ref = machine.dispatch(task="scenario:wait-release")
    status, release = _released_and_exited(machine, ref)
    owner, worker = status["owner_pid"], status["worker_pid"]
    os.kill(owner, signal.SIGSTOP)  # the owner cannot record anything until it is continued
    try:
        release.write_text("go\n")
        assert wait_for(lambda: not pid_alive(worker), 30)  # exited 0 (a zombie of the stopped owner)
        done = machine.wb("agent", "stop", ref)
    finally:
        os.kill(owner, signal.SIGCONT)
    # Nothing to signal, and the run is not terminal yet: a finding (1), not "stopping … worker process".
    assert done.returncode == 1 and done.stdout == "", done.stderr
    assert done.stderr == (
        f"error: agent run {ref}: its worker is already gone; the stop is requested, but the run is still "
        f"recorded as running: its owner (process {owner}) has not recorded its end yet\n"
    )
    result = _await(machine, ref)
    assert result["state"] == "failed" and result["failure"].startswith("stopped on request at "), result


def test_stop_racing_the_terminal_save_agrees_with_the_recorded_state(machine: Machine) -> None:
    machine.clone()
    ref = machine.dispatch(task="scenario:wait-release")
    status, release = _released_and_exited(machine, ref)
    run_dir = _run_dir(machine, ref)
    # Hold the run's lock: the owner's terminal decision and stop both wait on it, then race.
    fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        release.write_text("go\n")
        assert wait_for(lambda: not pid_alive(status["worker_pid"]), 30)
        stopper = subprocess.Popen(
            [sys.executable, "-m", "courier.main", "agent", "stop", ref],
            env=machine.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    out, err = stopper.communicate(timeout=60)
    result = _await(machine, ref)
    if stopper.returncode == 0:  # the worker had exited: nothing was signalled, the owner recorded the stop
        assert out == f"{ref}: its worker is already gone; recorded as failed\n", err
        assert result["state"] == "failed" and result["failure"].startswith("stopped on request at ")
    else:
        assert stopper.returncode == 1 and f"agent run {ref} is already completed" in err, err
        assert result["state"] == "completed"
        assert not (run_dir / "stop-requested").exists()


def test_stop_of_a_finished_run_is_refused_and_leaves_no_stop_request(machine: Machine) -> None:
    ref, run_dir = _completed_run(machine)
    done = machine.wb("agent", "stop", ref)
    assert done.returncode == 1 and f"agent run {ref} is already completed" in done.stderr
    assert not (run_dir / "stop-requested").exists()
