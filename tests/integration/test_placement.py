"""`dispatch --to auto[:LABEL]` (docs/cli.md#placement-across-a-fleet): slots, labels, the
candidates' reasons, and the receiver's in-band `max_running` refusal under concurrency.

Every "machine" is a real local exec target (`env WB_HOME=… WB_PROJECTS_ROOT=… wb`, as
tests/integration/test_exec_channel.py builds them): its own home, projects root, wb.yaml
and a PATH that holds only the harnesses the test gives it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import CONFIG_TEMPLATE, CREDENTIAL_ENV, FAKES, Machine, _kill_leftovers, make_clone, make_machine

from protocol.refs import new_run_id

WB = str(Path(sys.executable).parent / "wb")
PYTHON_BIN = str(Path(sys.executable).parent)
SLOW_TASK = "scenario:slow sleep:120"  # stays running for the whole test; killed at its end
CLAUDE_PROFILE = """\
    claude-fake:
      harness: claude
      provider: anthropic
      model: claude-sonnet-4-5
"""


def _remote(root: Path, *, harnesses: tuple[str, ...] = ("codex",), clone: bool = True) -> list[str]:
    """A machine under `root` reached by `env … wb`: the argv of its exec target."""
    root.mkdir(parents=True)
    bin_dir = root / "bin"
    bin_dir.mkdir()
    for tool in ("git", "sh", "env", "setsid", "sleep"):  # not /usr/bin: the real agent CLIs live there
        (bin_dir / tool).symlink_to(f"/usr/bin/{tool}")
    for harness in harnesses:
        (bin_dir / harness).symlink_to(FAKES / harness)
    if clone:
        make_clone(root / "projects" / "acme" / "widget")
    config = root / "wb.yaml"
    config.write_text(CONFIG_TEMPLATE.format(credential_env=CREDENTIAL_ENV) + CLAUDE_PROFILE)
    config.chmod(0o600)
    return [
        "env",
        f"WB_HOME={root / 'wbhome'}",
        f"WB_PROJECTS_ROOT={root / 'projects'}",
        f"WB_CONFIG={config}",
        f"PATH={bin_dir}:{PYTHON_BIN}",
    ]


@pytest.fixture
def fleet(tmp_path: Path) -> Any:
    """A caller and a factory of its configured machines: `fleet(targets)` writes its wb.yaml."""
    caller = make_machine(tmp_path / "caller")

    def configure(targets: dict[str, dict[str, Any]], *, extra_profiles: str = "") -> Machine:
        text = CONFIG_TEMPLATE.format(credential_env=CREDENTIAL_ENV) + extra_profiles
        document = yaml.safe_load(text)
        document["session_move"] = {"targets": targets}
        caller.write_config(yaml.safe_dump(document, sort_keys=False))
        return caller

    configure.root = tmp_path  # type: ignore[attr-defined]
    yield configure
    _kill_leftovers(tmp_path)


def _exec(argv: list[str], **placement: Any) -> dict[str, Any]:
    """A target reached by `argv`; `slots` and `labels` sit on the target, beside its `exec` block."""
    return {**placement, "exec": {"argv": argv, "wb_path": WB}}


def _auto(caller: Machine, worktree: str, *args: str, to: str = "auto") -> subprocess.CompletedProcess[str]:
    return caller.wb(
        "agent", "dispatch", "--to", to, "--new-worktree", worktree, "--profile", "fake",
        "--repo", "acme/widget", "--task", SLOW_TASK, *args,
    )  # fmt: skip


def _machine_of(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr
    ref = done.stdout.split()[0]
    machine, _, run_id = ref.partition(":")
    assert run_id.startswith("agt-"), done.stdout
    return machine


def test_three_concurrent_auto_dispatches_onto_two_one_slot_machines(fleet: Any) -> None:
    root = fleet.root
    caller = fleet({"gpu-box": _exec(_remote(root / "gpu"), slots=1), "build-1": _exec(_remote(root / "b1"), slots=1)})
    with ThreadPoolExecutor(3) as pool:
        outcomes = list(pool.map(lambda name: _auto(caller, name), ["w1", "w2", "w3"]))
    placed = [done for done in outcomes if done.returncode == 0]
    refused = [done for done in outcomes if done.returncode != 0]
    assert sorted(_machine_of(done) for done in placed) == ["build-1", "gpu-box"], [o.stderr for o in outcomes]
    assert len(refused) == 1
    message = refused[0].stderr
    assert refused[0].returncode == 1, message
    assert message.startswith("error: no machine can take this run now: "), message
    assert "gpu-box: 1 of 1 slots busy" in message and "build-1: 1 of 1 slots busy" in message, message
    assert "Traceback" not in message
    # The printed reference names the machine, and the run is there.
    ref = placed[0].stdout.split()[0]
    status = caller.wb("agent", "status", ref)
    assert status.returncode == 0 and "running" in status.stdout, status.stderr


def test_most_free_slots_wins_then_fewest_running_then_config_order(fleet: Any) -> None:
    root = fleet.root
    one, two, three = _remote(root / "one"), _remote(root / "two"), _remote(root / "three")
    caller = fleet({"one": _exec(one, slots=2), "two": _exec(two, slots=3), "three": _exec(three, slots=3)})
    assert _machine_of(_auto(caller, "w1")) == "two"  # 3 free beats 2; two before three in the file
    assert _machine_of(_auto(caller, "w2")) == "three"  # now three has the most free
    # one: 2 free, 0 running; two and three: 2 free, 1 running each: the fewest running wins the tie.
    assert _machine_of(_auto(caller, "w3")) == "one"
    # Unlimited slots beat any bound.
    caller = fleet({"one": _exec(one, slots=2), "open": _exec(_remote(root / "open"))})
    assert _machine_of(_auto(caller, "w4")) == "open"


def test_labels_choose_the_candidates(fleet: Any) -> None:
    root = fleet.root
    caller = fleet(
        {
            "plain": _exec(_remote(root / "plain"), slots=5),
            "gpu-box": _exec(_remote(root / "gpu"), slots=1, labels=["gpu", "big"]),
        }
    )
    assert _machine_of(_auto(caller, "w1", to="auto:gpu")) == "gpu-box"
    done = _auto(caller, "w2", to="auto:gpu")
    assert done.returncode == 1, done.stderr
    assert done.stderr == "error: no machine can take this run now: gpu-box: 1 of 1 slots busy\n"
    assert _machine_of(_auto(caller, "w3", to="auto")) == "plain"
    done = _auto(caller, "w4", to="auto:tpu")
    assert done.returncode == 2
    assert done.stderr.startswith("error: --to auto:tpu: no machine has label tpu"), done.stderr
    done = _auto(caller, "w5", to="auto:No Such")
    assert done.returncode == 2 and done.stderr.startswith("error: --to auto:No Such: expected auto or auto:LABEL")


def test_harness_and_repository_filters_say_why(fleet: Any) -> None:
    root = fleet.root
    caller = fleet(
        {
            "codex-only": _exec(_remote(root / "codex-only", harnesses=("codex",))),
            "no-clone": _exec(_remote(root / "no-clone", harnesses=("claude",), clone=False)),
            "fits": _exec(_remote(root / "fits", harnesses=("claude",)), slots=1),
        },
        extra_profiles=CLAUDE_PROFILE,
    )

    def claude(worktree: str) -> subprocess.CompletedProcess[str]:
        return caller.wb(
            "agent", "dispatch", "--to", "auto", "--new-worktree", worktree, "--profile", "claude-fake",
            "--repo", "acme/widget", "--task", SLOW_TASK, env={"ANTHROPIC_API_KEY": "sk-ant-test-placement-0001"},
        )  # fmt: skip

    assert _machine_of(claude("w1")) == "fits"
    done = claude("w2")
    assert done.returncode == 1, done.stderr
    assert done.stderr == (
        "error: no machine can take this run now: codex-only: no harness claude; "
        "no-clone: no clone of acme/widget; fits: 1 of 1 slots busy\n"
    )


def test_an_unreachable_candidate_is_given_up_within_the_machine_timeout(fleet: Any) -> None:
    root = fleet.root
    silent = ["sh", "-c", "exec sleep 600", str(root)]  # $0 names the test's directory, so it is cleaned up
    caller = fleet({"silent": {"exec": {"argv": silent}}, "ok": _exec(_remote(root / "ok"), slots=1)})
    began = time.monotonic()
    # 10 s: room for a loaded machine to start `ok`'s wb; far below the silent one's 600 s.
    assert _machine_of(_auto(caller, "w1", "--machine-timeout", "10s")) == "ok"
    done = _auto(caller, "w2", "--machine-timeout", "10s")
    elapsed = time.monotonic() - began
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("error: no machine can take this run now: silent: unreachable ("), done.stderr
    assert "did not answer the version request within" in done.stderr, done.stderr
    assert done.stderr.endswith("; ok: 1 of 1 slots busy\n"), done.stderr
    assert elapsed < 120, elapsed  # two commands, each bounded by its 10 s of probing


def test_a_direct_to_ignores_slots(fleet: Any) -> None:
    root = fleet.root
    caller = fleet({"box": _exec(_remote(root / "box"), slots=1)})
    assert _machine_of(_auto(caller, "w1")) == "box"
    for worktree in ("w2", "w3"):
        assert _machine_of(_auto(caller, worktree, to="box")) == "box"
    listed = caller.wb("agent", "list", "--to", "box")
    assert listed.returncode == 0 and listed.stdout.count("running") == 3, listed.stdout


def test_two_concurrent_max_running_1_requests_start_exactly_one_run(tmp_path: Path) -> None:
    """The receiver's own check, two real receivers at once, two repositories (two clone locks)."""
    box = make_machine(tmp_path / "box")
    box.clone("acme/widget")
    box.clone("acme/gadget")

    def receive(repository: str) -> dict[str, Any]:
        request = {
            "schema_version": 1, "operation": "dispatch", "mode": "new", "worktree": "w", "profile": "fake",
            "task": SLOW_TASK, "repository": repository, "timeout_ms": 600_000, "agent_id": new_run_id(),
            "max_running": 1,
        }  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "courier.main", "--wb-internal-agent-remote"],
            input=json.dumps(request), capture_output=True, text=True, env=box.env, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)  # type: ignore[no-any-return]

    try:
        with ThreadPoolExecutor(2) as pool:
            replies = list(pool.map(receive, ["acme/widget", "acme/gadget"]))
        started = [reply for reply in replies if not reply.get("failure")]
        refused = [reply for reply in replies if reply.get("failure")]
        assert len(started) == 1 and len(refused) == 1, replies
        assert started[0]["result"]["state"] == "running"
        assert refused[0]["failure"] == "1 of 1 slots busy" and refused[0]["failure_kind"] == "failed", refused
        runs = [entry for entry in os.listdir(box.home / "agents") if entry.startswith("agt-")]
        assert len(runs) == 1, runs
        # Without a bound, the same machine takes another.
        version = {"schema_version": 1, "operation": "version", "placement": True, "repository": "acme/widget"}
        done = subprocess.run(
            [sys.executable, "-m", "courier.main", "--wb-internal-agent-remote"],
            input=json.dumps(version), capture_output=True, text=True, env=box.env, timeout=120,
        )  # fmt: skip
        reply = json.loads(done.stdout)
        assert "placement" in reply["capabilities"]
        assert reply["placement"] == {"running": 1, "has_repository": True}
    finally:
        _kill_leftovers(tmp_path)


