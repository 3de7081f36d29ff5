"""A CLI installed on a machine after the courier's serve session started is found by the next dispatch.

The serve process keeps the environment it started with; a dispatch (and continue, and
version) travels as a one-call session instead, which starts with the environment the
machine gives a new login now (docs/courier.md, "Environment"). The machine here changes
its PATH the way a shell profile does (BASH_ENV, read by every new `bash -c`), after the
serve session started.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FAKES, prepare_remote, wait_for

from tests.integration.sshd import SshdFactory, sshd_unavailable_reason

pytestmark = [
    pytest.mark.courier_independent,  # it sets WB_COURIER=on itself: one courier pass runs it (tests/conftest.py)
    pytest.mark.skipif(sshd_unavailable_reason() is not None, reason=str(sshd_unavailable_reason())),
]


def test_a_cli_installed_after_the_serve_session_started_is_found_by_the_next_dispatch(
    sshd: SshdFactory, tmp_path: Path
) -> None:
    host = "127.0.0.3"
    root = sshd.base / f"sshd-{host}-{len(sshd.servers)}"  # where SshdFactory.start puts this machine
    profile = sshd.base / f"profile-{host}.sh"
    profile.write_text("")
    python_bin = Path(sys.executable).parent
    # sshd keeps the first SetEnv line: this one is the template's plus BASH_ENV.
    set_env = (
        f"SetEnv BASH_ENV={profile} WB_HOME={root / 'wbhome'} WB_PROJECTS_ROOT={root / 'projects'} "
        f"WB_CONFIG={root / 'remote-wb.yaml'} PATH={root / 'bin'}:{python_bin}:/usr/bin:/bin PYENV_REHASH_TIMEOUT=0\n"
    )
    box = sshd.start(host, sshd_options=set_env)
    assert box.root == root
    prepare_remote(box)
    (box.bin_dir / "codex").unlink()  # not installed yet
    config = sshd.write_wb_config(f"fresh-{tmp_path.name}", {"box": sshd.target(box)})
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

    def mode() -> object:
        rows = json.loads(wb("courier", "status", "--json").stdout).get("machines") or []
        return next((row["mode"] for row in rows if row["machine"] == "box"), None)

    try:
        assert wb("agent", "list", "--to", "box").returncode == 0
        assert wait_for(lambda: mode() == "serve", 30)
        # Installed now, in a directory that only new logins have on their PATH.
        later = box.root / "later-bin"
        later.mkdir()
        shutil.copy(FAKES / "codex", later / "codex")
        profile.write_text(f"export PATH={later}:$PATH\n")
        dispatched = wb(
            "agent", "dispatch", "--to", "box", "--new-worktree", "f1", "--profile", "fake",
            "--repo", "acme/widget", "--task", "scenario:complete", "--json",
        )  # fmt: skip
        assert dispatched.returncode == 0, dispatched.stderr
        ref = f"box:{json.loads(dispatched.stdout)['agent_id']}"
        waited = wb("agent", "await", ref, "--wait-timeout", "60s", "--json")
        result = json.loads(waited.stdout)
        assert result["state"] == "completed", result
        assert mode() == "serve"  # the serve session goes on serving everything else
    finally:
        wb("courier", "stop")
