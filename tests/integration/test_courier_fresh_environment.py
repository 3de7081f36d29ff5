"""A CLI installed on a machine after the courier's serve session started is found by the next dispatch.

The serve process keeps the environment it started with. A dispatch (and continue) takes it
while the files a new login reads are unchanged, and is handed to a one-call session, which
starts with the environment the machine gives a new login now, once they changed (or when the
session's PATH lacks the harness); `version`, and every dispatch with
`courier.dispatch_over_serve: false`, always take a one-call session (docs/courier.md,
"Environment"). The machine here changes its PATH the way a user does, in ~/.bashrc (the test's own HOME),
after the serve session started: Debian's and Ubuntu's bash read it for every command sshd runs, and
BASH_ENV names it for a bash built otherwise.
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
    profile: Path  # what every new login there reads: ~/.bashrc, also named by BASH_ENV
    wb: Callable[..., subprocess.CompletedProcess[str]]

    def mode(self) -> object:
        rows = json.loads(self.wb("courier", "status", "--json").stdout).get("machines") or []
        return next((row["mode"] for row in rows if row["machine"] == "box"), None)

    def serving(self) -> None:
        """The courier's serve session to the box is open (a list started it)."""
        assert self.wb("agent", "list", "--to", "box").returncode == 0
        assert wait_for(lambda: self.mode() == "serve", 30)

    def serves_again(self) -> bool:
        """The courier has a serve session to the box (again: one that ended is replaced after a call)."""
        return wait_for(lambda: self.mode() == "serve", 30)

    def run(self, *args: str) -> dict[str, object]:
        dispatched = self.wb("agent", "dispatch", "--to", "box", "--repo", "acme/widget", "--json", *args)
        assert dispatched.returncode == 0, dispatched.stderr
        ref = f"box:{json.loads(dispatched.stdout)['agent_id']}"
        waited = self.wb("agent", "await", ref, "--wait-timeout", "60s", "--json")
        result: dict[str, object] = json.loads(waited.stdout)
        return result


OFF = {"dispatch_over_serve": False}


def _lines(marker: Path) -> list[str]:
    return marker.read_text().splitlines()


def _box(sshd: SshdFactory, tmp_path: Path, host: str, courier: dict[str, object]) -> Iterator[Box]:
    root = sshd.base / f"sshd-{host}-{len(sshd.servers)}"  # where SshdFactory.start puts this machine
    home = sshd.base / f"home-{host}"  # the login's HOME: never the real user's files
    home.mkdir()
    profile = home / ".bashrc"
    profile.write_text("")
    python_bin = Path(sys.executable).parent
    # sshd keeps the first SetEnv line: this one is the template's plus HOME and BASH_ENV.
    set_env = (
        f"SetEnv HOME={home} BASH_ENV={profile} WB_HOME={root / 'wbhome'} WB_PROJECTS_ROOT={root / 'projects'} "
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


@pytest.mark.parametrize("over_serve", [True, False])
def test_a_cli_installed_after_the_serve_session_started_is_found_by_the_next_dispatch(
    sshd: SshdFactory, tmp_path: Path, over_serve: bool
) -> None:
    for box in _box(sshd, tmp_path, "127.0.0.3" if over_serve else "127.0.0.6", {} if over_serve else OFF):
        (box.server.bin_dir / "codex").unlink()  # not installed yet
        box.serving()
        # Installed now, in a directory that only new logins have on their PATH.
        later = box.server.root / "later-bin"
        later.mkdir()
        shutil.copy(FAKES / "codex", later / "codex")
        box.profile.write_text(f"export PATH={later}:$PATH\n")
        result = box.run("--new-worktree", "f1", "--profile", "fake", "--task", "scenario:complete")
        assert result["state"] == "completed", (result.get("failure"), result.get("harness_diagnostics"))
        # The serve session goes on serving everything else (over serve: a new one, started after the change).
        assert box.serves_again()


@pytest.mark.parametrize("over_serve", [True, False])
def test_a_run_has_its_serve_sessions_environment_until_the_login_files_change(
    sshd: SshdFactory, tmp_path: Path, over_serve: bool
) -> None:
    """Over the serve session (the default) a run has the environment that session started with, as long as
    the files a new login reads stay as they are; with `courier.dispatch_over_serve: false`, always a new
    login's (docs/courier.md, "Environment")."""
    for box in _box(sshd, tmp_path, "127.0.0.4" if over_serve else "127.0.0.5", {} if over_serve else OFF):
        program = box.server.root / "marker.sh"
        marker = box.server.root / "marker.txt"
        program.write_text(f'#!/bin/sh\nprintf "%s\\n" "$PATH" >> {marker}\n')  # PATH reaches the worker
        program.chmod(0o755)
        remote = box.server.root / "remote-wb.yaml"
        document = yaml.safe_load(remote.read_text())
        document["agents"]["profiles"]["marker"] = {"harness": "command", "command": [str(program)], "sandbox": "off"}
        remote.write_text(yaml.safe_dump(document))
        # Every login puts a directory named by its own start time first on PATH: two runs with the same
        # one ran with one login's environment.
        box.profile.write_text("export PATH=/login-$(date +%s%N):$PATH\n")
        box.serving()
        for name in ("m1", "m2"):
            result = box.run("--new-worktree", name, "--profile", "marker", "--task", "t")
            assert result["state"] == "completed", result
        logins = [[entry for entry in line.split(":") if entry.startswith("/login-")] for line in _lines(marker)]
        assert all(len(found) == 1 for found in logins) and (logins[0] == logins[1]) is over_serve, logins
        later = box.server.root / "later-bin"
        box.profile.write_text(f"export PATH={later}:$PATH\n")  # what only a new login has
        result = box.run("--new-worktree", "m3", "--profile", "marker", "--task", "t")
        assert result["state"] == "completed", result
        assert str(later) in _lines(marker)[-1].split(":"), _lines(marker)
        assert box.serves_again()