@pytest.mark.parametrize(
    ("placement", "message"),
    [
        ({"slots": 0}, "session_move.targets.box.slots: slots must be a whole number from 1 to 10000"),
        ({"slots": "2"}, "session_move.targets.box.slots: must be a whole number (not quoted)"),
        ({"labels": "gpu"}, "session_move.targets.box.labels: must be a list of strings"),
        ({"labels": ["GPU"]}, 'session_move.targets.box.labels: label "GPU" must be 1-32 lowercase letters'),
    ],
)
def test_bad_slots_and_labels_are_refused_naming_the_key(fleet: Any, placement: dict[str, Any], message: str) -> None:
    caller = fleet({"box": _exec(["env"], **placement), "other": _exec(_remote(fleet.root / "other"))})
    done = _auto(caller, "w1", to="box")
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and done.stderr.startswith("error: "), done.stderr
    # Only that machine is unusable.
    assert _machine_of(_auto(caller, "w2", to="other")) == "other"


def test_slots_and_labels_inside_the_channel_block_are_an_error_naming_the_target(fleet: Any) -> None:
    """They belong on the target (docs/config.md#targets); inside `exec`/`ssh` they were once silently
    ignored, so `--to auto` overfilled the machine: now that machine is unusable, saying where they go."""
    root = fleet.root
    inside = {"exec": {"argv": _remote(root / "box"), "wb_path": WB, "slots": 1, "labels": ["gpu"]}}
    caller = fleet({"box": inside, "other": _exec(_remote(root / "other"), slots=1, labels=["gpu"])})
    done = caller.wb("agent", "list", "--to", "box")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
    assert "session_move.targets.box.exec.slots: slots belongs on the target (session_move.targets.box.slots)" in (
        done.stderr
    )
    assert "session_move.targets.box.exec.labels: labels belongs on the target (session_move.targets.box.labels)" in (
        done.stderr
    )
    # The target's own label is read: auto:gpu finds `other` (and `box`, unusable, is not a candidate).
    assert _machine_of(_auto(caller, "w1", to="auto:gpu")) == "other"
    ssh = fleet({"gpu-box": {"ssh": {"host": "gpu-box.lan", "slots": 2}}})
    done = ssh.wb("machines")
    wanted = "session_move.targets.gpu-box.ssh.slots: slots belongs on the target (session_move.targets.gpu-box.slots)"
    assert wanted in done.stdout + done.stderr, done


