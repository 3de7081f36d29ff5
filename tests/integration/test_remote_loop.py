"""The supervisor's loop against another machine over both SSH tiers.

See docs/cli.md#the-supervisors-loop and docs/protocol.md#optional-features.

Covers the wire side: diff with its 2 MiB refusal, follow resumed after the SSH session is
killed mid-call, continue, prune, the `version` reply's capabilities, and the upgrade
message from a real older wb (the previous release, built from this repository's history).
"""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from conftest import REPO_ROOT, courier_on, git, prepare_remote, wait_for

from tests.ssh_tiers import SshMachine, SshMachines


@pytest.fixture(scope="module")
def sshd(ssh_machines: SshMachines) -> SshMachines:
    """This module's machines: each test runs over both SSH tiers (tests/ssh_tiers.py)."""
    return ssh_machines


# The release before the supervisor's loop: it knows none of diff, continue, prune or follow.
PREVIOUS_RELEASE = "ea50d25"


@dataclass
class Caller:
    env: dict[str, str]

    def wb(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "courier.main", *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def wb_bytes(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [sys.executable, "-m", "courier.main", *args],
            capture_output=True,
            env=self.env,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )

    def dispatch(self, task: str, worktree: str, machine: str = "box") -> str:
        done = self.wb(
            "agent", "dispatch", "--to", machine, "--new-worktree", worktree, "--profile", "fake",
            "--repo", "acme/widget", "--task", task,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout.split()[0]

    def await_(self, ref: str) -> dict[str, object]:
        done = self.wb("agent", "await", ref, "--json", "--wait-timeout", "90s")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)  # type: ignore[no-any-return]


def _previous_release(root: Path) -> Path:
    """The previous release's source tree, exported from git history (not a stub)."""
    tree = root / f"wb-{PREVIOUS_RELEASE}"
    tree.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "archive", PREVIOUS_RELEASE], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


@pytest.fixture(scope="module")
def box(sshd: SshMachines) -> SshMachine:
    server = sshd.start("127.0.0.2")
    prepare_remote(server)
    return server


@pytest.fixture(scope="module")
def caller(sshd: SshMachines, box: SshMachine, tmp_path_factory: pytest.TempPathFactory) -> Caller:
    home = tmp_path_factory.mktemp("caller")
    old_tree = _previous_release(home)
    old_wb = box.script("wb-previous", f'PYTHONPATH={old_tree} exec {sys.executable} -P -m courier.main "$@"\n')
    config = sshd.write_wb_config("caller", {"box": sshd.target(box), "old": sshd.target(box, wb_path=str(old_wb))})
    env = {
        "HOME": str(home),
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "WB_CONFIG": str(config),
        "WB_HOME": str(home / "wbhome"),
        "WB_PROJECTS_ROOT": str(home / "projects"),
        "WB_SSH_CONFIG": str(sshd.client_config),
        "LANG": "C.UTF-8",
    }
    return Caller(env)


def _worktree(box: SshMachine, name: str) -> Path:
    return box.projects_root / ".wb-worktrees/acme/widget" / name


def _fingerprint(worktree: Path) -> tuple[str, str]:
    status = git(worktree, "status", "--porcelain=v1", "-z", "--untracked-files=all")
    index = git(worktree, "rev-parse", "--git-path", "index").strip()
    return status, hashlib.sha256((worktree / index).read_bytes()).hexdigest()


def test_remote_diff_is_the_same_patch_and_touches_nothing_there(caller: Caller, box: SshMachine) -> None:
    ref = caller.dispatch("scenario:complete", "d1")
    caller.await_(ref)
    worktree = _worktree(box, "d1")
    (worktree / "icon.bin").write_bytes(bytes(range(256)))
    (worktree / "latin1.txt").write_bytes(b"caf\xe9 cr\xe8me\n")  # not UTF-8: carried byte for byte
    before = _fingerprint(worktree)
    remote = caller.wb_bytes("agent", "diff", ref)
    assert remote.returncode == 0, remote.stderr
    assert _fingerprint(worktree) == before
    assert b"new file mode 100644" in remote.stdout and b"GIT binary patch" in remote.stdout
    assert b"+caf\xe9 cr\xe8me\n" in remote.stdout
    check = subprocess.run(["git", "apply", "--check", "-R", "-"], cwd=worktree, input=remote.stdout)
    assert check.returncode == 0  # the patch is exactly the worktree's change: it reverses cleanly there

    document = json.loads(caller.wb("agent", "diff", ref, "--json").stdout)
    assert document["machine"] == "box" and document["agent_id"] == ref.split(":", 1)[1]
    assert sorted(change["path"] for change in document["files"]) == ["hello.txt", "icon.bin", "latin1.txt"]
    assert document["patch"].encode("utf-8", "surrogateescape") == remote.stdout  # \udcXX escapes in JSON
    stat = caller.wb("agent", "diff", ref, "--stat")
    assert stat.stdout.splitlines()[-1] == "3 files changed, +2 -0"


