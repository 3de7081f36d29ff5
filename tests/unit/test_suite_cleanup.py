"""The suite's own clean-up after a test (tests/conftest.py `_kill_leftovers`) ends what a run left behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

from conftest import _kill_leftovers, pid_alive, wait_for


def test_a_leftover_whose_only_tie_is_the_killed_process_group_is_ended(tmp_path: Path) -> None:
    """Like bubblewrap's sandbox init whose parent was killed during its set-up: a member of a killed
    process's group that names nothing of the test and is no longer anyone's descendant."""
    orphan_pid = tmp_path / "orphan.pid"
    # The leader starts an orphan in its own group (the subshell exits, so the orphan is nobody's child
    # here, working in /), then becomes a process whose working directory is under the test's directory.
    leader = subprocess.Popen(
        ["sh", "-c", f'(cd / && sleep 600 & echo $! > "{orphan_pid}") ; exec sleep 601'],
        cwd=tmp_path,
        start_new_session=True,
    )
    try:
        assert wait_for(lambda: orphan_pid.exists() and orphan_pid.read_text().strip() != "", 10, 0.01)
        orphan = int(orphan_pid.read_text())
        assert pid_alive(orphan) and str(tmp_path) not in Path(f"/proc/{orphan}/cmdline").read_text()
        assert wait_for(lambda: Path(f"/proc/{orphan}/cwd").readlink() == Path("/"), 10, 0.01)
        _kill_leftovers(tmp_path)
        leader.wait(10)
        assert not pid_alive(orphan)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()
