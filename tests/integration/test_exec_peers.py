"""Hostile and mistaken exec peers (docs/cli.md#exec-targets): what reaches the user's terminal and MCP client.

Each machine is a local `#!/bin/sh` script as an exec target: one that floods stdout, one that
echoes this machine's provider credentials on stderr or in its failure message, and targets
whose argv is a natural mistake (it ends in `wb`) or whose command refuses its command line.
The commands run cold or through the courier, as the suite's WB_COURIER says.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

PYTHON_BIN = str(Path(sys.executable).parent)
REF_ID = "agt-" + "5d" * 16
ENV_KEY = "sk-env-0123456789abcdef"  # TEST_PROVIDER_KEY's value
FILE_KEY = "sk-file-fedcba9876543210"  # the credential_file's
# What asyncio prints when a task, transport or pipe is left behind (docs/courier.md): never on a user's stderr.
ASYNCIO_NOISE = ("Task was destroyed", "Exception ignored", "Traceback", "unclosed transport", "Unknown child process")
FLOOD_REFUSED_WITHIN_S = 5.0  # docs/protocol.md#the-callers-rules: a flooding exec peer is refused this soon

PEER = """#!/bin/sh
here=$(dirname "$0")
case "$1" in
flood) exec yes 'a flooding peer writes this line again and again and again' ;;
flood-child) yes 'a flooding grandchild holds the pipe' ;;
leak)
  echo "peer says: env=$TEST_PROVIDER_KEY file=$(cat "$here/file-key") json=$(cat "$here/escaped-key")" >&2
  exit 3
  ;;
fail)
  cat >/dev/null
  printf '{"schema_version":1,"operation":"status","failure":"no such run (key %s)","failure_kind":"not_found"}\\n' \\
    "$TEST_PROVIDER_KEY"
  ;;
usage) echo "usage: peer [--flag]" >&2; exit 2 ;;
esac
"""


@dataclass
class Caller:
    env: dict[str, str]
    root: Path

    def wb(self, *args: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess[str], float]:
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "courier.main", *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            cwd=self.root,
        )
        return done, time.monotonic() - started


@pytest.fixture
def caller(tmp_path: Path) -> Any:
    tmp_path.chmod(0o700)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    peer = bin_dir / "peer"
    peer.write_text(PEER)
    peer.chmod(0o755)
    (bin_dir / "file-key").write_text(FILE_KEY)
    # The file credential as a JSON string spells it: every character `\uXXXX`-escaped.
    (bin_dir / "escaped-key").write_text("".join(f"\\u{ord(char):04x}" for char in FILE_KEY))
    key_file = tmp_path / "provider-key"
    key_file.write_text(FILE_KEY + "\n")
    key_file.chmod(0o600)
    targets: dict[str, Any] = {
        mode: {"exec": {"argv": [str(peer), mode]}} for mode in ("flood", "flood-child", "leak", "fail", "usage")
    }
    targets["endswb"] = {"exec": {"argv": ["env", f"PATH={PYTHON_BIN}:/usr/bin:/bin", "wb"]}}
    config = tmp_path / "wb.yaml"
    document = {
        "agents": {
            "providers": {
                "envprov": {"base_url": "https://example.com/v1", "credential_env": "TEST_PROVIDER_KEY"},
                "fileprov": {"base_url": "https://example.com/v1", "credential_file": str(key_file)},
            }
        },
        "session_move": {"targets": targets},
    }
    config.write_text(yaml.safe_dump(document))
    config.chmod(0o600)
    env = {
        "HOME": str(tmp_path),
        "PATH": f"{PYTHON_BIN}:/usr/bin:/bin",
        "WB_CONFIG": str(config),
        "WB_HOME": str(tmp_path / "wbhome"),
        "WB_PROJECTS_ROOT": str(tmp_path / "projects"),
        "LANG": "C.UTF-8",
        "TEST_PROVIDER_KEY": ENV_KEY,
    }
    yield Caller(env, tmp_path)
    subprocess.run(
        [sys.executable, "-m", "courier.main", "courier", "stop"], env=env, capture_output=True, timeout=60, check=False
    )


def _clean(stderr: str) -> bool:
    return not any(noise in stderr for noise in ASYNCIO_NOISE)


@pytest.mark.parametrize("machine", ["flood", "flood-child"])
def test_a_flooding_exec_peer_is_refused_at_once_and_leaves_no_asyncio_noise(caller: Caller, machine: str) -> None:
    """Refused within 5 s on this Python (3.11 included), its stderr one line; later commands' stderr clean too.

    `flood-child`'s flood is a grandchild that keeps the pipe when the peer is killed."""
    done, took = caller.wb("agent", "status", f"{machine}:{REF_ID}", "--machine-timeout", "60s")
    assert done.returncode == 255 and done.stdout == ""
    assert done.stderr == f"error: {machine}: the reply exceeds 4194304 bytes; refused (the channel was closed)\n"
    assert took < FLOOD_REFUSED_WITHIN_S, took
    # Through the courier (the WB_COURIER=on pass) the flood's call ran in the courier: what it left
    # behind there must not reach the commands that follow.
    for args in (["agent", "list"], ["machines"], ["agent", "status", f"leak:{REF_ID}"], ["agent", "list"]):
        later, _ = caller.wb(*args)
        assert _clean(later.stderr), (args, later.stderr)
    again, took = caller.wb("agent", "status", f"{machine}:{REF_ID}", "--machine-timeout", "60s")
    assert again.stderr == done.stderr and took < FLOOD_REFUSED_WITHIN_S


