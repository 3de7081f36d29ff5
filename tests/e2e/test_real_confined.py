"""The real Codex, Claude Code and Gemini CLIs confined by wb's sandbox (docs/security.md#confined-runs).

Each CLI runs against its in-suite scripted model server, whose `probe` scenario asks it to run
one shell command in its worktree that reads a canary in the real home, plants a file there,
opens the model server's own port directly (not through the relay), counts the processes it
sees and prints its environment. The command's output comes back to the server as the tool
result; the test reads it there. Each CLI's edits in its worktree are proved by its own e2e
file (tests/e2e/test_real_*.py), which runs confined as every run does.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import CREDENTIAL_ENV, CREDENTIAL_VALUE, FAKES, Machine, git, require_cli

from courier.demo.anthropic_server import AnthropicServer
from courier.demo.gemini_server import GeminiServer
from courier.demo.model_server import PROBE_CANARY_PATH, PROBE_MESSAGE, PROBE_SCRIPT, ModelServer
from courier.demo.scripted_http import ScriptedServer
from courier.runs.bwrap_probe import probe

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not probe().usable, reason=f"bubblewrap is not usable here: {probe().reason}"),
]

CANARY = "wb-e2e-canary-31c9"
# harness → (CLI, pinned version, install step, server class, wire_api, model)
CLIS = {
    "codex": ("codex", "0.169.0", None, ModelServer, "responses", "gpt-5.5"),
    "claude": ("claude", "2.1.328", "run `bash scripts/install-claude.sh`", AnthropicServer, "anthropic",
               "claude-sonnet-4-5"),
    "gemini": ("gemini", "0.61.0", "run `bash scripts/install-gemini.sh`", GeminiServer, "gemini", "gemini-2.5-pro"),
}  # fmt: skip


@pytest.fixture(params=sorted(CLIS))
def confined(request: pytest.FixtureRequest, machine: Machine) -> Iterator[tuple[Machine, ScriptedServer[object]]]:
    harness = request.param
    name, version, install, server_class, wire_api, model = CLIS[harness]
    cli = require_cli(name, version, install=install)
    kept = [d for d in machine.env["PATH"].split(os.pathsep) if d and Path(d).resolve() != FAKES.resolve()]
    machine.env["PATH"] = os.pathsep.join([*cli.dirs, *(d for d in kept if d not in cli.dirs)])
    found = shutil.which(name, path=machine.env["PATH"])
    assert found is not None and Path(found).parent != FAKES
    canary = Path(machine.env["HOME"]) / PROBE_CANARY_PATH
    canary.parent.mkdir(mode=0o700)
    canary.write_text(CANARY)
    with server_class() as server:
        machine.write_config(
            "agents:\n  providers:\n"
            f"    probe:\n      base_url: {server.base_url_for('probe')}\n"
            f"      credential_env: {CREDENTIAL_ENV}\n      wire_api: {wire_api}\n"
            f"  profiles:\n    probe: {{harness: {harness}, provider: probe, model: {model}}}\n"
        )
        clone = machine.clone()
        (clone / "probe.sh").write_text(PROBE_SCRIPT)
        git(clone, "add", "probe.sh")
        git(clone, "commit", "-q", "-m", "the probe")
        yield machine, server


def _lines(text: str) -> dict[str, str]:
    found = {}
    for line in text.replace("\\n", "\n").replace("\\\"", '"').splitlines():
        for key in ("canary", "plant", "loopback", "processes", "environ", "worktree"):
            marker = f"PROBE-1 {key}: "
            if marker in line and key not in found:
                found[key] = line.split(marker, 1)[1]
    return found


def test_a_confined_cli_edits_its_worktree_and_its_command_reaches_nothing_else(
    confined: tuple[Machine, ScriptedServer[object]],
) -> None:
    machine, server = confined
    done = machine.wb(
        "agent", "dispatch", "--new-worktree", "w1", "--profile", "probe", "--repo", "acme/widget",
        "--task", "Do the scripted task.",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    waited = machine.wb("agent", "await", done.stdout.split()[0], "--wait-timeout", "90s", "--json", timeout=120)
    result = json.loads(waited.stdout)
    assert result["state"] == "completed" and result["result"] == PROBE_MESSAGE, result
    assert result["sandbox"] == {"kind": "bwrap", "network": "provider"}
    assert (Path(result["worktree_dir"]) / "probed.txt").read_text() == "x\n"  # it ran in its worktree

    # The tool result the CLI sent back to the model: what its command saw inside.
    posts = [r for r in server.requests if r.method == "POST"]
    told = json.dumps([r.body for r in posts[1:]])
    seen = _lines(told)
    assert seen.get("worktree") == "written", told[:2000]
    assert CANARY not in told and "No such file or directory" in seen["canary"]
    assert not (Path(machine.env["HOME"]) / "planted").exists() and seen["plant"] != "written"
    assert seen["loopback"] == "UNREACHABLE"  # the provider's own port, out of the sandbox's network
    assert int(seen["processes"]) < 30  # its own PID namespace (the host runs hundreds)
    assert CREDENTIAL_VALUE not in told  # in no environment of its command
    # The provider still got the real credential, put in outside by the relay.
    assert all(CREDENTIAL_VALUE in json.dumps(dict(r.headers)) for r in posts)