def test_a_machine_named_auto_is_refused(fleet: Any) -> None:
    caller = fleet({"auto": _exec(["env"]), "other": _exec(_remote(fleet.root / "other"))})
    done = caller.wb("agent", "list", "--to", "auto")
    assert done.returncode == 2, done.stderr
    assert 'session_move.targets.auto: "auto" is reserved for --to auto' in done.stderr, done.stderr
    done = _auto(caller, "w1")  # the reserved entry is one candidate's reason, the other is chosen
    assert _machine_of(done) == "other"


def test_mcp_dispatch_to_auto(fleet: Any) -> None:
    from test_mcp_server import call_error, call_ok, run_session

    root = fleet.root
    caller = fleet({"gpu-box": _exec(_remote(root / "gpu"), slots=1, labels=["gpu"])})
    arguments = {"task": SLOW_TASK, "profile": "fake", "repo": "acme/widget", "to": "auto:gpu"}

    async def body(session: Any) -> None:
        first = await call_ok(session, "dispatch", {**arguments, "new_worktree": "w1"}, "result")
        assert first["machine"] == "gpu-box" and first["state"] == "running"
        refused = await call_error(session, "dispatch", {**arguments, "new_worktree": "w2", "to": "auto"})
        assert refused["message"] == "no machine can take this run now: gpu-box: 1 of 1 slots busy", refused
        assert refused["exit_code"] == 1

    run_session(caller.env, caller.root, body)


