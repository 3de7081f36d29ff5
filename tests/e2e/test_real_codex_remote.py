"""The real Codex CLI once more, on another machine: dispatched `--to` a loopback sshd machine.

The remote machine is this checkout's `wb` behind a real OpenSSH sshd with its own home,
its own wb.yaml (a credential_file, as non-interactive SSH shells advise) and the real
`codex` on its PATH; the model server listens on this machine's loopback, which the
remote machine (the same host) reaches.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import CREDENTIAL_VALUE, make_clone, unavailable

from courier.demo.model_server import HELLO_CONTENT, HELLO_PATH, WRITE_FILE_MESSAGE, ModelServer
from tests.integration.sshd import SshdFactory, sshd_unavailable_reason

pytestmark = pytest.mark.e2e

REMOTE_CONFIG = """\
agents:
  providers:
    scripted:
      base_url: {base_url}
      credential_file: {credential}
      request_max_retries: 0
      stream_max_retries: 0
  profiles:
    real:
      harness: codex
      provider: scripted
      model: gpt-5.5
"""


@pytest.fixture(scope="module")
def model() -> Iterator[ModelServer]:
    with ModelServer() as running:
        yield running


@pytest.fixture(scope="module")
def caller_env(tmp_path_factory: pytest.TempPathFactory, model: ModelServer) -> Iterator[dict[str, str]]:
    from test_real_codex import _real_codex_dirs

    _real_codex_dirs()  # skips (fails under CI), naming the install step, when the real codex is missing
    reason = sshd_unavailable_reason()
    if reason is not None:
        unavailable(reason)
    factory = SshdFactory(tmp_path_factory.mktemp("sshd-e2e"))
    try:
        box = factory.start("127.0.0.3")
        make_clone(box.projects_root / "acme" / "widget")
        credential = box.root / "credential"
        credential.write_text(CREDENTIAL_VALUE)
        credential.chmod(0o600)
        remote_config = box.root / "remote-wb.yaml"
        remote_config.write_text(REMOTE_CONFIG.format(base_url=model.base_url_for("write-file"), credential=credential))
        remote_config.chmod(0o600)
        home = tmp_path_factory.mktemp("caller")
        yield {
            "HOME": str(home),
            "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
            "WB_CONFIG": str(factory.write_wb_config("caller", {"box": factory.target(box)})),
            "WB_HOME": str(home / "wbhome"),
            "WB_SSH_CONFIG": str(factory.client_config),
            "LANG": "C.UTF-8",
        }
    finally:
        factory.close()


def _wb(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "courier.main", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def test_a_real_codex_run_on_another_machine(caller_env: dict[str, str]) -> None:
    done = _wb(
        caller_env,
        "agent",
        "dispatch",
        "--to",
        "box",
        "--new-worktree",
        "w1",
        "--profile",
        "real",
        "--repo",
        "acme/widget",
        "--task",
        "Do the scripted task.",
    )
    assert done.returncode == 0, done.stderr
    ref = done.stdout.split()[0]
    assert ref.startswith("box:agt-")
    waited = _wb(caller_env, "agent", "await", ref, "--wait-timeout", "90s", "--json")
    assert waited.returncode == 0, waited.stderr
    result = json.loads(waited.stdout)
    assert result["machine"] == "box" and result["state"] == "completed", result
    assert result["result"] == WRITE_FILE_MESSAGE
    assert Path(result["worktree_dir"], HELLO_PATH).read_text() == HELLO_CONTENT
    assert result["changes"]["files"] == [HELLO_PATH]
    logs = _wb(caller_env, "agent", "logs", ref)
    assert logs.returncode == 0 and "  ran: /bin/bash -lc " in logs.stdout
