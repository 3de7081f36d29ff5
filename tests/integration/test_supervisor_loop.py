"""The supervisor's loop on this machine (docs/cli.md#the-supervisors-loop): diff, follow, stall, continue, prune, as a
user runs them."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path

from conftest import CONFIG_TEMPLATE, CREDENTIAL_ENV, Machine, git, wait_for

from courier.runs.store import Record, Store, rfc3339
from tests.tests_support import sample_record

# A worker that outlives its killed owner exists only unconfined (a confined one dies with its owner): the test
# that needs one runs its machine unconfined (docs/config.md#sandbox).
UNCONFINED = "sandbox:\n  default: \"off\"\n"


def _await(machine: Machine, ref: str, bound: str = "60s") -> dict[str, object]:
    done = machine.wb("agent", "await", ref, "--wait-timeout", bound, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def _status(machine: Machine, ref: str) -> dict[str, object]:
    return machine.wb_json("agent", "status", ref)  # type: ignore[return-value]


def _worktree(machine: Machine, name: str = "w1") -> Path:
    return machine.projects / ".wb-worktrees/acme/widget" / name


def _fingerprint(worktree: Path) -> tuple[str, str]:
    status = git(worktree, "status", "--porcelain=v1", "-z", "--untracked-files=all")
    index = git(worktree, "rev-parse", "--git-path", "index").strip()
    return status, hashlib.sha256((worktree / index).read_bytes()).hexdigest()


def _with_profile(machine: Machine, extra: str) -> None:
    machine.write_config(CONFIG_TEMPLATE.format(credential_env=CREDENTIAL_ENV) + extra)


# -- diff ----------------------------------------------------------------------------------


def test_diff_of_a_finished_run_is_a_patch_git_apply_takes_and_leaves_the_worktree_alone(
    machine: Machine, tmp_path: Path
) -> None:
    """New untracked files (text and binary) are in the patch; status and index are byte-identical after."""
    clone = machine.clone()
    ref = machine.dispatch()
    _await(machine, ref)
    worktree = _worktree(machine)
    (worktree / "logo.bin").write_bytes(b"\x00\x01\xffpng")
    (worktree / "README.md").write_text("# widget\nchanged\n")
    before = _fingerprint(worktree)

    patch = subprocess.run(
        [sys.executable, "-m", "courier.main", "agent", "diff", ref],
        capture_output=True,
        env=machine.env,
        cwd=machine.root,
        timeout=60,
    )
    assert patch.returncode == 0, patch.stderr
    assert _fingerprint(worktree) == before
    assert b"diff --git a/hello.txt b/hello.txt\nnew file mode 100644" in patch.stdout
    assert b"GIT binary patch" in patch.stdout

    fresh = tmp_path / "fresh"
    subprocess.run(["git", "clone", "-q", str(clone), str(fresh)], check=True, capture_output=True)
    subprocess.run(["git", "apply", "-"], cwd=fresh, input=patch.stdout, check=True, capture_output=True)
    for name in ("hello.txt", "logo.bin", "README.md"):
        assert (fresh / name).read_bytes() == (worktree / name).read_bytes()

    stat_out = machine.wb("agent", "diff", ref, "--stat")
    assert stat_out.returncode == 0, stat_out.stderr
    lines = stat_out.stdout.splitlines()
    assert "+1 -0 hello.txt" in lines and "+0 -0 logo.bin (binary)" in lines and "+1 -0 README.md" in lines
    assert lines[-1] == "3 files changed, +2 -0"

    document = machine.wb_json("agent", "diff", ref)
    assert isinstance(document, dict)
    assert set(document) == {"agent_id", "base_sha", "head_sha", "files", "patch"}
    assert document["agent_id"] == ref and "machine" not in document
    assert {"path": "logo.bin", "status": "added", "insertions": 0, "deletions": 0, "binary": True} in document["files"]
    assert document["patch"].encode() == patch.stdout
    stat_json = machine.wb_json("agent", "diff", ref, "--stat")
    assert isinstance(stat_json, dict) and "patch" not in stat_json


def test_diff_works_while_the_run_is_running(machine: Machine) -> None:
    """A snapshot of a live run's worktree."""
    machine.clone()
    ref = machine.dispatch(task="scenario:silent")
    assert wait_for(lambda: _status(machine, ref).get("worker_alive") is True, 20)
    (_worktree(machine) / "progress.txt").write_text("half done\n")
    document = machine.wb_json("agent", "diff", ref)
    assert isinstance(document, dict) and _status(machine, ref)["state"] == "running"
    assert [change["path"] for change in document["files"]] == ["progress.txt"]
    machine.wb("agent", "stop", ref)


