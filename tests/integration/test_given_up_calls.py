"""A call the caller gives up on ends on the far side too (docs/protocol.md#the-callers-rules), over real OpenSSH.

The peer is a `wb_path` script that reads its request and then stays silent. A session without
a PTY gets no SIGHUP when its channel closes, and a command that writes nothing never notices
the close: without more, it would run on, on a connection the courier keeps for minutes or a
cold one alike. wb asks the server to kill it (the SSH `signal` request) before closing the
channel. OpenSSH's sshd honours that request for a user other than root only (a root login
runs without privilege separation, where sshd refuses to signal a session), so the machine is
logged into as an ordinary account the test makes (useradd).

The commands run cold or through the courier, as the suite's WB_COURIER says.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import wait_for

from tests.integration.sshd import SshdFactory, sshd_unavailable_reason

pytestmark = pytest.mark.skipif(sshd_unavailable_reason() is not None, reason=str(sshd_unavailable_reason()))

REF = "m1:agt-" + "6e" * 16
FAR_SIDE_ENDS_WITHIN_S = 5.0  # docs/protocol.md#the-callers-rules


ACCOUNT = "wbgivenup"  # made for this test, so it does not depend on the accounts a machine has
USERADD = "/usr/sbin/useradd"
USERDEL = "/usr/sbin/userdel"


@pytest.fixture
def ordinary_account(shared_dir: Path) -> Iterator[pwd.struct_passwd]:
    """A non-root account with a shell that can run a command (sshd runs every command through it)."""
    if os.geteuid() != 0 or not os.access(USERADD, os.X_OK):
        pytest.skip("needs root with useradd, to run sshd and make an ordinary account to log in as")
    subprocess.run([USERDEL, ACCOUNT], capture_output=True)
    subprocess.run([USERADD, "-M", "-d", str(shared_dir), "-s", "/bin/sh", ACCOUNT], check=True, capture_output=True)
    try:
        yield pwd.getpwnam(ACCOUNT)
    finally:
        for proc in psutil.process_iter(["username"]):
            if proc.info["username"] == ACCOUNT:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
        subprocess.run([USERDEL, ACCOUNT], capture_output=True)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory the ordinary account can read (the test's own tmp_path is root's, 0700)."""
    path = Path(tempfile.mkdtemp(prefix="wb-given-up-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_a_silent_peers_far_side_ends_within_5s_of_the_caller_giving_up(
    sshd: SshdFactory, shared_dir: Path, ordinary_account: pwd.struct_passwd, tmp_path: Path
) -> None:
    account = ordinary_account
    keys = shared_dir / "authorized_keys"
    keys.write_text(sshd.client_public_key + "\n")
    keys.chmod(0o644)
    marker = f"120.{os.getpid()}"  # this test's own sleep, found by its argument
    script = shared_dir / "silent-wb"
    script.write_text(f"#!/bin/sh\ncat >/dev/null\nsleep {marker}\n")
    script.chmod(0o755)
    server = sshd.start("127.0.0.8", sshd_options=f"AuthorizedKeysFile {keys}\nUsePAM yes\n")
    config = sshd.write_wb_config(
        f"given-up-{os.getpid()}", {"m1": sshd.target(server, user=account.pw_name, wb_path=str(script))}
    )

    def left() -> list[int]:
        found = []
        for process in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error):
                if marker in (process.info["cmdline"] or []):
                    found.append(process.pid)
        return found

    env = {
        "HOME": str(tmp_path),
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "WB_CONFIG": str(config),
        "WB_HOME": str(tmp_path / "wbhome"),
        "WB_SSH_CONFIG": str(sshd.client_config),
        "LANG": "C.UTF-8",
    }
    try:
        done = subprocess.run(
            [sys.executable, "-m", "courier.main", "agent", "status", REF, "--machine-timeout", "3s"],
            capture_output=True,
            text=True,
            env=env,
            timeout=90,
            stdin=subprocess.DEVNULL,
        )
        given_up = time.monotonic()
        assert done.returncode == 255 and "did not answer the status request" in done.stderr, done.stderr
        assert wait_for(lambda: not left(), FAR_SIDE_ENDS_WITHIN_S), f"still running: {left()}"
        assert time.monotonic() - given_up < FAR_SIDE_ENDS_WITHIN_S
    finally:
        for pid in left():
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
        subprocess.run(
            [sys.executable, "-m", "courier.main", "courier", "stop"], env=env, capture_output=True, timeout=60
        )
