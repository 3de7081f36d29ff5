"""Confined runs with the real bubblewrap and real git (docs/security.md#confined-runs).

A `command` harness probe runs inside wb's sandbox: it edits its worktree and uses git there,
then tries what a confined worker must not do (the real home's canary, another run's record,
a loopback port other than its relay, the owner's process, the machine's /tmp) and writes what
it saw into its worktree, where the test reads it. Without bubblewrap (hidden from PATH),
`auto` runs unconfined and says why, and `required` is refused as docs/config.md#sandbox says.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Machine, wait_for

from courier.runs.bwrap_probe import probe

pytestmark = pytest.mark.skipif(not probe().usable, reason=f"bubblewrap is not usable here: {probe().reason}")

CANARY = "wb-canary-5f1e0c"

CONFIG = """\
agents:
  profiles:
    probe: {{harness: command, command: [{script}]}}
    quick: {{harness: command, command: [/bin/true]}}
    unconfined: {{harness: command, command: [{script}], sandbox: off}}
    strict: {{harness: command, command: [{script}], sandbox: required}}
    shared: {{harness: command, command: [{script}], network: true}}
{extra}"""

# Each line of probe.txt is one check: NAME ok|refused DETAIL.
PROBE = """\
#!{python}
import json, os, socket, subprocess, sys

out = []
def check(name, fn):
    try:
        detail = fn()
        out.append(f"{{name}} ok {{detail}}")
    except Exception as exc:
        out.append(f"{{name}} refused {{type(exc).__name__}}")

def edit():
    with open("edited.txt", "w") as f:
        f.write("edited inside\\n")
    with open("README.md", "a") as f:
        f.write("more\\n")
    return "written"

