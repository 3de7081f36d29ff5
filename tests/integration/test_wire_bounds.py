"""The caller's bounds against hostile or silent peers, through a real loopback sshd (docs/cli.md, wb agent await;
docs/protocol.md#the-callers-rules; docs/cli.md, wb agent list).

Each peer is a fake `wb_path` script on a real OpenSSH sshd: one that floods stdout or
stderr and then keeps the session open, one that never answers an await, one whose
connection drops mid-call, one that answers a list with too many or repeated results,
and a fleet of targets that are all one sshd with OpenSSH's default MaxStartups.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests_support import sample_record

from courier.runs.store import Store
from tests.integration.sshd import SshdFactory, SshdServer, sshd_unavailable_reason
from tests.json_documents import check_output

pytestmark = pytest.mark.skipif(sshd_unavailable_reason() is not None, reason=str(sshd_unavailable_reason()))

RUN_ID = "agt-" + "7c" * 16
# The remote side of a hostile peer stays alive this long; far beyond what any bound here allows.
PEER_HOLDS_S = 40
_names = iter(range(1_000_000))


@dataclass
class Caller:
    """A supervisor's machine whose wb.yaml names one target per test, each a fake peer on `server`."""

    sshd: SshdFactory
    server: SshdServer
    base: Path

    def env(self, config: Path) -> dict[str, str]:
        return {
            "HOME": str(self.base),
            "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
            "WB_CONFIG": str(config),
            "WB_HOME": str(self.base / "wbhome"),
            "WB_SSH_CONFIG": str(self.sshd.client_config),
            "LANG": "C.UTF-8",
        }

    def peer(self, body: str, machine: str = "m1") -> Path:
        """A wb.yaml whose `machine` runs this `#!/bin/sh` body as its wb."""
        script = self.server.script(f"peer{next(_names)}", body)
        target = self.sshd.target(self.server, wb_path=str(script))
        return self.sshd.write_wb_config(f"c{next(_names)}", {machine: target})

    def wb(
        self, config: Path, *args: str, timeout: float = 120, env: dict[str, str] | None = None
    ) -> tuple[subprocess.CompletedProcess[str], float]:
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "courier.main", *args],
            capture_output=True,
            text=True,
            env={**self.env(config), **(env or {})},
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        check_output(args, done)  # every --json output follows its published schema
        return done, time.monotonic() - started


@pytest.fixture(scope="module")
def server(sshd: SshdFactory) -> SshdServer:
    return sshd.start("127.0.0.3")


@pytest.fixture
def caller(sshd: SshdFactory, server: SshdServer, tmp_path: Path) -> Iterator[Caller]:
    yield Caller(sshd, server, tmp_path)


def reply(operation: str, **fields: Any) -> str:
    """A shell-quoted reply document for `printf '%s\\n'`."""
    return shlex.quote(json.dumps({"schema_version": 1, "operation": operation, **fields}))


def running_result() -> dict[str, Any]:
    return sample_record(agent_id=RUN_ID, state="running", started_at="2026-11-30T10:00:00.000Z").to_wire()


# --- 2. the byte caps end the call as soon as they are crossed ------------------------------


@pytest.mark.parametrize(
    ("flood", "message"),
    [
        ("head -c 5000000 /dev/zero | tr '\\0' a", "the reply exceeds 4194304 bytes"),
        ("head -c 100000 /dev/zero | tr '\\0' e >&2", "more than 65536 bytes on stderr"),
    ],
    ids=["stdout", "stderr"],
)
def test_a_peer_that_floods_and_keeps_the_session_open_is_cut_off_at_once(
    caller: Caller, flood: str, message: str
) -> None:
    config = caller.peer(f"cat >/dev/null\n{flood}\nexec sleep {PEER_HOLDS_S}\n")
    done, elapsed = caller.wb(config, "agent", "list", "--to", "m1", timeout=30)
    assert done.returncode == 255, done.stderr
    assert message in done.stderr and "(the channel was closed)" in done.stderr
    assert elapsed < 10, f"the call took {elapsed:.1f}s"


# --- 6. the user's await bound bounds the whole call -------------------------------------------


def test_await_against_a_peer_that_never_answers_ends_at_the_users_bound(caller: Caller) -> None:
    config = caller.peer(f"cat >/dev/null\nexec sleep {PEER_HOLDS_S}\n")
    done, elapsed = caller.wb(config, "agent", "await", f"m1:{RUN_ID}", "--wait-timeout", "3s", timeout=30)
    assert done.returncode == 255, done.stderr
    assert f"error: m1 did not answer the await of m1:{RUN_ID} within the wait bound (3s, plus 5s" in done.stderr
    assert f"await it again with: wb agent await m1:{RUN_ID}" in done.stderr
    assert done.stdout == ""
    assert 3 <= elapsed < 3 + 5 + 6, f"the call took {elapsed:.1f}s"