def test_a_remote_patch_over_2_mib_is_refused_not_cut(caller: Caller, box: SshMachine) -> None:
    ref = caller.dispatch("scenario:complete", "d2")
    caller.await_(ref)
    (_worktree(box, "d2") / "big.txt").write_text(("y" * 99 + "\n") * 30_000)  # 3 MB of added lines
    run_id = ref.split(":", 1)[1]
    done = caller.wb("agent", "diff", ref)
    assert done.returncode == 1 and done.stdout == ""
    assert f"box: patch for {run_id} is " in done.stderr
    assert f"bytes; use --stat, or fetch it on that machine with wb agent diff {run_id}" in done.stderr
    stat = caller.wb("agent", "diff", ref, "--stat")
    assert stat.returncode == 0 and "+30000 -0 big.txt" in stat.stdout


def _rest_of(process: subprocess.Popen[str]) -> tuple[str, str]:
    """The rest of stdout through the same buffered reader that readline used (communicate would skip its buffer)."""
    assert process.stdout is not None and process.stderr is not None
    with process.stdout, process.stderr:
        rest = process.stdout.read()
        stderr = process.stderr.read()
    process.wait(timeout=90)
    return rest, stderr


def _receivers(box: SshMachine) -> list[psutil.Process]:
    found = []
    for process in box.session_processes():
        try:
            # A one-call receiver, or (warm, docs/courier.md) the serve process carrying the call.
            if {"--wb-internal-agent-remote", "--wb-internal-agent-serve"} & set(process.cmdline()):
                found.append(process)
        except psutil.Error:
            continue
    return found


def test_follow_resumes_after_the_ssh_session_dies_without_repeating_or_losing_an_action(
    caller: Caller, box: SshMachine
) -> None:
    ref = caller.dispatch("scenario:steps steps:10 every:1", "f1")
    follower = subprocess.Popen(
        [sys.executable, "-m", "courier.main", "agent", "logs", ref, "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=caller.env,
    )
    assert follower.stdout is not None
    seen: list[str] = []
    while len([line for line in seen if "ran:" in line]) < 2:
        seen.append(follower.stdout.readline())
    # Kill the receiver serving the follow call that is waiting now: the SSH session dies with it.
    assert wait_for(lambda: bool(_receivers(box)), 10)
    for process in _receivers(box):
        process.send_signal(signal.SIGKILL)
    rest, stderr = _rest_of(follower)
    assert follower.returncode == 0, stderr
    if not courier_on():  # warm, the courier re-sends the lost call on a new session itself (docs/courier.md)
        assert "following again from byte" in stderr
    lines = [line.rstrip("\n") for line in seen] + rest.splitlines()
    ran = [line for line in lines if line.startswith("  ran:")]
    assert ran == [f"  ran: /bin/bash -lc 'echo step {n}'" for n in range(1, 11)]
    assert lines[-1] == f"{ref} completed"


def test_remote_continue_resumes_the_session_there(caller: Caller, box: SshMachine) -> None:
    parent = caller.dispatch("scenario:complete", "c1")
    first = caller.await_(parent)
    done = caller.wb("agent", "continue", parent, "--task", "scenario:complete file:again.txt")
    assert done.returncode == 0, done.stderr
    child = done.stdout.split()[0]
    assert child.startswith("box:agt-") and child != parent
    second = caller.await_(child)
    assert second["state"] == "completed" and second["parent_id"] == parent.split(":", 1)[1]
    assert second["result"] == f"resumed {first['session_id']} after 1 earlier turn(s); created again.txt."
    assert (_worktree(box, "c1") / "again.txt").exists()


def test_remote_prune_removes_records_there_only(caller: Caller, box: SshMachine) -> None:
    ref = caller.dispatch("scenario:complete", "p1")
    caller.await_(ref)
    run_id = ref.split(":", 1)[1]
    dry = caller.wb("agent", "prune", "--older-than", "0s", "--dry-run", "--to", "box")
    assert dry.returncode == 0, dry.stderr
    assert any(line.startswith(f"would remove {ref} (completed, finished ") for line in dry.stdout.splitlines())
    assert (box.wb_home / "agents" / run_id).is_dir()
    done = caller.wb("agent", "prune", "--older-than", "0s", "--all")
    assert done.returncode == 1  # the older wb on "old" cannot prune: named on stderr, the rest done
    assert f"removed {ref} (completed, finished " in done.stdout
    assert "warning: machine old runs an older wb, which does not support prune; upgrade wb there" in done.stderr
    assert not (box.wb_home / "agents" / run_id).exists()
    assert _worktree(box, "p1").is_dir()


def test_remote_logs_stop_and_prune_json_and_prune_worktrees_there(caller: Caller, box: SshMachine) -> None:
    """docs/supervisors.md#the-documents over SSH: the three documents (schema-checked) and --worktrees."""
    from tests import json_documents

    done_ref = caller.dispatch("scenario:complete", "j1")
    caller.await_(done_ref)
    live = caller.dispatch("scenario:silent", "j2")
    assert wait_for(lambda: json.loads(caller.wb("agent", "status", live, "--json").stdout)["worker_alive"], 30)
    logs = caller.wb("agent", "logs", done_ref, "--json")
    assert logs.returncode == 0, logs.stderr
    document = json.loads(logs.stdout)
    json_documents.check("actions", document)
    assert document["machine"] == "box" and document["agent_id"] == done_ref.split(":", 1)[1]
    assert document["path"] == str(box.wb_home / "agents" / document["agent_id"] / "events.jsonl")
    assert "changed 1 file" in document["actions"]

    stopped = caller.wb("agent", "stop", live, "--json")
    assert stopped.returncode == 0, stopped.stderr
    document = json.loads(stopped.stdout)
    json_documents.check("stopped", document)
    assert document["machine"] == "box" and document["message"].startswith(f"stopping {live} worker process ")
    assert wait_for(lambda: json.loads(caller.wb("agent", "status", live, "--json").stdout)["terminal"], 30)

    refused = caller.wb("agent", "prune", "--older-than", "0s", "--worktrees", "--to", "old")
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.startswith("error: machine old runs ") and refused.stderr.endswith(
        ", which does not support prune --worktrees; upgrade wb there\n"
    )
    assert (box.wb_home / "agents" / document["agent_id"]).is_dir()  # nothing was pruned there

    pruned = caller.wb("agent", "prune", "--older-than", "0s", "--worktrees", "--to", "box", "--json")
    assert pruned.returncode == 0, pruned.stderr
    document = json.loads(pruned.stdout)
    json_documents.check("prune", document)
    assert document["machine"] == "box"
    assert {done_ref.split(":", 1)[1], live.split(":", 1)[1]} <= {entry["agent_id"] for entry in document["removed"]}
    trees = {tree["path"]: tree["branch"] for tree in document["worktrees"]}
    assert trees[str(_worktree(box, "j1"))] == "wb/j1" and trees[str(_worktree(box, "j2"))] == "wb/j2"
    assert not _worktree(box, "j1").exists() and not _worktree(box, "j2").exists()
    branches = git(box.projects_root / "acme/widget", "branch", "--list", "--format=%(refname:short)").split()
    assert "wb/j1" not in branches and "wb/j2" not in branches
    # The same names can be dispatched again there.
    assert caller.await_(caller.dispatch("scenario:complete", "j1"))["state"] == "completed"


def test_the_version_reply_lists_the_capabilities() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "courier.main", "--wb-internal-agent-remote"],
        input=b'{"schema_version":1,"operation":"version"}',
        capture_output=True,
        timeout=60,
    )
    reply = json.loads(done.stdout)
    assert {"diff", "follow", "continue", "prune"} <= set(reply["capabilities"])


