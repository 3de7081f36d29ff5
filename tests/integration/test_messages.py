"""Exact messages and output of docs/cli.md#conventions-shared-by-every-command; docs/cli.md#machine-selection;
docs/protocol.md#the-receivers-rules; docs/runs.md#dispatch, through the real CLI and receiver."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from conftest import Machine, git

from courier import __version__


def test_dispatch_prints_the_worktree_name_as_its_location(machine: Machine) -> None:
    machine.clone()
    done = machine.wb(
        "agent", "dispatch", "--new-worktree", "fix-login", "--profile", "fake", "--repo", "acme/widget",
        "--task", "scenario:complete",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    ref = done.stdout.split()[0]
    assert done.stdout == f"{ref} running fix-login (mock/gpt-5.5)\n"


def test_use_worktree_with_a_missing_name_lists_the_names_that_exist(machine: Machine) -> None:
    clone = machine.clone()
    other = machine.clone("acme/other")
    worktrees = machine.projects / ".wb-worktrees" / "acme" / "widget"
    for index in range(23):
        git(clone, "worktree", "add", "-q", "-b", f"wb/w{index:02}", str(worktrees / f"w{index:02}"))
    git(clone, "worktree", "add", "-q", "-b", "elsewhere", str(machine.root / "not-a-wb-worktree"))
    git(other, "worktree", "add", "-q", "-b", "wb/solo", str(machine.projects / ".wb-worktrees/acme/other/solo"))
    done = machine.wb(
        "agent", "dispatch", "--use-worktree", "ghost", "--repo", "acme/widget", "--profile", "fake", "--task", "x"
    )
    assert done.returncode == 1 and done.stdout == ""
    names = ", ".join(f"w{index:02}" for index in range(20))
    assert f"existing: {names}, … and 3 more; create it with --new-worktree ghost\n" in done.stderr, done.stderr
    alone = machine.wb(
        "agent", "dispatch", "--use-worktree", "ghost", "--repo", "acme/other", "--profile", "fake", "--task", "x"
    )
    assert alone.returncode == 1 and "existing: solo; create it with --new-worktree ghost" in alone.stderr
    anywhere = machine.wb("agent", "dispatch", "--use-worktree", "ghost", "--profile", "fake", "--task", "x")
    assert anywhere.returncode == 1
    assert "existing: acme/other/solo, acme/widget/w00, acme/widget/w01," in anywhere.stderr, anywhere.stderr
    assert not (machine.home / "agents").exists() or not any((machine.home / "agents").iterdir())


def test_a_target_without_an_ssh_block_is_skipped_silently(machine: Machine) -> None:
    config = machine.config_path.read_text()
    machine.write_config(config + "session_move:\n  targets:\n    wb-docker:\n      docker: {image: x}\n")
    listed = machine.wb("agent", "list", "--all", "--json")
    assert listed.returncode == 0 and listed.stderr == ""
    assert [row["machine"] for row in json.loads(listed.stdout)["machines"]] == [""]
    machines = machine.wb("machines")
    assert machines.returncode == 0 and machines.stderr == ""
    assert "wb-docker" not in machines.stdout
    checked = machine.wb("machines", "--check", "--json")
    assert checked.returncode == 0 and json.loads(checked.stdout) == []
    addressed = machine.wb("agent", "list", "--to", "wb-docker")
    assert addressed.returncode == 2 and addressed.stdout == ""
    assert 'unknown machine "wb-docker": configured machines: none' in addressed.stderr


def _receive(machine: Machine, request: bytes) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "courier.main", "--wb-internal-agent-remote"],
        input=request, capture_output=True, env=machine.env, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    return document


def test_every_reply_carries_wb_version(machine: Machine, tmp_path: Path) -> None:
    """docs/protocol.md#the-receivers-rules: `wb_version`, `now` and `home_id` are on every reply, refusals included."""
    unknown = {"schema_version": 1, "operation": "status", "agent_id": "agt-" + "0" * 32}
    replies = {
        "malformed": _receive(machine, b"not json"),
        "invalid": _receive(machine, b'{"schema_version":1,"operation":"status","agent_id":"../x"}'),
        "not found": _receive(machine, json.dumps(unknown).encode()),
        "list": _receive(machine, b'{"schema_version":1,"operation":"list"}'),
        "version": _receive(machine, b'{"schema_version":1,"operation":"version"}'),
    }
    for name, reply in replies.items():
        assert reply.get("wb_version") == __version__, (name, reply)
        assert reply.get("now"), (name, reply)
    assert replies["not found"]["failure_kind"] == "not_found"
    assert replies["list"]["results"] == []
