"""Security rules of docs/security.md on this machine: argv, environment, stored files, output."""

from __future__ import annotations

import json
import os
from pathlib import Path

from conftest import CREDENTIAL_ENV, CREDENTIAL_VALUE, Machine, wait_for

SECRET_TASK = "scenario:hang the-secret-task-words-9f3e"


# This machine runs its workers unconfined (docs/config.md#sandbox): what these tests check is that path.
UNCONFINED = "sandbox:\n  default: \"off\"\n"


def _all_cmdlines() -> list[bytes]:
    lines = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                lines.append(Path(entry.path, "cmdline").read_bytes())
            except OSError:
                continue
    return lines


def test_no_command_line_carries_the_task_or_the_credential_while_a_run_is_live(machine: Machine) -> None:
    machine.clone()
    ref = machine.dispatch(task=SECRET_TASK)
    assert wait_for(lambda: machine.wb_json("agent", "status", ref).get("worker_alive") is True, 20)  # type: ignore[union-attr]
    cmdlines = _all_cmdlines()
    owner = int(machine.wb_json("agent", "status", ref)["owner_pid"])  # type: ignore[call-overload,index]
    assert Path(f"/proc/{owner}/cmdline").read_bytes() in cmdlines  # the owner (a copy of its dispatcher, or not)
    assert any(b"exec\0--json\0--ignore-user-config" in line for line in cmdlines)
    # The dispatching CLI (which had the task in its own argv) has exited; nothing wb started carries it.
    assert not [line for line in cmdlines if b"the-secret-task-words-9f3e" in line]
    assert not [line for line in cmdlines if CREDENTIAL_VALUE.encode() in line]
    machine.wb("agent", "stop", ref)


def test_the_worker_environment_is_the_allowlist_plus_credential_and_codex_home(machine: Machine) -> None:
    machine.write_config(machine.config_path.read_text() + UNCONFINED)  # the unconfined path: the worker holds the key
    machine.clone()
    ref = machine.dispatch(task="scenario:env-dump")
    assert machine.wb("agent", "await", ref).returncode == 0
    env = json.loads((machine.home / "agents" / ref / "harness-home" / "env.json").read_text())
    allowed = {
        "PATH",
        "HOME",
        "TMPDIR",
        "TMP",
        "TEMP",
        "LANG",
        "LC_ALL",
        "LC_CTYPE",
        "TZ",
        "XDG_CONFIG_HOME",
        "XDG_CACHE_HOME",
        "XDG_STATE_HOME",
        "XDG_DATA_HOME",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "NODE_EXTRA_CA_CERTS",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "no_proxy",
        "all_proxy",
        CREDENTIAL_ENV,
        "CODEX_HOME",
    }
    # The interpreter may add a few of its own (e.g. PWD from a shell, LC_CTYPE coercion); wb adds none.
    interpreter = {"PWD", "SHLVL", "_", "LC_CTYPE"}
    assert set(env) - allowed - interpreter == set()
    # The worker had the value; what it left in harness-home is masked when the run ends
    # (docs/runs.md#environment-and-credentials).
    assert env[CREDENTIAL_ENV] == "[redacted]"
    assert env["CODEX_HOME"] == str(machine.home / "agents" / ref / "harness-home")
    assert "WB_HOME" not in env and "WB_CONFIG" not in env and "PYTHONPATH" not in env


def test_the_credential_never_reaches_a_record_a_log_or_any_output(machine: Machine) -> None:
    machine.write_config(machine.config_path.read_text() + UNCONFINED)  # the unconfined path: the worker holds the key
    machine.clone()
    ref = machine.dispatch(task="scenario:echo-credential")
    outputs = [machine.wb("agent", "await", ref)]
    outputs += [
        machine.wb("agent", *args)
        for args in (
            ("status", ref),
            ("status", ref, "--json"),
            ("list",),
            ("list", "--json"),
            ("logs", ref),
            ("logs", ref, "--raw"),
        )
    ]
    for done in outputs:
        assert done.returncode == 0, done.stderr
        assert CREDENTIAL_VALUE not in done.stdout + done.stderr
    run_dir = machine.home / "agents" / ref
    for name in ("run.json", "events.jsonl"):
        assert CREDENTIAL_VALUE.encode() not in (run_dir / name).read_bytes(), name
    assert b"[redacted]" in (run_dir / "events.jsonl").read_bytes()