def test_await_prints_the_last_observation_when_the_peer_falls_silent_at_the_bound(caller: Caller) -> None:
    """A first chunk answers "running"; the next never answers: the bound passes, the last observation is shown."""
    answered = caller.server.root / f"answered{next(_names)}"
    body = (
        "cat >/dev/null\n"
        f"if [ -e {answered} ]; then exec sleep {PEER_HOLDS_S}; fi\n"
        f"touch {answered}\n"
        f"printf '%s\\n' {reply('await', result=running_result())}\n"
    )
    config = caller.peer(body)
    done, elapsed = caller.wb(
        config, "agent", "await", f"m1:{RUN_ID}", "--wait-timeout", "3s", timeout=30, env={"WB_AWAIT_CHUNK_MS": "1000"}
    )
    assert done.returncode == 1, done.stderr
    assert f"agent:    m1:{RUN_ID}" in done.stdout and "state:    running" in done.stdout
    assert f"agent run m1:{RUN_ID} is still running after the wait bound" in done.stderr
    assert elapsed < 3 + 5 + 6, f"the call took {elapsed:.1f}s"


# --- issue 21 item 6: a Result about another run ------------------------------------------------


@pytest.mark.parametrize("command", ["status", "await"])
def test_a_reply_about_another_run_is_refused_as_untrusted(caller: Caller, command: str) -> None:
    other = "agt-" + "d3" * 16
    about_other = {**running_result(), "agent_id": other, "state": "completed", "terminal": True}
    config = caller.peer(f"cat >/dev/null\nprintf '%s\\n' {reply(command, result=about_other)}\n")
    done, _ = caller.wb(config, "agent", command, f"m1:{RUN_ID}", "--json")
    assert done.returncode == 255, done.stderr
    assert done.stdout == ""
    assert f"m1: the {command} reply is about agent run {other}, not {RUN_ID}; refused" in done.stderr


# --- 14. a dropped connection names the reference -----------------------------------------------


@pytest.mark.parametrize("command", ["await", "stop"])
def test_a_connection_dropped_during_await_or_stop_names_the_reference(caller: Caller, command: str) -> None:
    # The script's parent is the session's sshd: killing it drops the connection after the request was read.
    config = caller.peer("cat >/dev/null\nkill -9 $PPID\nexec sleep 5\n")
    done, _ = caller.wb(config, "agent", command, f"m1:{RUN_ID}")
    assert done.returncode == 255, done.stderr
    assert "the connection" in done.stderr
    assert f"m1:{RUN_ID}" in done.stderr, done.stderr


# --- 10. a list reply's size and repeated IDs ------------------------------------------------------


def peak_rss_mib(argv: list[str], env: dict[str, str]) -> tuple[int, float]:
    """Exit code and peak resident set (MiB) of one command, from the kernel's own accounting.

    The command is started by a small interpreter rather than by pytest itself: a child's peak
    counts the image it was forked from, and the test process is far larger than wb.
    """
    measure = (
        "import os, subprocess, sys\n"
        "p = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,"
        " stderr=subprocess.DEVNULL)\n"
        "_, status, usage = os.wait4(p.pid, 0)\n"
        "print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)\n"
    )
    out = subprocess.run([sys.executable, "-c", measure, *argv], env=env, capture_output=True, text=True, check=True)
    code, kib = out.stdout.split()
    return int(code), int(kib) / 1024


def test_a_list_reply_of_a_million_tiny_objects_is_refused_in_little_memory(caller: Caller) -> None:
    document = caller.server.root / f"tiny{next(_names)}.json"
    document.write_text('{"schema_version":1,"operation":"list","results":[' + ",".join(["{}"] * 1_300_000) + "]}\n")
    assert document.stat().st_size < 4 * 1024 * 1024
    config = caller.peer(f"cat >/dev/null\ncat {document}\n")
    done, _ = caller.wb(config, "agent", "list", "--to", "m1")
    assert done.returncode == 255 and done.stdout == ""
    assert "m1: the reply cannot be trusted: it holds more than 160000 JSON objects and arrays" in done.stderr
    code, peak = peak_rss_mib([sys.executable, "-m", "courier.main", "agent", "list", "--to", "m1"], caller.env(config))
    assert code == 255
    assert peak < 150, f"peak RSS {peak:.0f} MiB"  # 407 MiB before the bound


@pytest.mark.parametrize(("junk", "count"), [("1", 2_000_000), ('""', 1_000_000)], ids=["integers", "strings"])
def test_a_reply_of_too_many_scalars_is_refused_before_decoding_in_little_memory(
    caller: Caller, junk: str, count: int
) -> None:
    """A list reply under the byte cap whose junk array holds millions of tiny values (issue 21 item 7)."""
    document = caller.server.root / f"scalars{next(_names)}.json"
    junk_array = ",".join([junk] * count)
    document.write_text('{"schema_version":1,"operation":"list","results":[],"junk":[' + junk_array + "]}\n")
    assert document.stat().st_size < 4 * 1024 * 1024
    config = caller.peer(f"cat >/dev/null\ncat {document}\n")
    done, _ = caller.wb(config, "agent", "list", "--to", "m1")
    assert done.returncode == 255 and done.stdout == "", done.stderr
    assert "m1: the reply cannot be trusted: it holds more than 200000 JSON values" in done.stderr
    code, peak = peak_rss_mib([sys.executable, "-m", "courier.main", "agent", "list", "--to", "m1"], caller.env(config))
    assert code == 255
    assert peak < 120, f"peak RSS {peak:.0f} MiB"  # 150-230 MiB before the bound


