"""A CLI installed on a machine after the courier's serve session started is found by the next dispatch.

The serve process keeps the environment it started with; a dispatch (and continue, and
version) travels as a one-call session instead, which starts with the environment the
machine gives a new login now (docs/courier.md, "Environment"). The machine here changes
its PATH the way a shell profile does (BASH_ENV, read by every new `bash -c`), after the
serve session started. With `courier.dispatch_over_serve: true` a dispatch takes the serve
session, and its run has the environment that session started with.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from conftest import FAKES, prepare_remote, wait_for

from tests.integration.sshd import SshdFactory, SshdServer, sshd_unavailable_reason

pytestmark = [
    pytest.mark.courier_independent,  # it sets WB_COURIER=on itself: one courier pass runs it (tests/conftest.py)
    pytest.mark.skipif(sshd_unavailable_reason() is not None, reason=str(sshd_unavailable_reason())),
]


@dataclass
class Box:
    server: SshdServer
    profile: Path  # what every new `bash -c` there reads (BASH_ENV)
    wb: Callable[..., subprocess.CompletedProcess[str]]

    def mode(self) -> object:
        rows = json.loads(self.wb("courier", "status", "--json").stdout).get("machines") or []
        return next((row["mode"] for row in rows if row["machine"] == "box"), None)

    def serving(self) -> None:
        """The courier's serve session to the box is open (a list started it)."""
        assert self.wb("agent", "list", "--to", "box").returncode == 0
        assert wait_for(lambda: self.mode() == "serve", 30)

    def run(self, *args: str) -> dict[str, object]:
        dispatched = self.wb("agent", "dispatch", "--to", "box", "--repo", "acme/widget", "--json", *args)
        assert dispatched.returncode == 0, dispatched.stderr
        ref = f"box:{json.loads(dispatched.stdout)['agent_id']}"
        waited = self.wb("agent", "await", ref, "--wait-timeout", "60s", "--json")
        result: dict[str, object] = json.loads(waited.stdout)
        return result


def _box(sshd: SshdFactory, tmp_path: Path, host: str, courier: dict[str, object]) -> Iterator[Box]:
    root = sshd.base / f"sshd-{host}-{len(sshd.servers)}"  # where SshdFactory.start puts this machine
    profile = sshd.base / f"profile-{host}.sh"
    profile.write_text("")
    python_bin = Path(sys.executable).parent
    # sshd keeps the first SetEnv line: this one is the template's plus BASH_ENV.
    set_env = (
        f"SetEnv BASH_ENV={profile} WB_HOME={root / 'wbhome'} WB_PROJECTS_ROOT={root / 'projects'} "
        f"WB_CONFIG={root / 'remote-wb.yaml'} PATH={root / 'bin'}:{python_bin}:/usr/bin:/bin PYENV_REHASH_TIMEOUT=0\n"
    )
    server = sshd.start(host, sshd_options=set_env)
    assert server.root == root
    prepare_remote(server)
    config = sshd.write_wb_config(f"fresh-{tmp_path.name}-{host}", {"box": sshd.target(server)})
    if courier:
        document = yaml.safe_load(config.read_text())
        config.write_text(yaml.safe_dump({**document, "courier": courier}))
    env = {
        "HOME": str(tmp_path),
        "PATH": f"{python_bin}:/usr/bin:/bin",
        "WB_CONFIG": str(config),
        "WB_HOME": str(tmp_path / "wbhome"),
        "WB_PROJECTS_ROOT": str(tmp_path / "projects"),
        "WB_SSH_CONFIG": str(sshd.client_config),
        "LANG": "C.UTF-8",
        "WB_COURIER": "on",
    }

    def wb(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "courier.main", *args], capture_output=True, text=True, env=env, timeout=120
        )

    try:
        yield Box(server, profile, wb)
    finally:
        wb("courier", "stop")


def test_a_cli_installed_after_the_serve_session_started_is_found_by_the_next_dispatch(
    sshd: SshdFactory, tmp_path: Path
) -> None:
    for box in _box(sshd, tmp_path, "127.0.0.3", {}):
        (box.server.bin_dir / "codex").unlink()  # not installed yet
        box.serving()
        # Installed now, in a directory that only new logins have on their PATH.
        later = box.server.root / "later-bin"
        later.mkdir()
        shutil.copy(FAKES / "codex", later / "codex")
        box.profile.write_text(f"export PATH={later}:$PATH\n")
        result = box.run("--new-worktree", "f1", "--profile", "fake", "--task", "scenario:complete")
        assert result["state"] == "completed", (result.get("failure"), result.get("harness_diagnostics"))
        assert box.mode() == "serve"  # the serve session goes on serving everything else


@pytest.mark.parametrize("over_serve", [False, True])
def test_dispatch_over_serve_runs_with_the_sessions_environment(
    sshd: SshdFactory, tmp_path: Path, over_serve: bool
) -> None:
    """By default a run has the environment a new login gets now; with `courier.dispatch_over_serve` the one
    its serve session started with (docs/courier.md, "Environment")."""
    courier = {"dispatch_over_serve": True} if over_serve else {}
    for box in _box(sshd, tmp_path, "127.0.0.4" if over_serve else "127.0.0.5", courier):
        program = box.server.root / "marker.sh"
        marker = box.server.root / "marker.txt"
        program.write_text(f'#!/bin/sh\nprintf "%s" "$PATH" > {marker}\n')  # PATH reaches the worker
        program.chmod(0o755)
        remote = box.server.root / "remote-wb.yaml"
        document = yaml.safe_load(remote.read_text())
        document["agents"]["profiles"]["marker"] = {"harness": "command", "command": [str(program)], "sandbox": "off"}
        remote.write_text(yaml.safe_dump(document))
        box.serving()
        later = box.server.root / "later-bin"
        box.profile.write_text(f"export PATH={later}:$PATH\n")  # what only a new login has
        result = box.run("--new-worktree", "m1", "--profile", "marker", "--task", "t")
        assert result["state"] == "completed", result
        assert (str(later) in marker.read_text()) is not over_serve, marker.read_text()
        assert box.mode() == "serve"
