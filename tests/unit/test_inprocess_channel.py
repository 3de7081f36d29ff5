"""The in-process channel: the one caller over a receiver running in this process (no SSH, no child, no root)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from tests_support import sample_record

from courier import cli
from courier.channels.channel import Outcome
from courier.channels.registry import overridden
from courier.config import AnyTarget
from courier.runs.store import Store
from tests.inprocess_channel import InProcessChannel
from tests.json_documents import check_output


@pytest.fixture
def homes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    config = tmp_path / "config" / "wb.yaml"
    config.parent.mkdir(mode=0o700)
    config.write_text(
        "session_move:\n  targets:\n    m1: {ssh: {host: 127.0.0.2}}\n"
        "    c1: {exec: {argv: [docker, exec, -i, c1], wb_path: /opt/wb/bin/wb}}\n"
    )
    config.chmod(0o600)
    monkeypatch.setenv("WB_CONFIG", str(config))
    monkeypatch.setenv("WB_HOME", str(tmp_path / "here"))
    return {"m1": tmp_path / "m1-home", "c1": tmp_path / "c1-home"}


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.run(argv)
    out, err = capsys.readouterr()
    check_output(argv, subprocess.CompletedProcess(argv, code, out, err))
    return code, out, err


def test_the_caller_reaches_an_in_process_receiver_through_the_channel_seam(
    homes: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    record = sample_record(state="completed")
    Store(homes["c1"]).ensure().create(record, "task")
    channels: list[InProcessChannel] = []

    def factory(machine: str, target: AnyTarget) -> InProcessChannel:
        channels.append(InProcessChannel(machine, target, homes[machine]))
        return channels[-1]

    with overridden(factory):
        code, out, err = _run(["agent", "status", f"c1:{record.agent_id}", "--json"], capsys)
    assert code == 0, err
    assert '"machine": "c1"' in out and f'"agent_id": "{record.agent_id}"' in out
    # The caller ran exactly the exec target's wb command, nothing from the request in the argv.
    assert channels[0].calls == [["/opt/wb/bin/wb", "--wb-internal-agent-remote"]]


def test_a_channel_outcome_is_classified_by_the_one_caller(
    homes: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    def missing(tail: list[str], stdin: bytes) -> Outcome:
        return Outcome(b"", b"sh: 1: wb: not found\n", 127, None)

    with overridden(lambda machine, target: InProcessChannel(machine, target, homes[machine], missing)):
        ssh_code, _, ssh_err = _run(["agent", "list", "--to", "m1"], capsys)
        exec_code, _, exec_err = _run(["agent", "list", "--to", "c1"], capsys)
    assert ssh_code == exec_code == 255
    assert ssh_err.endswith("set session_move.targets.m1.ssh.wb_path\n")
    assert exec_err == "error: wb was not found on c1: set session_move.targets.c1.exec.wb_path\n"


def test_an_oversized_reply_from_the_channel_is_refused(
    homes: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    def flood(tail: list[str], stdin: bytes) -> Outcome:
        return Outcome(b"x" * (4 * 1024 * 1024 + 1), b"", 0, None)

    with overridden(lambda machine, target: InProcessChannel(machine, target, homes[machine], flood)):
        code, out, err = _run(["agent", "list", "--to", "m1"], capsys)
    assert code == 255 and out == ""
    assert err == "error: m1: the reply exceeds 4194304 bytes; refused (the channel was closed)\n"