OLD_VERSION_REPLY = '{"schema_version":1,"operation":"version","wb_version":"0.9.0","capabilities":["harness:codex"]}'
OLD_PEER = f"""#!/bin/sh
# An older wb: answers version without `placement` (and without serve, so one process per call).
cat >/dev/null
printf '%s\\n' '{OLD_VERSION_REPLY}'
"""


def test_an_older_peer_is_never_chosen_and_says_upgrade(fleet: Any) -> None:
    root = fleet.root
    old_wb = root / "old-wb"
    old_wb.write_text(OLD_PEER)
    old_wb.chmod(0o755)
    caller = fleet(
        {"old": {"exec": {"argv": ["env"], "wb_path": str(old_wb)}}, "new": _exec(_remote(root / "new"), slots=1)}
    )
    assert _machine_of(_auto(caller, "w1")) == "new"
    done = _auto(caller, "w2")
    assert done.returncode == 1, done.stderr
    assert done.stderr == (
        "error: no machine can take this run now: old: machine old runs wb 0.9.0, which does not support "
        "--to auto (placement); upgrade wb there; new: 1 of 1 slots busy\n"
    )


def _dispatch_auto(caller: Machine, worktree: str, task: str, *args: str) -> subprocess.CompletedProcess[str]:
    return caller.wb(
        "agent", "dispatch", "--to", "auto", "--new-worktree", worktree, "--profile", "fake",
        "--repo", "acme/widget", "--task", task, *args,
    )  # fmt: skip


def test_wait_for_slot_places_the_run_once_a_candidates_run_finishes_and_gives_up_past_its_bound(fleet: Any) -> None:
    caller = fleet({"one": _exec(_remote(fleet.root / "one"), slots=1)})
    short = _dispatch_auto(caller, "w1", "scenario:slow sleep:4")
    assert _machine_of(short) == "one"
    began = time.monotonic()
    waited = _dispatch_auto(caller, "w2", SLOW_TASK, "--wait-for-slot", "60s")
    assert _machine_of(waited) == "one" and time.monotonic() - began >= 1.0  # it waited for the slot
    first = json.loads(caller.wb("agent", "status", short.stdout.split()[0], "--json").stdout)
    assert first["state"] == "completed"  # placed once the first run had finished, not beside it

    began = time.monotonic()
    refused = _dispatch_auto(caller, "w3", SLOW_TASK, "--wait-for-slot", "2s")
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.startswith("error: no machine can take this run now: one: 1 of 1 slots busy"), refused.stderr
    assert 2.0 <= time.monotonic() - began < 30


def test_wait_for_slot_is_for_to_auto_and_a_duration_above_0(fleet: Any) -> None:
    caller = fleet({"one": _exec(_remote(fleet.root / "one"), slots=1)})
    cases = ((("--wait-for-slot", "1m"), "give --to auto"), (("--to", "auto", "--wait-for-slot", "0"), "more than 0"))
    for args, needle in cases:
        done = caller.wb("agent", "dispatch", "--new-worktree", "w1", "--profile", "fake", "--repo", "acme/widget",
                         "--task", "x", *args)  # fmt: skip
        assert done.returncode == 2 and needle in done.stderr and done.stdout == "", done.stderr
