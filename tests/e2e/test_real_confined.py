"""The real Codex, Claude Code and Gemini CLIs confined by wb's sandbox (docs/security.md#confined-runs).

Each CLI runs against its in-suite scripted model server, whose `probe` scenario asks it to run
one shell command in its worktree that reads a canary in the real home, plants a file there,
opens the model server's own port directly (not through the relay), counts the processes it
sees and prints its environment. The command's output comes back to the server as the tool
result; the test reads it there. Each CLI's edits in its worktree are proved by its own e2e
file (tests/e2e/test_real_*.py), which runs confined as every run does.

Each CLI is probed twice: on this machine (`local`), and on another machine (`ssh`): the run
dispatched `--to` a real OpenSSH sshd on loopback (tests/integration/sshd.py) with its own HOME
(the canary's), its own wb.yaml (a credential_file) and the real CLI on its PATH; the model
server listens on this host's loopback, which that machine (the same host) reaches.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import CREDENTIAL_ENV, CREDENTIAL_VALUE, FAKES, Machine, git, make_clone, require_cli, unavailable

from courier.demo.anthropic_server import AnthropicServer
from courier.demo.gemini_server import GeminiServer
from courier.demo.model_server import PROBE_CANARY_PATH, PROBE_MESSAGE, PROBE_SCRIPT, ModelServer
from courier.demo.scripted_http import ScriptedServer
from courier.runs.bwrap_probe import probe
from tests.integration.sshd import DEFAULT_PATH, SshdFactory, sshd_unavailable_reason

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
WHERE = ("local", "ssh")  # the run on the caller's machine, or `--to` a loopback sshd machine
SSH_HOST = "127.0.0.3"


@dataclass(frozen=True)
class Probed:
    """A caller ready to dispatch the probe, where the run lands, and the model server it talks to."""

    caller: Machine
    home: Path  # the HOME of the machine the run is on: the canary's, where a plant would land
    to: str | None  # the machine `--to` names, None for the caller's own
    server: ScriptedServer[object]


def _agents_config(server: ScriptedServer[object], harness: str, credential: str) -> str:
    _, _, _, _, wire_api, model = CLIS[harness]
    return (
        "agents:\n  providers:\n"
        f"    probe:\n      base_url: {server.base_url_for('probe')}\n"
        f"      {credential}\n      wire_api: {wire_api}\n"
        f"  profiles:\n    probe: {{harness: {harness}, provider: probe, model: {model}}}\n"
    )


def _plant_canary(home: Path) -> None:
    canary = home / PROBE_CANARY_PATH
    canary.parent.mkdir(mode=0o700, parents=True)
    canary.write_text(CANARY)


def _commit_probe(clone: Path) -> None:
    (clone / "probe.sh").write_text(PROBE_SCRIPT)
    git(clone, "add", "probe.sh")
    git(clone, "commit", "-q", "-m", "the probe")


@pytest.fixture(params=[(h, w) for h in sorted(CLIS) for w in WHERE], ids=lambda p: f"{p[0]}-{p[1]}")
def confined(
    request: pytest.FixtureRequest, machine: Machine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Probed]:
    harness, where = request.param
    name, version, install, server_class, _, _ = CLIS[harness]
    cli = require_cli(name, version, install=install)
    kept = [d for d in machine.env["PATH"].split(os.pathsep) if d and Path(d).resolve() != FAKES.resolve()]
    machine.env["PATH"] = os.pathsep.join([*cli.dirs, *(d for d in kept if d not in cli.dirs)])
    found = shutil.which(name, path=machine.env["PATH"])
    assert found is not None and Path(found).parent != FAKES
    with server_class() as server:
        if where == "local":
            home = Path(machine.env["HOME"])
            _plant_canary(home)
            machine.write_config(_agents_config(server, harness, f"credential_env: {CREDENTIAL_ENV}"))
            _commit_probe(machine.clone())
            yield Probed(machine, home, None, server)
            return
        reason = sshd_unavailable_reason()
        if reason is not None:
            unavailable(reason)
        factory = SshdFactory(tmp_path_factory.mktemp("sshd-confined"))
        try:
            root = factory.base / f"sshd-{SSH_HOST}-0"  # where SshdFactory.start puts its first machine
            home = root / "home"
            path = ":".join([str(root / "bin"), str(Path(sys.executable).parent), *factory.cli_dirs, *DEFAULT_PATH])
            # sshd keeps the first SetEnv line: this one is the template's plus the machine's own HOME
            # (sshd would give the session root's real one).
            box = factory.start(
                SSH_HOST,
                sshd_options=f"SetEnv HOME={home} WB_HOME={root / 'wbhome'} WB_PROJECTS_ROOT={root / 'projects'} "
                f"WB_CONFIG={root / 'remote-wb.yaml'} PATH={path} PYENV_REHASH_TIMEOUT=0\n",
            )
            assert box.root == root
            home.mkdir(mode=0o700)
            _plant_canary(home)
            credential = root / "credential"
            credential.write_text(CREDENTIAL_VALUE)
            credential.chmod(0o600)
            remote_config = root / "remote-wb.yaml"
            remote_config.write_text(_agents_config(server, harness, f"credential_file: {credential}"))
            remote_config.chmod(0o600)
            _commit_probe(make_clone(box.projects_root / "acme" / "widget"))
            machine.env["WB_CONFIG"] = str(factory.write_wb_config("caller", {"box": factory.target(box)}))
            machine.env["WB_SSH_CONFIG"] = str(factory.client_config)
            yield Probed(machine, home, "box", server)
        finally:
            factory.close()


def _lines(text: str) -> dict[str, str]:
    found = {}
    for line in text.replace("\\n", "\n").replace("\\\"", '"').splitlines():
        for key in ("canary", "plant", "loopback", "processes", "environ", "worktree"):
            marker = f"PROBE-1 {key}: "
            if marker in line and key not in found:
                found[key] = line.split(marker, 1)[1]
    return found


def test_a_confined_cli_edits_its_worktree_and_its_command_reaches_nothing_else(confined: Probed) -> None:
    machine, server = confined.caller, confined.server
    to = ("--to", confined.to) if confined.to else ()
    done = machine.wb(
        "agent", "dispatch", *to, "--new-worktree", "w1", "--profile", "probe", "--repo", "acme/widget",
        "--task", "Do the scripted task.",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    ref = done.stdout.split()[0]
    assert ref.startswith(f"{confined.to}:agt-") if confined.to else ref.startswith("agt-"), ref
    waited = machine.wb("agent", "await", ref, "--wait-timeout", "90s", "--json", timeout=120)
    assert waited.returncode == 0, waited.stderr
    result = json.loads(waited.stdout)
    assert result["state"] == "completed" and result["result"] == PROBE_MESSAGE, result
    if confined.to:
        assert result["machine"] == confined.to, result
    assert result["sandbox"] == {"kind": "bwrap", "network": "provider"}
    assert (Path(result["worktree_dir"]) / "probed.txt").read_text() == "x\n"  # it ran in its worktree

    # The tool result the CLI sent back to the model: what its command saw inside.
    posts = [r for r in server.requests if r.method == "POST"]
    told = json.dumps([r.body for r in posts[1:]])
    seen = _lines(told)
    assert seen.get("worktree") == "written", told[:2000]
    # It looked where the canary is (that machine's HOME): run unconfined, it would have read it.
    assert f"{confined.home / PROBE_CANARY_PATH}: No such file or directory" in seen["canary"]
    assert CANARY not in told
    assert not (confined.home / "planted").exists() and seen["plant"] != "written"
    assert seen["loopback"] == "UNREACHABLE"  # the provider's own port, out of the sandbox's network
    assert int(seen["processes"]) < 30  # its own PID namespace (the host runs hundreds)
    assert CREDENTIAL_VALUE not in told  # in no environment of its command
    # The provider still got the real credential, put in outside by the relay.
    assert all(CREDENTIAL_VALUE in json.dumps(dict(r.headers)) for r in posts)