def test_diff_on_this_machine_has_no_wire_cap(machine: Machine) -> None:
    """Asked in-process (through this machine's transport), a patch over 2 MiB prints whole."""
    machine.clone()
    ref = machine.dispatch()
    _await(machine, ref)
    (_worktree(machine) / "big.txt").write_text(("y" * 99 + "\n") * 30_000)  # 3 MB of added lines
    done = machine.wb("agent", "diff", ref)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("\n+" + "y" * 99) == 30_000


def test_diff_of_a_run_whose_worktree_is_gone_is_a_finding_naming_it(machine: Machine) -> None:
    machine.clone()
    ref = machine.dispatch()
    _await(machine, ref)
    worktree = _worktree(machine)
    subprocess.run(["rm", "-rf", str(worktree)], check=True)
    done = machine.wb("agent", "diff", ref)
    assert done.returncode == 1 and done.stdout == ""
    assert str(worktree) in done.stderr and "gone" in done.stderr


def test_diff_of_an_unknown_run_is_a_finding(machine: Machine) -> None:
    done = machine.wb("agent", "diff", "agt-" + "0" * 32)
    assert done.returncode == 1 and "unknown agent run" in done.stderr


# -- logs --follow -------------------------------------------------------------------------


def test_follow_prints_actions_as_they_happen_and_the_terminal_state_last(machine: Machine) -> None:
    machine.clone()
    ref = machine.dispatch(task="scenario:steps steps:4 every:1.5")
    follower = subprocess.Popen(
        [sys.executable, "-m", "courier.main", "agent", "logs", ref, "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=machine.env,
        cwd=machine.root,
    )
    assert follower.stdout is not None
    first = follower.stdout.readline()
    while first.startswith("  diagnostic: "):  # the fake's stderr notice, as `logs` shows it too
        first = follower.stdout.readline()
    assert first == "  ran: /bin/bash -lc 'echo step 1'\n"
    assert _status(machine, ref)["state"] == "running"  # printed while the run was still going
    assert follower.stderr is not None
    with follower.stdout, follower.stderr:
        rest, stderr = follower.stdout.read(), follower.stderr.read()  # the reader readline buffered into
    follower.wait(timeout=60)
    assert follower.returncode == 0, stderr
    lines = [first.rstrip("\n"), *rest.splitlines()]
    assert lines[:2] == ["  ran: /bin/bash -lc 'echo step 1'", "  ran: /bin/bash -lc 'echo step 2'"]
    assert lines[2:] == [
        "  ran: /bin/bash -lc 'echo step 3'",
        "  ran: /bin/bash -lc 'echo step 4'",
        f"{ref} completed",
    ]


def test_follow_of_a_failed_run_shows_the_failure_once_and_the_state(machine: Machine) -> None:
    """Codex's `error` echo before `turn.failed` is one action, as in logs."""
    machine.clone()
    ref = machine.dispatch(task="scenario:fail")
    _await(machine, ref)
    done = machine.wb("agent", "logs", ref, "--follow")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len([line for line in lines if "401 Unauthorized" in line]) == 2  # the action and the failure
    assert lines[-1].startswith(f"{ref} failed: ")


def test_follow_json_is_one_document_a_line_the_actions_of_logs_json_then_the_end(machine: Machine) -> None:
    machine.clone()
    ref = machine.dispatch(task="scenario:fail")
    _await(machine, ref)
    done = machine.wb("agent", "logs", ref, "--follow", "--json")  # each line checked against follow-line.json
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    listed = machine.wb_json("agent", "logs", ref, "--tail", "1000")
    assert isinstance(listed, dict)
    assert [line["action"] for line in lines[:-1]] == listed["actions"] and listed["actions"]
    assert all(line["agent_id"] == ref and line["state"] is None and "machine" not in line for line in lines[:-1])
    end = lines[-1]
    assert end["action"] is None and end["state"] == "failed" and "401 Unauthorized" in end["failure"]


def test_ctrl_c_while_following_exits_130_with_the_resume_hint(machine: Machine) -> None:
    machine.clone()
    ref = machine.dispatch(task="scenario:silent")
    follower = subprocess.Popen(
        [sys.executable, "-m", "courier.main", "agent", "logs", ref, "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=machine.env,
        cwd=machine.root,
    )
    assert follower.stdout is not None
    while not follower.stdout.readline().startswith("  ran: "):
        pass
    follower.send_signal(signal.SIGINT)
    _, stderr = follower.communicate(timeout=30)
    assert follower.returncode == 130
    assert stderr == f"interrupted; the run continues; follow it again with wb agent logs {ref} --follow\n"
    assert _status(machine, ref)["state"] == "running"
    machine.wb("agent", "stop", ref)


def test_follow_refuses_raw(machine: Machine) -> None:
    done = machine.wb("agent", "logs", "agt-" + "0" * 32, "--follow", "--raw")
    assert done.returncode == 2 and "--raw" in done.stderr


# -- stall ---------------------------------------------------------------------------------


def test_a_silent_run_is_reported_stalled_and_listed_by_list_stalled(machine: Machine) -> None:
    machine.clone()
    _with_profile(machine, "    quiet: {harness: codex, provider: mock, model: gpt-5.5, stall_after: 1s}\n")
    stalled = machine.dispatch("--profile", "quiet", task="scenario:silent")
    busy = machine.dispatch(task="scenario:silent", worktree="w2")  # default 10m: not stalled yet
    assert wait_for(lambda: "stalled_since" in _status(machine, stalled), 20)
    result = _status(machine, stalled)
    assert result["state"] == "running" and result["last_output_at"]
    assert "stalled_since" not in _status(machine, busy) and "last_output_at" in _status(machine, busy)
    text = machine.wb("agent", "status", stalled).stdout
    assert any(line.startswith("state:    running (stalled ") and line.endswith("s)") for line in text.splitlines())
    listed = machine.wb("agent", "list", "--stalled")
    assert listed.returncode == 0
    assert [line.split("\t")[0] for line in listed.stdout.splitlines()] == [stalled]
    assert "\trunning (stalled " in listed.stdout
    for ref in (stalled, busy):
        machine.wb("agent", "stop", ref)
    assert machine.wb("agent", "list", "--stalled").stdout == "no dispatched agent runs\n"


def test_stop_when_stalled_makes_the_owner_stop_the_silent_run(machine: Machine) -> None:
    machine.clone()
    _with_profile(
        machine,
        "    quiet: {harness: codex, provider: mock, model: gpt-5.5, stall_after: 1s, stop_when_stalled: 500ms}\n",
    )
    ref = machine.dispatch("--profile", "quiet", task="scenario:silent")
    result = _await(machine, ref)
    assert result["state"] == "failed"
    assert str(result["failure"]).startswith("stalled: no output since ")
    assert not result["worker_alive"]


def test_a_bad_stall_setting_is_a_configuration_error(machine: Machine) -> None:
    machine.clone()
    _with_profile(machine, "    quiet: {harness: codex, provider: mock, model: gpt-5.5, stall_after: 10}\n")
    done = machine.wb(
        "agent", "dispatch", "--new-worktree", "w1", "--profile", "quiet", "--repo", "acme/widget", "--task", "x"
    )
    assert done.returncode == 2 and "stall_after" in done.stderr


# -- continue ------------------------------------------------------------------------------


def test_continue_resumes_the_session_in_the_same_worktree(machine: Machine) -> None:
    machine.clone()
    parent = machine.dispatch()
    first = _await(machine, parent)
    assert first["session_id"]
    done = machine.wb("agent", "continue", parent, "--task", "scenario:complete file:second.txt")
    assert done.returncode == 0, done.stderr
    child, state, location, _ = done.stdout.split()
    assert child != parent and state == "running" and location == "w1"
    second = _await(machine, child)
    assert second["state"] == "completed", second
    assert second["parent_id"] == parent and second["session_id"] == first["session_id"]
    assert second["result"] == f"resumed {first['session_id']} after 1 earlier turn(s); created second.txt."
    assert second["base_sha"] == first["base_sha"] and second["worktree"] == "w1"
    assert (_worktree(machine) / "second.txt").exists() and (_worktree(machine) / "hello.txt").exists()
    home = machine.home / "agents" / child / "harness-home"
    for path in [home, *home.rglob("*")]:
        mode = stat.S_IMODE(os.lstat(path).st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))
    assert list(home.rglob("rollout-*.jsonl"))
    text = machine.wb("agent", "status", child).stdout
    assert f"parent:   {parent}\n" in text


def test_continue_is_refused_while_the_parent_runs(machine: Machine) -> None:
    machine.clone()
    ref = machine.dispatch(task="scenario:silent")
    done = machine.wb("agent", "continue", ref, "--task", "more")
    assert done.returncode == 1 and "still running" in done.stderr and done.stdout == ""
    machine.wb("agent", "stop", ref)


def _edit_record(machine: Machine, ref: str, **changes: object) -> None:
    store = Store(machine.home)
    record = store.load(ref)
    body = record.model_dump(mode="json", exclude_none=True)
    body.update(changes)
    body = {key: value for key, value in body.items() if value is not None}
    store.save(Record.model_validate(body))


def test_continue_is_refused_without_a_session_id_or_for_the_command_harness(machine: Machine) -> None:
    machine.clone()
    ref = machine.dispatch()
    _await(machine, ref)
    _edit_record(machine, ref, session_id=None)
    done = machine.wb("agent", "continue", ref, "--task", "more")
    assert done.returncode == 1 and "recorded no session ID" in done.stderr
    record = Store(machine.home).load(ref)
    resolved = record.resolved.model_dump(mode="json", exclude_none=True) | {"harness": "command"}
    _edit_record(machine, ref, session_id="019a7c1e-5b0c-7d22-9f1a-3c4d5e6f7a8b", resolved=resolved)
    done = machine.wb("agent", "continue", ref, "--task", "more")
    assert done.returncode == 1 and "command harness" in done.stderr
    assert len(list((machine.home / "agents").iterdir())) == 1  # nothing was created


# -- prune ---------------------------------------------------------------------------------


def _old_record(store: Store, state: str, age_s: float) -> str:
    import time
    from datetime import UTC, datetime

    moment = rfc3339(datetime.fromtimestamp(time.time() - age_s, UTC))
    record = sample_record(state=state, started_at=moment, finished_at=moment if state != "running" else None)
    store.create(record, "task")
    return record.agent_id


def test_prune_removes_only_old_finished_records_never_worktrees_or_live_runs(machine: Machine) -> None:
    machine.clone()
    live = machine.dispatch(task="scenario:silent")
    store = Store(machine.home).ensure()
    old = [_old_record(store, "completed", 7200), _old_record(store, "failed", 7200)]
    recent = _old_record(store, "completed", 10)
    dead = _old_record(store, "running", 7200)  # stored running, owner never started: abandoned, no worker
    os.utime(store.run_dir(dead) / "run.json", (0, 1))  # its last write: long ago

    dry = machine.wb("agent", "prune", "--older-than", "1h", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.splitlines()
    assert sorted(line.split()[2] for line in lines[:-1]) == sorted([*old, dead])
    assert lines[-1] == "would remove 3 records"
    assert all(store.exists(ref) for ref in [*old, dead, recent, live])

    done = machine.wb("agent", "prune", "--older-than", "1h")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "removed 3 records"
    assert {line.split()[1] for line in done.stdout.splitlines()[:-1]} == {*old, dead}
    assert not any(store.exists(ref) for ref in [*old, dead])
    assert store.exists(recent) and store.exists(live)
    assert _worktree(machine).is_dir()
    assert "wb/w1" in git(machine.projects / "acme/widget", "branch", "--list", "wb/w1")
    assert machine.wb("agent", "prune", "--older-than", "0s").stdout.splitlines()[-1] == "removed 1 record"
    assert store.exists(live)
    machine.wb("agent", "stop", live)


def test_prune_runs_safely_beside_a_running_list(machine: Machine) -> None:
    """A list that runs while records vanish reports no unreadable record."""
    store = Store(machine.home).ensure()
    for _ in range(300):
        _old_record(store, "completed", 7200)
    failures: list[str] = []
    stop = threading.Event()

    def lister() -> None:
        while not stop.is_set():
            done = machine.wb("agent", "list")
            if done.returncode != 0 or done.stderr:
                failures.append(done.stderr)

    thread = threading.Thread(target=lister)
    thread.start()
    try:
        done = machine.wb("agent", "prune", "--older-than", "1h")
    finally:
        stop.set()
        thread.join()
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "removed 300 records"
    assert failures == []
    assert [entry for entry in (machine.home / "agents").iterdir()] == []


def test_prune_needs_older_than(machine: Machine) -> None:
    done = machine.wb("agent", "prune")
    assert done.returncode == 2 and "--older-than" in done.stderr


def test_prune_never_removes_an_abandoned_run_whose_worker_still_lives(machine: Machine) -> None:
    machine.write_config(machine.config_path.read_text() + UNCONFINED)  # see UNCONFINED
    machine.clone()
    ref = machine.dispatch(task="scenario:silent")
    assert wait_for(lambda: _status(machine, ref).get("worker_alive") is True, 20)
    os.kill(int(_status(machine, ref)["owner_pid"]), signal.SIGKILL)  # type: ignore[call-overload]
    assert wait_for(lambda: _status(machine, ref)["state"] == "abandoned", 20)
    assert _status(machine, ref)["worker_alive"] is True
    done = machine.wb("agent", "prune", "--older-than", "0s")
    assert done.returncode == 0 and done.stdout == "removed 0 records\n"
    assert Store(machine.home).exists(ref)
    assert machine.wb("agent", "stop", ref).returncode == 0
    done = machine.wb("agent", "prune", "--older-than", "0s")
    assert done.stdout.splitlines() == [done.stdout.splitlines()[0], "removed 1 record"]
    assert done.stdout.startswith(f"removed {ref} (failed, finished ")


def test_continue_a_claude_run_resumes_its_session_and_a_command_run_is_refused(machine: Machine) -> None:
    """Claude Code is started with `--resume=<session>` from a copy of its private config dir; `command` cannot."""
    from tests.integration.test_claude_and_command import CONFIG, SCRIPT

    script = machine.root / "agent.sh"
    script.write_text(SCRIPT)
    script.chmod(0o700)
    machine.write_config(CONFIG.format(credential_env=CREDENTIAL_ENV, script=script, worktrees="/srv"))
    machine.clone()
    parent = machine.dispatch("--profile", "sonnet", task="scenario:complete")
    first = _await(machine, parent)
    assert first["state"] == "completed" and first["session_id"], first
    done = machine.wb("agent", "continue", parent, "--task", "scenario:env-dump")
    assert done.returncode == 0, done.stderr
    child = done.stdout.split()[0]
    second = _await(machine, child)
    assert second["state"] == "completed" and second["parent_id"] == parent, second
    argv = json.loads((machine.home / "agents" / child / "harness-home" / "argv.json").read_text())
    assert argv[-1] == f"--resume={first['session_id']}"
    # A continued run keeps every term of its profile, `permissions` among them (as a new run does).
    bypassed = machine.wb("agent", "continue", child, "--profile", "bypass", "--task", "scenario:complete")
    assert bypassed.returncode == 0, bypassed.stderr
    third = _await(machine, bypassed.stdout.split()[0])
    if os.geteuid() == 0:  # Claude Code refuses bypassPermissions as root: wb says so before starting it
        assert third["state"] == "failed" and "permissions: bypass cannot run as root" in third["failure"], third
    else:
        argv = json.loads((machine.home / "agents" / third["agent_id"] / "harness-home" / "argv.json").read_text())
        assert argv[-3:-1] == ["--permission-mode", "bypassPermissions"], argv

    scripted = machine.dispatch("--profile", "script", task="do it", worktree="w2")
    _await(machine, scripted)
    refused = machine.wb("agent", "continue", scripted, "--task", "more")
    assert refused.returncode == 1 and "command harness" in refused.stderr


# -- --json of logs, stop and prune; prune --worktrees (docs/supervisors.md#the-documents) -------------


def test_logs_stop_and_prune_print_their_json_documents(machine: Machine) -> None:
    """Each document is also checked against its published schema (Machine.wb validates every --json)."""
    machine.clone()
    live = machine.dispatch(task="scenario:silent")
    # The scenario's one action, stored, then silence: the two reads below must see the same actions.
    assert wait_for(lambda: bool(machine.wb_json("agent", "logs", live).get("actions")), 20)
    logs = machine.wb_json("agent", "logs", live)
    assert isinstance(logs, dict) and logs["agent_id"] == live and "machine" not in logs
    assert logs["path"] == str(machine.home / "agents" / live / "events.jsonl")
    assert isinstance(logs["actions"], list) and all(not action.startswith(" ") for action in logs["actions"])
    text = machine.wb("agent", "logs", live).stdout.splitlines()
    assert text == [logs["path"], *(f"  {action}" for action in logs["actions"])]

    stopped = machine.wb("agent", "stop", live, "--format", "json")
    assert stopped.returncode == 0, stopped.stderr
    document = json.loads(stopped.stdout)
    assert document == {
        "agent_id": live,
        "message": f"stopping {live} worker process {_status(machine, live)['worker_pid']}",
        "state": "running",
    }
    assert _status(machine, live)["state"] == "failed"

    pruned = machine.wb_json("agent", "prune", "--older-than", "0s", "--dry-run")
    assert isinstance(pruned, dict) and pruned["dry_run"] is True and pruned["kept_live"] == 0
    assert [entry["agent_id"] for entry in pruned["removed"]] == [live] and "worktrees" not in pruned
    fleet = machine.wb_json("agent", "prune", "--older-than", "0s", "--all")
    assert isinstance(fleet, dict) and [row["machine"] for row in fleet["machines"]] == [""]
    row = fleet["machines"][0]
    assert row["ok"] is True and row["error"] is None and [entry["agent_id"] for entry in row["removed"]] == [live]
    assert not Store(machine.home).exists(live)


def test_logs_json_refuses_raw(machine: Machine) -> None:
    done = machine.wb("agent", "logs", "agt-" + "1" * 32, "--raw", "--json")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == "error: --json prints worker actions; it cannot be combined with --raw\n"


def test_logs_json_of_a_run_without_a_transcript_has_no_path(machine: Machine) -> None:
    store = Store(machine.home).ensure()
    ref = _old_record(store, "failed", 10)
    document = machine.wb_json("agent", "logs", ref)
    assert document == {"agent_id": ref, "actions": []}


def test_prune_worktrees_removes_the_pruned_runs_worktrees_and_wb_branches_only(machine: Machine) -> None:
    clone = machine.clone()
    first = machine.dispatch(worktree="w1")
    _await(machine, first)
    done = machine.wb("agent", "continue", first, "--task", "scenario:complete file:again.txt")
    assert done.returncode == 0, done.stderr
    _await(machine, done.stdout.split()[0])  # w1: a run and its continuation, both to prune
    custom = machine.dispatch("--branch", "feature-x", worktree="w3")  # its branch is not wb/w3: kept
    _await(machine, custom)
    shared = machine.dispatch(worktree="w2")
    _await(machine, shared)
    live = machine.wb(  # a live run in w2 keeps w2 although w2's first record goes
        "agent", "dispatch", "--use-worktree", "w2", "--profile", "fake", "--repo", "acme/widget",
        "--task", "scenario:silent",
    )  # fmt: skip
    assert live.returncode == 0, live.stderr
    live_ref = live.stdout.split()[0]
    assert wait_for(lambda: _status(machine, live_ref).get("worker_alive") is True, 20)
    (machine.projects / "mine").mkdir()  # a worktree of the user's own: never wb's to touch
    git(clone, "worktree", "add", "-q", "-b", "wb/mine", str(machine.projects / "mine" / "wt"))

    dry = machine.wb("agent", "prune", "--older-than", "0s", "--dry-run", "--worktrees")
    assert dry.returncode == 0, dry.stderr
    trees = [line for line in dry.stdout.splitlines() if " worktree " in line]
    assert trees == [  # oldest first, as the records; w1 once for its two records
        f"would remove worktree {_worktree(machine, 'w1')} and branch wb/w1",
        f"would remove worktree {_worktree(machine, 'w3')}",
    ], dry.stdout
    assert dry.stdout.splitlines()[-1] == "would remove 4 records and 2 worktrees"
    assert _worktree(machine, "w1").is_dir() and _worktree(machine, "w3").is_dir()

    wet = machine.wb("agent", "prune", "--older-than", "0s", "--worktrees", "--json")
    assert wet.returncode == 0, wet.stderr
    document = json.loads(wet.stdout)
    assert document["kept_live"] == 1 and len(document["removed"]) == 4
    assert sorted((tree["path"], tree["branch"], tree["error"]) for tree in document["worktrees"]) == [
        (str(_worktree(machine, "w1")), "wb/w1", None),
        (str(_worktree(machine, "w3")), None, None),
    ]
    assert not _worktree(machine, "w1").exists() and not _worktree(machine, "w3").exists()
    branches = git(clone, "branch", "--list", "--format=%(refname:short)").split()
    assert "wb/w1" not in branches and "feature-x" in branches and "wb/w2" in branches and "wb/mine" in branches
    assert _worktree(machine, "w2").is_dir() and (machine.projects / "mine" / "wt").is_dir()
    assert str(_worktree(machine, "w1")) not in git(clone, "worktree", "list", "--porcelain")

    # A rerun of the same names now works: the worktree and the branch are gone.
    again = machine.dispatch(worktree="w1")
    assert _await(machine, again)["state"] == "completed"
    machine.wb("agent", "stop", live_ref)


def test_prune_worktrees_names_a_worktree_git_will_not_remove(machine: Machine) -> None:
    """A locked worktree stays; the record goes, and the refusal is a warning with exit 1."""
    clone = machine.clone()
    ref = machine.dispatch(worktree="w1")
    _await(machine, ref)
    git(clone, "worktree", "lock", "--reason", "mine", str(_worktree(machine, "w1")))
    done = machine.wb("agent", "prune", "--older-than", "0s", "--worktrees")
    assert done.returncode == 1
    assert done.stdout.splitlines() == [done.stdout.splitlines()[0], "removed 1 record and 0 worktrees"]
    warning, error = done.stderr.splitlines()
    assert warning.startswith(f"warning: {_worktree(machine, 'w1')}: git worktree remove failed in {clone}: ")
    assert error == "error: not everything could be pruned (named above)"
    assert _worktree(machine, "w1").is_dir() and not Store(machine.home).exists(ref)
    assert "wb/w1" in git(clone, "branch", "--list", "wb/w1")