def test_list_all_names_a_refused_machine_once_in_its_warning(caller: Caller) -> None:
    """The fresh red-team pass (docs/red-team.md, item 7): `list --all` over a peer whose reply is
    refused warned `m1: m1: the reply cannot be trusted …`, the machine named twice."""
    document = caller.server.root / f"scalars{next(_names)}.json"
    document.write_text(
        '{"schema_version":1,"operation":"list","results":[],"junk":[' + ",".join(["0"] * 300_000) + "]}\n"
    )
    config = caller.peer(f"cat >/dev/null\ncat {document}\n")
    done, _ = caller.wb(config, "agent", "list", "--all")
    assert done.returncode == 1, done.stderr
    assert "warning: m1: the reply cannot be trusted: it holds more than 200000 JSON values\n" in done.stderr
    assert "m1: m1:" not in done.stderr, done.stderr


def test_a_list_reply_that_repeats_one_id_is_refused_naming_it(caller: Caller) -> None:
    document = caller.server.root / f"repeated{next(_names)}.json"
    document.write_text(json.dumps({"schema_version": 1, "operation": "list", "results": [running_result()] * 3409}))
    config = caller.peer(f"cat >/dev/null\ncat {document}\n")
    done, _ = caller.wb(config, "agent", "list", "--to", "m1")
    assert done.returncode == 255 and done.stdout == ""
    assert f"m1: the list reply names agent run {RUN_ID} more than once; refused" in done.stderr


# --- 12. a fleet of aliases of one sshd ----------------------------------------------------------

ALIASES = 29


def test_list_all_over_aliases_of_one_sshd_uses_one_connection_and_lists_cleanly(
    sshd: SshdFactory, tmp_path: Path
) -> None:
    """OpenSSH's defaults (MaxStartups 10:30:100, MaxSessions 10) and 29 targets that are all that one sshd."""
    host = sshd.start("127.0.0.4", sshd_options="MaxStartups 10:30:100\nMaxSessions 10\n")
    ids = []
    for _ in range(2):
        record = sample_record(state="completed", started_at="2026-11-30T10:00:00.000Z")
        Store(host.wb_home).ensure().create(record, "task")
        ids.append(record.agent_id)
    aliases = [f"alias{index:02d}" for index in range(ALIASES)]
    client_config = sshd.write_client_config(
        f"aliases{next(_names)}", f"Host alias*\n  HostName {host.host}\n  Port {host.port}\n  User root\n"
    )
    config = sshd.write_wb_config(f"fleet{next(_names)}", {name: {"host": name} for name in aliases})
    caller = Caller(sshd, host, tmp_path)
    accepted_before = host.log().count("Accepted publickey")
    done, _ = caller.wb(config, "agent", "list", "--all", "--json", env={"WB_SSH_CONFIG": str(client_config)})
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    rows = {row["machine"]: row for row in answer["machines"]}
    assert [name for name in aliases if not rows[name]["ok"]] == []
    assert all(rows[name]["runs"] == 2 for name in aliases)
    assert len(answer["results"]) == 2 * ALIASES
    assert host.log().count("Accepted publickey") - accepted_before == 1  # one connection for the 29 aliases


def test_aliases_sharing_a_failed_handshake_each_report_it_under_their_own_name(
    sshd: SshdFactory, tmp_path: Path
) -> None:
    stranger = sshd.start("127.0.0.5", remember_key=False)
    aliases = ["east", "north", "west"]
    config = sshd.write_wb_config(f"strangers{next(_names)}", {name: sshd.target(stranger) for name in aliases})
    connections_before = stranger.log().count("Connection from")
    done, _ = Caller(sshd, stranger, tmp_path).wb(config, "agent", "list", "--all", "--json")
    assert done.returncode == 1, done.stderr
    rows = {row["machine"]: row for row in json.loads(done.stdout)["machines"]}
    for name in aliases:
        assert rows[name]["error"].startswith(f"{name} (127.0.0.5:{stranger.port}): the host key is unknown")
    assert stranger.log().count("Connection from") - connections_before == 1


def test_a_server_allowing_one_session_per_connection_still_lists_every_alias(
    sshd: SshdFactory, tmp_path: Path
) -> None:
    """A hardened sshd (MaxSessions 1) refuses the shared connection's second session: wb opens them one by one."""
    strict = sshd.start("127.0.0.6", sshd_options="MaxSessions 1\n")
    aliases = [f"s{index}" for index in range(5)]
    config = sshd.write_wb_config(f"strict{next(_names)}", {name: sshd.target(strict) for name in aliases})
    done, _ = Caller(sshd, strict, tmp_path).wb(config, "agent", "list", "--all", "--json")
    assert done.returncode == 0, done.stderr
    assert all(row["ok"] for row in json.loads(done.stdout)["machines"])