def test_a_peers_stderr_never_shows_a_configured_credential(caller: Caller) -> None:
    """The env credential, the file credential and the file credential JSON-escaped: all masked."""
    done, _ = caller.wb("agent", "status", f"leak:{REF_ID}")
    assert done.returncode == 255
    assert done.stderr == (
        'error: machine leak: "' + str(caller.root / "bin" / "peer") + '" exited with status 3 without a reply: '
        "peer says: env=[redacted] file=[redacted] json=[redacted]\n"
    )
    listed, _ = caller.wb("agent", "list", "--all", "--json", "--machine-timeout", "20s")
    rows = {row["machine"]: row for row in json.loads(listed.stdout)["machines"]}
    assert rows["leak"]["error"].endswith("peer says: env=[redacted] file=[redacted] json=[redacted]")
    assert ENV_KEY not in listed.stdout + listed.stderr and FILE_KEY not in listed.stdout + listed.stderr


def test_a_peers_failure_message_never_shows_a_configured_credential(caller: Caller) -> None:
    done, _ = caller.wb("agent", "status", f"fail:{REF_ID}")
    assert done.returncode == 1 and done.stderr == "error: fail: no such run (key [redacted])\n"


def test_the_mcp_status_tool_masks_a_peers_credentials(caller: Caller) -> None:
    documents: list[dict[str, Any]] = []

    async def main() -> None:
        params = StdioServerParameters(
            command=sys.executable, args=["-m", "courier.main", "mcp"], env=caller.env, cwd=str(caller.root)
        )
        with anyio.fail_after(120):
            async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                for machine in ("leak", "fail"):
                    result = await session.call_tool("status", {"ref": f"{machine}:{REF_ID}"})
                    assert result.is_error
                    documents.append(json.loads(result.content[0].text))  # type: ignore[union-attr]

    anyio.run(main)
    text = json.dumps(documents)
    assert ENV_KEY not in text and FILE_KEY not in text
    assert documents[0]["message"].endswith("peer says: env=[redacted] file=[redacted] json=[redacted]")
    assert documents[1]["message"] == "fail: no such run (key [redacted])"


def _dispatch(caller: Caller, machine: str) -> subprocess.CompletedProcess[str]:
    done, _ = caller.wb(
        "agent", "dispatch", "--to", machine, "--new-worktree", "w1", "--profile", "fake",
        "--repo", "acme/widget", "--task", "scenario:complete",
    )  # fmt: skip
    return done


def test_an_exec_argv_ending_in_wb_says_wb_appends_wb_path_itself(caller: Caller) -> None:
    done = _dispatch(caller, "endswb")
    assert done.returncode == 255 and done.stdout == ""
    assert done.stderr == (
        'error: machine endswb: its exec.argv ends in "wb", but wb appends wb_path itself; drop it from '
        'session_move.targets.endswb.exec.argv ("env" exited with status 2 without a reply: '
        "error: No such command 'wb'.)\n"
    )
    checked, _ = caller.wb("machines", "--check", "--json", "--machine-timeout", "20s")
    row = next(row for row in json.loads(checked.stdout) if row["machine"] == "endswb")
    assert "but wb appends wb_path itself" in row["error"]


def test_a_command_that_refuses_its_command_line_started_nothing(caller: Caller) -> None:
    """Exit 2 without a reply: the command stopped before reading the request, so no run may have started."""
    done = _dispatch(caller, "usage")
    assert done.returncode == 255
    assert done.stderr == (
        'error: machine usage: "' + str(caller.root / "bin" / "peer") + '" exited with status 2 without a reply: '
        "usage: peer [--flag]\n"
    )
