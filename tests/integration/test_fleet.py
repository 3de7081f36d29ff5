"""The fleet view (docs/cli.md, wb agent list) against a loopback fleet of machines, some of them broken,
over every tier of tests/ssh_tiers.py (two SSH, two exec, the in-process channel).

The broken machines are the same in every tier (one down, one that never answers, one with a
changed host key, one misconfigured); what each failure says comes from the channel (`CAUSES`):
over exec, wb checks no host key and relays the exec command's own complaint. A machine with
a host key exists only where the channel has host keys (not `exec-env` nor the in-process
channel). Over the in-process channel, which runs no command, the machine that is down is one
whose home is gone and the one that never answers holds its answer in the receiver
(tests/integration/inprocess_channel_cli.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests_support import sample_record

from courier.runs.store import Store
from tests.integration.inprocess_channel_cli import InProcessChannelFactory
from tests.integration.inprocess_sshd import keygen
from tests.json_documents import check_output
from tests.ssh_tiers import (
    INPROCESS_CHANNEL,
    SSH_TIERS,
    SshMachine,
    SshMachines,
    channel_tiers,
    make_machines,
    wb_command,
    wb_environment,
)

HEALTHY = 8
MACHINE_TIMEOUT_S = 6
# Over exec each of the fleet's receivers is a process started at the same moment on this machine
# (no SSH handshake spreads them out): on a loaded 2-core runner 8 of them need longer than 6 s.
EXEC_MACHINE_TIMEOUT_S = 12

# The fan-out is the caller's own, the same code warm and cold: each exec tier runs in one
# courier pass only (tests/ssh_tiers.py, "Time"), exec-env cold and exec-ssh warm; the in-process
# channel (cold whatever the pass) in the on pass, which is the shorter one.
ssh_tier = channel_tiers(warm=("exec-ssh", INPROCESS_CHANNEL), cold=("exec-env",))

# What each broken machine's row says, per tier: (`list --all` error contains, `machines --check` error starts with).
_SSH_CAUSES = {
    "down": ("connection refused", ("refused", "unreachable")),
    "slow": ("did not answer", ("timeout",)),
    "rekeyed": ("host key", ("changed host key",)),
    "typo": ("session_move.targets.typo.ssh.host", ("",)),
}
CAUSES = {
    "inprocess": _SSH_CAUSES,
    "openssh": _SSH_CAUSES,
    "exec-env": {  # a machine that is gone: `env -C` cannot enter its home, as docker cannot enter a stopped container
        "down": ('"env" exited with status 125 without a reply: env: cannot change directory', ("remote crashed",)),
        "slow": _SSH_CAUSES["slow"],
        "typo": _SSH_CAUSES["typo"],
    },
    # The exec-env machines, each reached in the caller's process: the exit rules are exec's, and a
    # machine that is gone answers as the `env -C` of its argv (tests/integration/inprocess_channel_cli.py).
    INPROCESS_CHANNEL: {
        "down": ('"env" exited with status 125 without a reply: env: cannot change directory', ("remote crashed",)),
        "slow": _SSH_CAUSES["slow"],
        "typo": _SSH_CAUSES["typo"],
    },
    "exec-ssh": {  # OpenSSH's own refusals, relayed: the first line ssh wrote on stderr
        "down": ('"ssh" exited with status 255 without a reply: ssh: connect to host', ("remote crashed",)),
        "slow": _SSH_CAUSES["slow"],
        "rekeyed": ('"ssh" exited with status 255 without a reply', ("remote crashed",)),
        "typo": _SSH_CAUSES["typo"],
    },
}


def record_runs(home: Path, count: int, started: str) -> list[str]:
    store = Store(home).ensure()
    ids = []
    for _ in range(count):
        record = sample_record(state="completed", started_at=started, finished_at=started)
        store.create(record, "task")
        ids.append(record.agent_id)
    return ids


class Fleet:
    def __init__(self, factory: SshMachines, base: Path, tier: str) -> None:
        self.factory = factory
        self.causes = CAUSES[tier]
        # The in-process channel starts no receiver process, so its fleet answers as fast as an SSH one.
        spawns = factory.channel == "exec" and tier != INPROCESS_CHANNEL
        self.timeout_s = EXEC_MACHINE_TIMEOUT_S if spawns else MACHINE_TIMEOUT_S
        self.command = wb_command(tier)
        self.healthy: dict[str, SshMachine] = {}
        self.runs: dict[str, list[str]] = {}
        for index in range(HEALTHY):
            name = f"node{index}"
            server = factory.start(f"127.0.0.{index + 2}")
            self.healthy[name] = server
            self.runs[name] = record_runs(server.wb_home, 2, f"2026-11-0{index + 1}T10:00:00.000Z")
        self.down = factory.start("127.0.0.20")
        self.down.stop()
        self.slow = factory.start("127.0.0.21")
        targets = {name: factory.target(server) for name, server in self.healthy.items()}
        if factory.host_keys:
            self.changed = factory.start("127.0.0.22")
            keygen(self.changed.root / "other_key")
            # The known_hosts entry now names a key the server does not have: a changed host key.
            lines = factory.known_hosts.read_text().replace(
                self.changed.host_public_key, " ".join((self.changed.root / "other_key.pub").read_text().split()[:2])
            )
            factory.known_hosts.write_text(lines)
            targets["rekeyed"] = factory.target(self.changed)
        targets["down"] = factory.target(self.down)
        targets["slow"] = silent_target(factory, self.slow)
        targets["typo"] = {"host": "-oProxyCommand=x"}
        self.config = factory.write_wb_config("fleet", targets)
        self.home = base / "caller-home"
        self.local_runs = record_runs(self.home, 1, "2026-11-20T10:00:00.000Z")
        self.env = {
            "HOME": str(base),
            "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
            "WB_CONFIG": str(self.config),
            "WB_HOME": str(self.home),
            "WB_SSH_CONFIG": str(factory.client_config),
            "LANG": "C.UTF-8",
            **wb_environment(tier),
        }

    def wb(self, *args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [*self.command, *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        check_output(args, done)  # every --json output follows its published schema
        return done


def silent_target(factory: SshMachines, server: SshMachine) -> dict[str, object]:
    """A machine that takes the request and never answers: its wb_path reads it and sleeps, or, over
    the in-process channel (which runs no wb_path), its receiver holds the answer."""
    if isinstance(factory, InProcessChannelFactory):
        return factory.silent_target(server)  # type: ignore[arg-type]
    sleeper = server.script("slow-wb", "cat >/dev/null\nexec sleep 60\n")
    return factory.target(server, wb_path=str(sleeper))


@pytest.fixture(scope="module")
def fleet(ssh_tier: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    factory = make_machines(ssh_tier, tmp_path_factory.mktemp("fleet-sshd"))
    try:
        yield Fleet(factory, tmp_path_factory.mktemp("fleet"), ssh_tier)
    finally:
        factory.close()


def test_list_all_answers_with_the_healthy_machines_and_names_each_failure(fleet: Fleet) -> None:
    started = time.monotonic()
    done = fleet.wb("agent", "list", "--all", "--machine-timeout", f"{fleet.timeout_s}s", "--json")
    elapsed = time.monotonic() - started
    assert done.returncode == 1, done.stderr
    assert elapsed < fleet.timeout_s + 5
    document = json.loads(done.stdout)
    refs = [(r.get("machine", ""), r["agent_id"]) for r in document["results"]]
    expected = {("", run) for run in fleet.local_runs} | {
        (name, run) for name, runs in fleet.runs.items() for run in runs
    }
    assert set(refs) == expected
    # Newest first: the local run (Nov 20) leads, then node7 (Nov 8) … node0 (Nov 1).
    assert refs[0] == ("", fleet.local_runs[0]) and refs[1][0] == "node7" and refs[-1][0] == "node0"
    rows = {row["machine"]: row for row in document["machines"]}
    order = [row["machine"] for row in document["machines"]]
    assert order == ["", *sorted(rows.keys() - {""})]
    for name in fleet.healthy:
        assert rows[name]["ok"] is True and rows[name]["runs"] == 2 and rows[name]["error"] is None
    for name, (cause, _) in fleet.causes.items():
        assert rows[name]["ok"] is False and rows[name]["runs"] == 0, name
        assert cause in rows[name]["error"], (name, rows[name]["error"])
    for name in fleet.causes:
        assert f"warning: {name}: " in done.stderr


def test_list_all_text_is_the_combined_list_then_one_warning_per_failed_machine(fleet: Fleet) -> None:
    done = fleet.wb("agent", "list", "--all", "--machine-timeout", f"{fleet.timeout_s + 2}s")
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert len(lines) == 1 + 2 * HEALTHY, done.stdout + done.stderr
    assert lines[0].startswith(fleet.local_runs[0] + "\t") and lines[1].startswith("node7:agt-")
    warned = sorted(line.split(": ")[1] for line in done.stderr.splitlines() if line.startswith("warning: "))
    assert warned == sorted(fleet.causes)


def test_a_machine_sharing_this_wb_home_is_skipped_as_a_duplicate(fleet: Fleet, tmp_path: Path) -> None:
    server = fleet.healthy["node0"]
    env = {**fleet.env, "WB_HOME": str(server.wb_home)}
    config = fleet.factory.write_wb_config("dup", {"self": fleet.factory.target(server)})
    done = subprocess.run(
        [*fleet.command, "agent", "list", "--all", "--json"],
        capture_output=True,
        text=True,
        env={**env, "WB_CONFIG": str(config)},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    check_output(["agent", "list", "--all", "--json"], done)
    document = json.loads(done.stdout)
    row = next(r for r in document["machines"] if r["machine"] == "self")
    assert row == {
        "machine": "self",
        "ok": True,
        "runs": 0,
        "error": None,
        "elapsed_ms": row["elapsed_ms"],
        "skipped": "same WB_HOME as this machine",
    }
    assert len(document["results"]) == 2


def test_machines_check_reports_each_cause_distinctly(fleet: Fleet) -> None:
    done = fleet.wb("machines", "--check", "--json", "--machine-timeout", f"{fleet.timeout_s}s")
    assert done.returncode == 1
    rows = {row["machine"]: row for row in json.loads(done.stdout)}
    for name, server in fleet.healthy.items():
        row = rows[name]
        assert row["ok"] is True and row["wb_version"] and row["schema_version"] == 1, row
        address = fleet.factory.address(server)  # host, port and user; an exec row's argv instead
        assert {key: row.get(key) for key in address} == address, row
        assert row["rtt_ms"] >= 0 and abs(row["clock_offset_ms"]) < 5000
    causes = {name: rows[name]["error"] for name in fleet.causes}
    for name, (_, prefixes) in fleet.causes.items():
        assert causes[name].startswith(prefixes), (name, causes[name])
    assert "session_move.targets.typo.ssh.host" in causes["typo"] and rows["typo"]["host"] is None
    assert len(set(causes.values())) == len(fleet.causes)


def test_machines_without_check_lists_the_configuration(fleet: Fleet) -> None:
    done = fleet.wb("machines")
    assert done.returncode == 1  # the typo row is not healthy
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["MACHINE", "CHANNEL", "HOST", "USER", "PORT", "WB_PATH", "OK", "ERROR"]
    assert any(line.startswith("node0 ") and " yes" in line for line in lines)
    assert any(line.startswith("typo ") and " no " in line for line in lines)


@pytest.mark.parametrize("ssh_tier", SSH_TIERS, indirect=True)
def test_machines_check_shows_the_user_and_port_the_ssh_config_resolves_and_a_loopback_clock_as_ok(
    fleet: Fleet, tmp_path: Path
) -> None:
    """A machine whose user and port come only from the ssh config: the text table (with --check)
    shows those, as the connection uses them; JSON keeps wb.yaml's (unset: null). A loopback
    machine's clock offset is below what one call can tell: `ok` (docs/cli.md, wb machines).
    SSH tiers only: an exec machine has no user or port of its own (its command stands under HOST)."""
    server = fleet.healthy["node0"]
    client = fleet.factory.write_client_config(
        f"resolving-{tmp_path.name}", f"Host {server.host}\n  Port {server.port}\n  User root\n"
    )
    config = fleet.factory.write_wb_config(f"resolving-{tmp_path.name}", {"box": {"host": server.host}})
    env = {**fleet.env, "WB_CONFIG": str(config), "WB_SSH_CONFIG": str(client)}

    def machines(*args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [*fleet.command, "machines", *args], capture_output=True, text=True, env=env, timeout=120
        )
        check_output(("machines", *args), done)
        return done

    text = machines("--check", "--machine-timeout", f"{fleet.timeout_s}s")
    assert text.returncode == 0, text.stdout + text.stderr
    header, row = (line.split() for line in text.stdout.splitlines()[:2])
    cells = dict(zip(header, row, strict=False))
    assert (cells["HOST"], cells["USER"], cells["PORT"], cells["OK"]) == (server.host, "root", str(server.port), "yes")
    assert cells["CLOCK"] == "ok", text.stdout
    document = json.loads(machines("--check", "--json", "--machine-timeout", f"{fleet.timeout_s}s").stdout)
    assert (document[0]["user"], document[0]["port"]) == (None, None)
    assert isinstance(document[0]["clock_offset_ms"], int)
    plain = machines().stdout.splitlines()[1].split()
    assert plain[3:5] == ["-", "-"]  # without --check no ssh config is read: wb.yaml's values
