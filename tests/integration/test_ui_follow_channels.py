"""A run page's live stream ends with the page over SSH and over an exec target that runs ssh
(docs/ui.md, a run's page): closing the page leaves no receiver on the far machine after 5 s.

tests/integration/test_ui_browser.py checks the same for an `env …` exec machine together
with `wb ui`'s own threads; this module adds the channels whose far side is behind a real
sshd: `openssh` (wb's own SSH client) and `exec-ssh` (`ssh -T …` as the exec command). The
in-process asyncssh tier would add nothing the openssh one does not, at half a minute.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from conftest import Machine, prepare_remote, wait_for
from ui_support import UiServer, open_stream

from tests.ssh_tiers import SshMachine, SshMachines, channel_tiers

# `wb ui` always runs cold; its calls go straight over each channel, so one courier pass is enough.
pytestmark = pytest.mark.courier_independent(because="`wb ui` always runs cold (courier/main.py COLD_COMMANDS)")
ssh_tier = channel_tiers(warm=("exec-ssh",), cold=())
STREAMS = 8


def _receivers(box: SshMachine) -> set[int]:
    """The far machine's `wb --wb-internal-agent-remote` processes: one per pending call."""
    found = set()
    for process in box.session_processes():
        try:
            if "--wb-internal-agent-remote" in process.cmdline():
                found.add(process.pid)
        except psutil.Error:
            continue
    return found


@pytest.mark.parametrize("ssh_tier", ["openssh", "exec-ssh"], indirect=True)
def test_closing_a_run_page_ends_the_far_sides_follow_within_5s(
    ssh_tier: str, ssh_machines: SshMachines, tmp_path: Path
) -> None:
    box = ssh_machines.start("127.0.0.2")
    prepare_remote(box)
    config = ssh_machines.write_wb_config("ui-follow", {"box": ssh_machines.target(box)})
    env = {
        "HOME": str(tmp_path),
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "WB_CONFIG": str(config),
        "WB_HOME": str(tmp_path / "wbhome"),
        "WB_PROJECTS_ROOT": str(tmp_path / "projects"),
        "WB_SSH_CONFIG": str(ssh_machines.client_config),
        "LANG": "C.UTF-8",
    }

    def wb(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "courier.main", *args]
        return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120, stdin=subprocess.DEVNULL)

    dispatched = wb("agent", "dispatch", "--to", "box", "--new-worktree", "silent", "--profile", "fake",
                    "--repo", "acme/widget", "--task", "scenario:silent")  # fmt: skip
    assert dispatched.returncode == 0, dispatched.stderr
    ref = dispatched.stdout.split()[0]
    assert wait_for(lambda: json.loads(wb("agent", "status", ref, "--json").stdout)["state"] == "running", 60)
    ui = UiServer.start(Machine(tmp_path, env), "--to", "box")
    try:
        # No fleet page is open on this server, so it waits on nothing there (docs/ui.md, "Live").
        assert _receivers(box) == set()
        streams = [open_stream(ui, f"/run/{ref}/actions") for _ in range(STREAMS)]
        assert wait_for(lambda: len(_receivers(box)) >= STREAMS, 60), _receivers(box)
        for stream in streams:
            stream.close()
        # No follow's receiver is left, and none started since.
        assert wait_for(lambda: not _receivers(box), 5), _receivers(box)
    finally:
        assert ui.finish() == 130
        wb("agent", "stop", ref)