@pytest.mark.parametrize(
    ("args", "feature"),
    [
        (("agent", "diff", "old:agt-" + "1" * 32), "diff"),
        (("agent", "diff", "old:agt-" + "1" * 32, "--stat"), "diff"),
        (("agent", "continue", "old:agt-" + "1" * 32, "--task", "more"), "continue"),
        (("agent", "prune", "--older-than", "1h", "--to", "old"), "prune"),
    ],
)
def test_an_older_wb_refuses_each_new_operation_with_the_upgrade_message(
    caller: Caller, box: SshMachine, args: tuple[str, ...], feature: str
) -> None:
    """The previous release, really running on the machine, refuses; the caller names the fix, exit 2."""
    done = caller.wb(*args)
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"error: machine old runs an older wb, which does not support {feature}; upgrade wb there\n"
    assert done.stdout == ""


def test_an_older_wb_that_answers_logs_without_following_gets_the_upgrade_message(
    caller: Caller, box: SshMachine
) -> None:
    """The older wb ignores `follow` and answers a plain `logs`: the caller notices at once, no retry loop."""
    run_id = caller.dispatch("scenario:complete", "o1").split(":", 1)[1]
    done = caller.wb("agent", "logs", f"old:{run_id}", "--follow", timeout=60)
    assert done.returncode == 2
    expected = "error: machine old runs an older wb, which does not support logs --follow; upgrade wb there\n"
    assert done.stderr == expected
    assert done.stdout == ""


def test_the_older_wb_is_really_the_previous_release(caller: Caller, box: SshMachine) -> None:
    """Its version reply has no capabilities: the upgrade tests above talk to old code, not this checkout."""
    old = caller.wb("machines", "--check", "--json")
    rows = {row["machine"]: row for row in json.loads(old.stdout)}
    assert rows["old"]["ok"] is True
    script = (box.bin_dir / "wb-previous").read_text()
    tree = Path(script.split("PYTHONPATH=", 1)[1].split()[0])
    assert "diff" not in (tree / "protocol/models.py").read_text().split("OPERATIONS =", 1)[1].split("\n", 1)[0]
    reply = subprocess.run(
        [str(box.bin_dir / "wb-previous"), "--wb-internal-agent-remote"],
        input=b'{"schema_version":1,"operation":"version"}',
        capture_output=True,
        timeout=60,
    )
    assert "capabilities" not in json.loads(reply.stdout)