def git(*args):
    done = subprocess.run(["git", *args], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(done.stderr)
    return done.stdout.replace("\\n", "|")

def read(path):
    with open(path) as f:
        return f.read(200).strip()

def write(path):
    with open(path, "w") as f:
        f.write("x")
    return "written"

def connect(port):
    socket.create_connection(("127.0.0.1", port), timeout=2).close()
    return "connected"

def unix(path):
    client = socket.socket(socket.AF_UNIX)
    client.settimeout(2)
    client.connect(path)
    client.close()
    return "connected"

def processes():
    seen = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                seen.append(read(f"/proc/{{pid}}/cmdline").replace("\\0", " "))
            except OSError:
                pass
    return json.dumps(seen)

task = sys.stdin.read()
targets = json.loads(task)
check("edit", edit)
check("git-status", lambda: git("status", "--short"))
check("git-diff", lambda: git("diff", "--stat"))
check("git-add", lambda: git("add", "edited.txt"))
check("git-stash", lambda: git("stash") + git("stash", "list") + git("stash", "pop"))
check("git-branch-move", lambda: git("branch", "-f", "main", "HEAD"))
check("home-canary-read", lambda: read(targets["canary"]))
check("home-canary-write", lambda: write(os.path.join(os.path.dirname(targets["canary"]), "planted")))
check("other-record", lambda: read(targets["record"]))
check("tmp-write", lambda: write(targets["tmp"]))
check("tmpdir-write", lambda: write(os.path.join(os.environ["TMPDIR"], "mine")))
check("loopback", lambda: connect(targets["port"]))
check("writable-extra", lambda: write(targets["extra"]) if targets.get("extra") else "none")
check("processes", processes)
for name in ("unix-run", "unix-tmp-dir", "unix-tmp"):
    if targets.get(name):
        check(name, lambda: unix(targets[name]))
def undo():  # what root's capabilities would allow: uncover the home, or make / writable
    for argv in (["umount", os.path.dirname(os.path.dirname(targets["canary"]))], ["mount", "-o", "remount,rw", "/"]):
        subprocess.run(argv, capture_output=True)
    return read(targets["canary"])
if targets.get("escape"):  # only ever asked of a confined probe: unconfined, these would act on the machine
    check("undo-the-sandbox", undo)
    check("usr-write", lambda: write("/usr/wb-confined-probe"))
with open("probe.txt", "w") as f:
    f.write("\\n".join(out) + "\\n")
print(json.dumps({{"type": "wb.result", "message": "probed"}}))
"""


def _checks(worktree: Path) -> dict[str, tuple[str, str]]:
    found = {}
    for line in (worktree / "probe.txt").read_text().splitlines():
        name, verdict, detail = [*line.split(" ", 2), ""][:3]
        found[name] = (verdict, detail)
    return found


@pytest.fixture
def unix_listeners() -> Iterator[dict[str, str]]:
    """Real Unix sockets where the machine's services keep theirs: in /run (docker's, dbus's), in a directory
    of /tmp (an ssh agent's, X11's, tmux's) and in /tmp itself. A network namespace does not stop them."""
    tag = f"wb-confined-{os.getpid()}"
    folder = Path("/tmp") / f"{tag}-sockets"
    folder.mkdir()
    paths = {"unix-run": f"/run/{tag}.sock", "unix-tmp-dir": str(folder / "agent.sock"), "unix-tmp": f"/tmp/{tag}.sock"}
    servers = []
    try:
        for path in paths.values():
            server = socket.socket(socket.AF_UNIX)
            server.bind(path)
            server.listen(8)
            servers.append(server)
        yield paths
    finally:
        for server in servers:
            server.close()
        for path in paths.values():
            Path(path).unlink(missing_ok=True)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def listener() -> Iterator[int]:
    """A real listening socket on the machine's loopback: what a confined worker must not reach."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


def _setup(machine: Machine, extra: str = "") -> Path:
    script = machine.root / "probe.py"
    script.write_text(PROBE.format(python=os.path.realpath(sys.executable)))
    script.chmod(0o700)
    machine.write_config(CONFIG.format(script=script, extra=extra))
    machine.clone()
    ssh = Path(machine.env["HOME"]) / ".ssh"
    ssh.mkdir(mode=0o700)
    (ssh / "id_canary").write_text(CANARY)
    return script


def _run(machine: Machine, profile: str, task: dict[str, object], worktree: str = "w1") -> dict[str, object]:
    done = machine.wb(
        "agent", "dispatch", "--new-worktree", worktree, "--profile", profile, "--repo", "acme/widget",
        "--task", json.dumps(task), "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    ref = json.loads(done.stdout)["agent_id"]
    final = machine.wb_json("agent", "await", ref, "--wait-timeout", "60s")
    assert isinstance(final, dict)
    return final


def _targets(machine: Machine, port: int, record: str) -> dict[str, object]:
    return {
        "canary": str(Path(machine.env["HOME"]) / ".ssh" / "id_canary"),
        "record": record,
        "tmp": f"/tmp/wb-confined-{os.getpid()}",
        "port": port,
    }


def test_a_confined_command_edits_its_worktree_and_reaches_nothing_else(
    machine: Machine, listener: int, unix_listeners: dict[str, str]
) -> None:
    _setup(machine)
    first = _run(machine, "quick", {}, worktree="w0")
    other_record = str(machine.home / "agents" / str(first["agent_id"]) / "run.json")
    assert Path(other_record).exists()
    final = _run(machine, "probe", {**_targets(machine, listener, other_record), **unix_listeners, "escape": True})
    assert final["state"] == "completed", final
    assert final["sandbox"] == {"kind": "bwrap", "network": "provider"}
    worktree = Path(str(final["worktree_dir"]))
    checks = _checks(worktree)
    # the worktree and git there
    assert checks["edit"][0] == "ok" and (worktree / "edited.txt").read_text() == "edited inside\n"
    assert checks["git-status"][0] == "ok" and "README.md" in checks["git-status"][1]
    assert checks["git-diff"][0] == "ok" and "README.md" in checks["git-diff"][1]
    assert checks["git-add"][0] == "ok", checks["git-add"]
    assert checks["git-stash"] == ("ok", checks["git-stash"][1]) and "stash@{0}" in checks["git-stash"][1]
    assert (worktree / "edited.txt").exists()  # the stash was popped back
    assert "edited.txt" in subprocess.run(
        ["git", "diff", "--cached", "--name-only"], cwd=worktree, capture_output=True, text=True, check=True
    ).stdout
    # ... and nothing else
    assert checks["git-branch-move"][0] == "refused"
    assert checks["home-canary-read"][0] == "refused"
    assert checks["home-canary-write"][0] == "refused"
    assert not (Path(machine.env["HOME"]) / ".ssh" / "planted").exists()
    assert checks["other-record"][0] == "refused"
    assert checks["tmp-write"][0] == "refused" and not Path(f"/tmp/wb-confined-{os.getpid()}").exists()
    assert checks["tmpdir-write"][0] == "ok"
    assert checks["loopback"][0] == "refused"
    assert [checks[name][0] for name in unix_listeners] == ["refused"] * 3, checks
    assert checks["writable-extra"] == ("ok", "none")
    assert checks["undo-the-sandbox"][0] == "refused"  # as root too: the inherited mounts are locked
    assert checks["usr-write"][0] == "refused" and not Path("/usr/wb-confined-probe").exists()
    seen = json.loads(checks["processes"][1])
    assert seen and not any("--wb-internal-agent-run" in command for command in seen), seen
    assert CANARY not in (machine.home / "agents" / str(final["agent_id"]) / "events.jsonl").read_text()


def test_writable_paths_and_the_machines_network_are_given_as_a_user_would(
    machine: Machine, listener: int, tmp_path: Path
) -> None:
    extra = tmp_path / "cache"
    extra.mkdir()
    _setup(machine, extra=f"sandbox:\n  writable: [{extra}]\n")
    task = {**_targets(machine, listener, "/nonexistent"), "extra": str(extra / "written")}
    final = _run(machine, "shared", task)
    assert final["sandbox"] == {"kind": "bwrap", "network": "all"}
    checks = _checks(Path(str(final["worktree_dir"])))
    assert checks["writable-extra"][0] == "ok" and (extra / "written").read_text() == "x"
    assert checks["loopback"] == ("ok", "connected")
    assert checks["home-canary-read"][0] == "refused"


def test_sandbox_off_in_a_profile_runs_unconfined_and_says_so(
    machine: Machine, listener: int, unix_listeners: dict[str, str]
) -> None:
    _setup(machine)
    final = _run(machine, "unconfined", {**_targets(machine, listener, "/nonexistent"), **unix_listeners})
    assert final["sandbox"] == {"kind": "none", "reason": "off in profile unconfined"}
    checks = _checks(Path(str(final["worktree_dir"])))
    assert checks["home-canary-read"] == ("ok", CANARY)
    assert [checks[name] for name in unix_listeners] == [("ok", "connected")] * 3  # what confinement takes away
    text = machine.wb("agent", "status", str(final["agent_id"])).stdout
    assert "sandbox:  none (off in profile unconfined)\n" in text


def _without_bwrap(machine: Machine, tmp_path: Path) -> None:
    """PATH as the machine's, minus every directory that holds bwrap (the tools the run needs linked back)."""
    bin_dir = tmp_path / "nobwrap"
    bin_dir.mkdir()
    for tool in ("git", "sh", "env", "true", "cat"):
        found = shutil.which(tool)
        assert found
        (bin_dir / tool).symlink_to(found)
    dirs = [d for d in machine.env["PATH"].split(":") if not (Path(d) / "bwrap").exists()]
    machine.env["PATH"] = ":".join([*dirs, str(bin_dir)])


def test_without_bubblewrap_auto_runs_unconfined_and_required_is_refused(
    machine: Machine, listener: int, tmp_path: Path
) -> None:
    _setup(machine)
    _without_bwrap(machine, tmp_path)
    final = _run(machine, "probe", _targets(machine, listener, "/nonexistent"))
    assert final["state"] == "completed", final
    assert final["sandbox"] == {"kind": "none", "reason": "bubblewrap not found"}
    assert "sandbox:  none (bubblewrap not found)\n" in machine.wb("agent", "status", str(final["agent_id"])).stdout
    refused = machine.wb(
        "agent", "dispatch", "--new-worktree", "w9", "--profile", "strict", "--repo", "acme/widget", "--task", "{}"
    )  # fmt: skip
    assert refused.returncode == 1
    assert refused.stderr == (
        f"error: sandbox required but bubblewrap is not usable on {socket.gethostname()}: bubblewrap not found "
        "(install bubblewrap, or set sandbox: auto)\n"
    )
    assert not (machine.projects / ".worktrees" / "acme" / "widget" / "w9").exists()
    assert wait_for(lambda: True)


def test_the_status_text_shows_the_sandbox_after_resolved(machine: Machine, listener: int) -> None:
    _setup(machine)
    final = _run(machine, "quick", {})
    lines = machine.wb("agent", "status", str(final["agent_id"])).stdout.splitlines()
    labels = [line.split(":", 1)[0] for line in lines]
    assert "sandbox:  bwrap (network: provider only)" in lines
    assert labels.index("sandbox") == labels.index("resolved") + 1


# A stand-in `codex` on PATH: it reads the provider's base_url and credential variable from the
# command line wb gives Codex, talks to its relay with and without the placeholder, and looks for
# the real credential in its environment and in every file it can write or its home holds.
PROVIDER_PROBE = """\
#!{python}
import json, os, re, socket, sys, urllib.error, urllib.request

args = " ".join(sys.argv)
base_url = re.search(r'base_url="([^"]+)"', args).group(1)
env_key = re.search(r'env_key="([^"]+)"', args).group(1)
secret = {secret!r}
out = {{"placeholder": os.environ.get(env_key, "")}}
out["environ_has_secret"] = secret.encode() in open("/proc/self/environ", "rb").read()
found = []
for top in (os.getcwd(), os.environ.get("HOME", "/"), os.environ["TMPDIR"], os.environ.get("CODEX_HOME", "/")):
    for folder, _, files in os.walk(top):
        for name in files:
            try:
                with open(os.path.join(folder, name), "rb") as f:
                    if secret.encode() in f.read(1 << 20):
                        found.append(os.path.join(folder, name))
            except OSError:
                pass
out["files_with_secret"] = found

def post(token):
    headers = {{"content-type": "application/json"}}
    if token:
        headers["authorization"] = "Bearer " + token
    body = json.dumps({{"model": "m", "input": [], "stream": True}}).encode()
    request = urllib.request.Request(base_url + "/responses", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=20) as answer:
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError as exc:
        return type(exc).__name__

out["with_placeholder"] = post(out["placeholder"])
out["without_placeholder"] = post("")
out["with_wrong_placeholder"] = post("wb-run-" + "0" * 32)
try:
    socket.create_connection(("127.0.0.1", {provider_port}), timeout=2).close()
    out["provider_port"] = "connected"
except OSError as exc:
    out["provider_port"] = type(exc).__name__
with open("provider-probe.json", "w") as f:
    json.dump(out, f)
"""

PROVIDER_CONFIG = """\
agents:
  providers:
    mock:
      base_url: {base_url}
      credential_env: {credential_env}
  profiles:
    relayed: {{harness: codex, provider: mock, model: gpt-5.5}}
"""


def test_a_confined_worker_holds_a_placeholder_and_reaches_only_its_relay(machine: Machine, tmp_path: Path) -> None:
    from conftest import CREDENTIAL_ENV, CREDENTIAL_VALUE

    from courier.demo.model_server import ModelServer

    with ModelServer("endless") as server:
        port = int(server.base_url.split(":")[2].split("/")[0])
        bin_dir = tmp_path / "probe-bin"
        bin_dir.mkdir()
        codex = bin_dir / "codex"
        codex.write_text(
            PROVIDER_PROBE.format(python=os.path.realpath(sys.executable), secret=CREDENTIAL_VALUE, provider_port=port)
        )
        codex.chmod(0o700)
        machine.env["PATH"] = f"{bin_dir}:{machine.env['PATH']}"
        machine.write_config(PROVIDER_CONFIG.format(base_url=server.base_url, credential_env=CREDENTIAL_ENV))
        machine.clone()
        final = _run(machine, "relayed", {})
        assert final["sandbox"] == {"kind": "bwrap", "network": "provider"}
        seen = json.loads((Path(str(final["worktree_dir"])) / "provider-probe.json").read_text())
        assert re.fullmatch(r"wb-run-[0-9a-f]{32}", seen["placeholder"]), seen
        assert seen["environ_has_secret"] is False and seen["files_with_secret"] == []
        assert seen["with_placeholder"] == 200
        assert seen["without_placeholder"] == 403 and seen["with_wrong_placeholder"] == 403
        assert seen["provider_port"] == "ConnectionRefusedError"  # the provider itself is out of reach
        assert len([r for r in server.requests if r.method == "POST"]) == 1  # the refused ones never reached it
        assert server.requests[-1].headers["authorization"] == f"Bearer {CREDENTIAL_VALUE}"  # swapped outside


REMOTE_CONFIG = """\
agents:
  profiles:
    probe: {{harness: command, command: [{script}]}}
"""


@pytest.mark.parametrize("channel", ["ssh", "exec"])
def test_a_run_on_an_ssh_or_exec_machine_is_confined_there(tmp_path: Path, channel: str) -> None:
    """The owner confines the worker on the machine that runs it, whatever reached that machine."""
    from conftest import make_clone

    from tests.integration.exec_machines import ExecEnvFactory
    from tests.integration.sshd import SshdFactory, sshd_unavailable_reason

    if channel == "ssh" and sshd_unavailable_reason() is not None:
        pytest.skip(str(sshd_unavailable_reason()))
    sshd = SshdFactory(tmp_path / "sshd") if channel == "ssh" else ExecEnvFactory(tmp_path / "exec")
    try:
        box = sshd.start("127.0.0.5")
        make_clone(box.projects_root / "acme" / "widget")
        script = box.root / "probe.py"
        script.write_text(PROBE.format(python=os.path.realpath(sys.executable)))
        script.chmod(0o700)
        config = box.root / "remote-wb.yaml"
        config.write_text(REMOTE_CONFIG.format(script=script))
        config.chmod(0o600)
        box.wb_home.mkdir(parents=True, exist_ok=True)
        (box.wb_home / "canary").write_text(CANARY)
        caller = Machine(
            root=tmp_path,
            env={
                "HOME": str(tmp_path),
                "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
                "WB_CONFIG": str(sshd.write_wb_config("caller-confined", {"box": sshd.target(box)})),
                "WB_HOME": str(tmp_path / "wbhome"),
                "WB_SSH_CONFIG": str(sshd.client_config),
                "LANG": "C.UTF-8",
            },
        )
        task = {"canary": str(box.wb_home / "canary"), "record": "/nonexistent", "tmp": "/tmp/wb-x", "port": 9}
        done = caller.wb(
            "agent", "dispatch", "--to", "box", "--new-worktree", "w1", "--profile", "probe", "--repo", "acme/widget",
            "--task", json.dumps(task), "--json",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        final = caller.wb_json("agent", "await", json.loads(done.stdout)["agent_id"], "--to", "box")
        assert isinstance(final, dict) and final["machine"] == "box" and final["state"] == "completed", final
        assert final["sandbox"] == {"kind": "bwrap", "network": "provider"}
        checks = _checks(Path(str(final["worktree_dir"])))
        assert checks["edit"][0] == "ok" and checks["git-add"][0] == "ok"
        assert checks["home-canary-read"][0] == "refused"
    finally:
        sshd.close()


NETWORK_PROBE = """\
#!{python}
import json, urllib.error, urllib.request
out = {{}}
for name, url in (("allowed", "http://127.0.0.2:{port}/hello"), ("other", "http://127.0.0.3:{port}/hello")):
    try:
        with urllib.request.urlopen(url, timeout=20) as answer:
            out[name] = [answer.status, answer.read().decode()]
    except urllib.error.HTTPError as exc:
        out[name] = [exc.code, ""]
    except OSError as exc:
        out[name] = [type(exc).__name__, ""]
with open("network-probe.json", "w") as f:
    json.dump(out, f)
"""


@pytest.fixture
def two_servers() -> Iterator[int]:
    """The same small HTTP server on 127.0.0.2 and 127.0.0.3 (one port): one host allowed, one not."""
    import http.server
    import threading

    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-length", "5")
            self.end_headers()
            self.wfile.write(b"hello")

        def log_message(self, format: str, *args: object) -> None:
            pass

    first = http.server.ThreadingHTTPServer(("127.0.0.2", 0), Hello)
    port = first.server_address[1]
    second = http.server.ThreadingHTTPServer(("127.0.0.3", port), Hello)
    for server in (first, second):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield port
    finally:
        for server in (first, second):
            server.shutdown()
            server.server_close()


def test_network_hosts_pass_through_the_owners_proxy_and_others_are_refused(
    machine: Machine, two_servers: int
) -> None:
    script = machine.root / "net.py"
    script.write_text(NETWORK_PROBE.format(python=os.path.realpath(sys.executable), port=two_servers))
    script.chmod(0o700)
    machine.write_config(
        "agents:\n  profiles:\n"
        f"    net: {{harness: command, command: [{script}], network: ['127.0.0.2:{two_servers}']}}\n"
    )
    machine.clone()
    final = _run(machine, "net", {})
    assert final["state"] == "completed", final
    assert final["sandbox"] == {"kind": "bwrap", "network": [f"127.0.0.2:{two_servers}"]}
    seen = json.loads((Path(str(final["worktree_dir"])) / "network-probe.json").read_text())
    assert seen == {"allowed": [200, "hello"], "other": [403, ""]}
    logs = machine.wb("agent", "logs", str(final["agent_id"])).stdout
    assert "network refused: 127.0.0.3" in logs
    status = machine.wb("agent", "status", str(final["agent_id"])).stdout
    assert f"sandbox:  bwrap (network: 127.0.0.2:{two_servers})\n" in status


# A worker that ignores SIGTERM and leaves a grandchild in a session of its own, with a marker on its command line.
STUBBORN = """\
#!/bin/sh
trap '' TERM
setsid sh -c 'sleep 300' {marker} &
sh -c "trap '' TERM; sleep 300" {marker}
"""


def _host_processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker.encode() in Path("/proc", entry, "cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                pass
    return found


@pytest.mark.parametrize("ending", ["timeout", "stop"])
def test_a_confined_worker_and_all_it_started_end_on_timeout_and_stop(machine: Machine, ending: str) -> None:
    marker = f"wb-stubborn-{ending}-{os.getpid()}"
    script = machine.root / "stubborn.sh"
    script.write_text(STUBBORN.format(marker=marker))
    script.chmod(0o700)
    machine.write_config(f"agents:\n  profiles:\n    stubborn: {{harness: command, command: [{script}]}}\n")
    machine.clone()
    timeout = ["--timeout", "2s"] if ending == "timeout" else []
    done = machine.wb(
        "agent", "dispatch", "--new-worktree", "w1", "--profile", "stubborn", "--repo", "acme/widget", "--task", "x",
        *timeout, "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    ref = json.loads(done.stdout)["agent_id"]
    assert wait_for(lambda: len(_host_processes_with(marker)) >= 2, 20)  # the worker and its grandchild run
    if ending == "stop":
        stopped = machine.wb("agent", "stop", ref)
        assert stopped.returncode == 0 and "worker process" in stopped.stdout, stopped.stderr
    final = machine.wb_json("agent", "await", ref, "--wait-timeout", "60s")
    assert isinstance(final, dict) and final["sandbox"] == {"kind": "bwrap", "network": "provider"}
    if ending == "timeout":
        assert final["state"] == "timeout" and final["failure"] == "timed out after 2s", final
    else:
        assert final["state"] == "failed" and str(final["failure"]).startswith("stopped on request at "), final
    assert wait_for(lambda: not _host_processes_with(marker), 5), _host_processes_with(marker)
