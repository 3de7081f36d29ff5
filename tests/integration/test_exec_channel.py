"""`exec` targets (docs/cli.md#exec-targets): any local command that reaches a machine.

Two real exec channels: `env K=V … wb` (a local "machine" with its own WB_HOME, as a
`docker exec -i` would reach one) and `ssh -T` through OpenSSH itself to a loopback sshd
(the user's own ssh, for ControlMaster, `Match exec` or a smartcard agent). Every failure
of the channel is exit 255 and names the machine; a bad entry is exit 2 naming its key.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from conftest import prepare_remote, wait_for

from tests.integration.sshd import SshdFactory, SshdServer, sshd_unavailable_reason
from tests.json_documents import check_output
from tests.tests_support import wb_recording_modules

pytestmark = pytest.mark.skipif(sshd_unavailable_reason() is not None, reason=str(sshd_unavailable_reason()))

WB = str(Path(sys.executable).parent / "wb")
PYTHON_BIN = str(Path(sys.executable).parent)


@dataclass
class Caller:
    env: dict[str, str]
    root: Path
    box: SshdServer
    local_home: Path

    def wb(
        self, *args: str, timeout: float = 120, extra: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "courier.main", *args],
            capture_output=True,
            text=True,
            env={**self.env, **(extra or {})},
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        check_output(args, done)  # every --json output follows its published schema
        return done


def _targets(sshd: SshdFactory, box: SshdServer, root: Path, local_home: Path) -> dict[str, Any]:
    not_executable = root / "not-executable"
    not_executable.write_text("#!/bin/sh\n")
    not_executable.chmod(0o644)
    local_env = [
        "env",
        f"WB_HOME={local_home}",
        f"WB_PROJECTS_ROOT={box.projects_root}",
        f"WB_CONFIG={box.root / 'remote-wb.yaml'}",
        f"PATH={box.bin_dir}:{PYTHON_BIN}:/usr/bin:/bin",
    ]
    openssh = ["ssh", "-F", str(sshd.client_config), "-o", "BatchMode=yes", "-T", "-p", str(box.port)]
    return {
        "box": {"ssh": sshd.target(box)},
        "local": {"exec": {"argv": local_env, "wb_path": WB}},
        "viassh": {"exec": {"argv": [*openssh, f"root@{box.host}"]}},
        "nocommand": {"exec": {"argv": ["wb-test-no-such-command"]}},
        "noexec": {"exec": {"argv": [str(not_executable)]}},
        "nowb": {"exec": {"argv": ["env"], "wb_path": "/nonexistent/bin/wb"}},
        "crash": {"exec": {"argv": ["sh", "-c", 'echo "boom: no such container" >&2; echo second >&2; exit 3', "sh"]}},
        "probe": {"exec": {"argv": ["sh", "-c", 'echo "probe=$WB_EXEC_PROBE" >&2; exit 3', "sh"]}},
        "silent": {"exec": {"argv": ["sh", "-c", "exec sleep 60", "sh"]}},
        "both": {"ssh": sshd.target(box), "exec": {"argv": ["env"]}},
        "noargv": {"exec": {"wb_path": "/opt/wb"}},
        "emptyargv": {"exec": {"argv": []}},
        "numbers": {"exec": {"argv": [1, 2]}},
        "extra": {"exec": {"argv": ["env"], "shell": True}},
    }


@pytest.fixture(scope="module")
def caller(sshd: SshdFactory, tmp_path_factory: pytest.TempPathFactory) -> Caller:
    box = sshd.start("127.0.0.2")
    prepare_remote(box)
    root = tmp_path_factory.mktemp("exec-caller")
    local_home = root / "local-wbhome"
    config = root / "wb.yaml"
    targets = _targets(sshd, box, root, local_home)
    config.write_text(yaml.safe_dump({"session_move": {"targets": targets}}))
    config.chmod(0o600)
    # The same machines but the silent one, which would hold every fan-out to its full bound: its
    # own test bounds it (3 s), the fan-outs below ask the others with room for a loaded machine.
    answering = root / "wb-answering.yaml"
    answering.write_text(
        yaml.safe_dump({"session_move": {"targets": {k: v for k, v in targets.items() if k != "silent"}}})
    )
    answering.chmod(0o600)
    env = {
        "HOME": str(root),
        "PATH": f"{PYTHON_BIN}:/usr/bin:/bin",
        "WB_CONFIG": str(config),
        "WB_HOME": str(root / "wbhome"),
        "WB_PROJECTS_ROOT": str(root / "projects"),
        "WB_SSH_CONFIG": str(sshd.client_config),
        "LANG": "C.UTF-8",
    }
    return Caller(env, root, box, local_home)


def _dispatch(caller: Caller, machine: str, task: str, worktree: str) -> str:
    done = caller.wb(
        "agent", "dispatch", "--to", machine, "--new-worktree", worktree, "--profile", "fake",
        "--repo", "acme/widget", "--task", task,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    ref = done.stdout.split()[0]
    assert done.stdout == f"{ref} running {machine}:{worktree} (mock/gpt-5.5)\n"
    return ref


def test_every_operation_over_a_local_exec_channel(caller: Caller) -> None:
    ref = _dispatch(caller, "local", "scenario:complete the-exec-task-text-7e1f", "x1")
    assert ref.startswith("local:agt-")
    waited = caller.wb("agent", "await", ref, "--wait-timeout", "60s", "--json")
    assert waited.returncode == 0, waited.stderr
    assert json.loads(waited.stdout)["state"] == "completed" and json.loads(waited.stdout)["machine"] == "local"
    status = caller.wb("agent", "status", ref)
    assert status.returncode == 0 and status.stdout.startswith(f"agent:    {ref}\nstate:    completed\n")
    logs = caller.wb("agent", "logs", ref)
    assert logs.returncode == 0, logs.stderr
    listed = caller.wb("agent", "list", "--to", "local", "--json")
    assert [row["agent_id"] for row in json.loads(listed.stdout)] == [ref.split(":", 1)[1]]
    # The run lives in the exec machine's own home, not the sshd box's.
    assert (caller.local_home / "agents" / ref.split(":", 1)[1]).is_dir()
    stopped = caller.wb("agent", "stop", ref)  # an in-band refusal keeps its exit code over exec too
    assert stopped.returncode == 1 and stopped.stderr == f"error: local: agent run {ref[6:]} is already completed\n"


def test_ssh_t_through_openssh_itself(caller: Caller) -> None:
    ref = _dispatch(caller, "viassh", "scenario:complete", "v1")
    waited = caller.wb("agent", "await", ref, "--wait-timeout", "60s", "--json")
    assert waited.returncode == 0 and json.loads(waited.stdout)["state"] == "completed", waited.stderr
    # The same machine over wb's own SSH sees the same run (one WB_HOME behind both channels).
    same = caller.wb("agent", "status", f"box:{ref.split(':', 1)[1]}", "--json")
    assert same.returncode == 0 and json.loads(same.stdout)["state"] == "completed"


@pytest.mark.parametrize(
    ("machine", "message"),
    [
        (
            "nocommand",
            'error: machine nocommand: cannot run "wb-test-no-such-command": not found '
            "(session_move.targets.nocommand.exec.argv)\n",
        ),
        ("noexec", "not executable (session_move.targets.noexec.exec.argv)\n"),
        ("nowb", "error: wb was not found on nowb: set session_move.targets.nowb.exec.wb_path\n"),
        ("crash", 'error: machine crash: "sh" exited with status 3 without a reply: boom: no such container\n'),
    ],
)
def test_each_exec_failure_is_exit_255_naming_the_machine(caller: Caller, machine: str, message: str) -> None:
    done = caller.wb("agent", "list", "--to", machine)
    assert done.returncode == 255 and done.stdout == ""
    assert done.stderr.endswith(message) and done.stderr.count("\n") == 1, done.stderr


def test_the_exec_child_gets_the_callers_environment(caller: Caller) -> None:
    # Twice, with another value: with the courier running, each call's child still gets its caller's.
    for value in ("first-caller", "second-caller"):
        done = caller.wb("agent", "list", "--to", "probe", extra={"WB_EXEC_PROBE": value, "WB_COURIER": "on"})
        assert done.returncode == 255
        assert done.stderr == f'error: machine probe: "sh" exited with status 3 without a reply: probe={value}\n'
    caller.wb("courier", "stop", extra={"WB_COURIER": "on"})


def test_an_exec_machine_that_never_answers_is_bounded(caller: Caller) -> None:
    done = caller.wb("machines", "--check", "--json", "--machine-timeout", "3s")
    rows = {row["machine"]: row for row in json.loads(done.stdout)}
    assert rows["silent"]["ok"] is False
    assert rows["silent"]["error"].startswith('timeout: silent (exec "sh") did not answer the version request within ')
    assert not [p for p in psutil.process_iter(["cmdline"]) if "exec sleep 60" in " ".join(p.info["cmdline"] or [])]


@pytest.mark.parametrize(
    ("machine", "key"),
    [
        ("both", "session_move.targets.both: has both ssh and exec"),
        ("noargv", "session_move.targets.noargv.exec.argv: Field required"),
        ("emptyargv", "session_move.targets.emptyargv.exec.argv: must be a non-empty list of strings"),
        ("numbers", "session_move.targets.numbers.exec.argv.0: must be a YAML string"),
        ("extra", "session_move.targets.extra.exec.shell: unknown key"),
    ],
)
def test_a_bad_exec_entry_is_refused_naming_its_key(caller: Caller, machine: str, key: str) -> None:
    done = caller.wb("agent", "list", "--to", machine)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error: ") and key in done.stderr, done.stderr
    assert caller.wb("agent", "list", "--to", "local").returncode == 0  # the other machines keep working


def test_machines_shows_each_channel(caller: Caller) -> None:
    done = caller.wb("machines")
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["MACHINE", "CHANNEL", "HOST", "USER", "PORT", "WB_PATH", "OK", "ERROR"]
    box = next(line for line in lines if line.startswith("box "))
    assert box.split()[:7] == ["box", "ssh", "127.0.0.2", "root", str(caller.box.port), "wb", "yes"]
    local = next(line for line in lines if line.startswith("local "))
    assert local.split()[:2] == ["local", "exec"] and f"{WB} yes" in " ".join(local.split())
    assert shlex.join(["env", f"WB_HOME={caller.local_home}"])[:20] in local
    rows = {row["machine"]: row for row in json.loads(caller.wb("machines", "--json").stdout)}
    assert rows["box"]["channel"] == "ssh" and "argv" not in rows["box"] and rows["box"]["host"] == "127.0.0.2"
    assert rows["local"]["channel"] == "exec" and rows["local"]["argv"][0] == "env"
    assert not {"host", "user", "port"} & set(rows["local"])
    assert rows["both"]["channel"] is None and rows["extra"]["channel"] == "exec" and rows["extra"]["ok"] is False


def _without_the_silent_machine(caller: Caller) -> dict[str, str]:
    return {"WB_CONFIG": str(caller.root / "wb-answering.yaml")}


def test_machines_check_probes_ssh_and_exec_alike(caller: Caller) -> None:
    quick = _without_the_silent_machine(caller)
    done = caller.wb("machines", "--check", "--json", "--machine-timeout", "20s", extra=quick)
    rows = {row["machine"]: row for row in json.loads(done.stdout)}
    for name in ("box", "local", "viassh"):
        assert rows[name]["ok"] is True, rows[name]
        assert rows[name]["schema_version"] == 1 and "codex" in rows[name]["harnesses"]
    assert rows["nowb"]["error"].startswith("wb missing: wb was not found on nowb")
    text = caller.wb("machines", "--check", "--machine-timeout", "20s", extra=quick).stdout
    assert next(line for line in text.splitlines() if line.startswith("viassh ")).split()[1] == "exec"


def test_list_all_mixes_ssh_and_exec_machines(caller: Caller) -> None:
    _dispatch(caller, "local", "scenario:complete", "x2")
    done = caller.wb(
        "agent", "list", "--all", "--json", "--machine-timeout", "20s", extra=_without_the_silent_machine(caller)
    )
    document = json.loads(done.stdout)
    rows = {row["machine"]: row for row in document["machines"]}
    assert rows["box"]["ok"] and rows["local"]["ok"] and rows["viassh"]["ok"], rows
    assert rows["local"]["runs"] >= 1 and rows["box"]["runs"] == rows["viassh"]["runs"]
    assert {r["machine"] for r in document["results"]} >= {"local"}
    assert rows["crash"]["error"].startswith('machine crash: "sh" exited with status 3')
    assert done.returncode == 1  # the broken machines are named, the healthy ones answered


def _serve_processes(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            # `env` replaced itself with wb: the machine's WB_HOME is in the environment, not the argv.
            if "--wb-internal-agent-serve" in (proc.info["cmdline"] or []) and proc.environ().get("WB_HOME") == marker:
                found.append(proc)
    return found


@pytest.mark.courier_independent  # it sets WB_COURIER=on itself: one courier pass runs it
def test_the_courier_keeps_one_serve_process_per_exec_machine(caller: Caller) -> None:
    """The courier (started here whichever pass runs the suite) keeps one serve process per exec machine."""
    marker = str(caller.local_home)
    env = {**caller.env, "WB_COURIER": "on"}
    courier = Caller(env, caller.root, caller.box, caller.local_home)
    try:
        assert courier.wb("agent", "list", "--to", "local").returncode == 0

        def row() -> dict[str, Any]:
            status = json.loads(courier.wb("courier", "status", "--json").stdout)
            return next((r for r in status.get("machines") or [] if r["machine"] == "local"), {})

        assert wait_for(lambda: row().get("mode") == "serve", 30)
        assert row()["channel"] == "exec" and row()["argv"][0] == "env"
        assert wait_for(lambda: len(_serve_processes(marker)) == 1, 15)
        serving = _serve_processes(marker)[0]
        for _ in range(3):
            assert courier.wb("agent", "list", "--to", "local", "--json").returncode == 0
        assert _serve_processes(marker) == [serving]  # the calls went to the one serve process
        assert int(row()["calls"]) >= 4
    finally:
        courier.wb("courier", "stop")
    assert wait_for(lambda: not _serve_processes(marker), 15)


def test_a_fan_out_over_exec_machines_only_never_imports_asyncssh(caller: Caller) -> None:
    """`list --all` over exec machines alone: no SSH connection is possible, so asyncssh is never imported.

    (Its import alone runs ctypes' search for liboqs, gcc and ld included: ~1 s of CPU under load.)"""
    targets = yaml.safe_load(Path(caller.env["WB_CONFIG"]).read_text())["session_move"]["targets"]
    config = caller.root / "exec-only.yaml"
    config.write_text(yaml.safe_dump({"session_move": {"targets": {"local": targets["local"]}}}))
    config.chmod(0o600)
    record = caller.root / "fan-out-modules.txt"
    program = wb_recording_modules(record, ["agent", "list", "--all", "--json"])
    done = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        env={**caller.env, "WB_CONFIG": str(config), "WB_COURIER": "off"},
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    assert [row["machine"] for row in json.loads(done.stdout)["machines"]] == ["", "local"]  # this machine, then local
    modules = {name.split(".")[0] for name in record.read_text().split()}
    assert "courier" in modules and "asyncssh" not in modules
