"""`wb machines --check`'s SANDBOX column for peers that say it, peers too old to say it, and hostile text."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from courier import cli
from courier.client.transport import MockTransport, Transport, overridden
from courier.config import Config
from protocol import limits
from protocol.models import RemoteRequest, RemoteResponse
from tests.json_documents import check_output

SAYS = {"new": "bwrap 0.8.0", "old": None, "hostile": "none: \x1b[31mred\x1b[0m " + "x" * 500}


@pytest.fixture
def wb_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    config = tmp_path / "config" / "wb.yaml"
    config.parent.mkdir(mode=0o700)
    config.write_text(
        "session_move:\n  targets:\n"
        + "".join(f"    {name}: {{ssh: {{host: 127.0.0.{i + 2}}}}}\n" for i, name in enumerate(SAYS))
    )
    config.chmod(0o600)
    monkeypatch.setenv("WB_CONFIG", str(config))
    monkeypatch.setenv("WB_HOME", str(tmp_path / "home"))
    return tmp_path


def _peer(machine: str) -> MockTransport:
    def answer(request: RemoteRequest) -> RemoteResponse:
        fields: dict[str, object] = {"wb_version": "0.9", "capabilities": ["harness:command"]}
        if SAYS[machine] is not None:
            fields["sandbox"] = SAYS[machine]
        return RemoteResponse.model_validate(
            {"schema_version": limits.SCHEMA_VERSION, "operation": request.operation, **fields}
        )

    return MockTransport(machine, answer)


def _machines(config: Config, machine: str) -> Transport:
    return _peer(machine)


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with overridden(_machines):
        code = cli.run(argv)
    out, err = capsys.readouterr()
    check_output(argv, subprocess.CompletedProcess(argv, code, out, err))
    assert code == 0, err
    return code, out


def test_an_older_peer_that_does_not_say_is_null_in_json_and_unknown_in_text(
    wb_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out = _run(["machines", "--check", "--json"], capsys)
    rows = {row["machine"]: row["sandbox"] for row in json.loads(out)}
    assert rows["new"] == "bwrap 0.8.0" and rows["old"] is None
    _, text = _run(["machines", "--check"], capsys)
    header, *lines = text.splitlines()
    column = header.index("SANDBOX")
    cells = {line.split()[0]: line[column:].strip() for line in lines}
    assert cells["new"] == "bwrap 0.8.0" and cells["old"] == "unknown"
    hostile = cells["hostile"]
    assert "\x1b" not in hostile and len(hostile.encode()) <= 120 and hostile.startswith("none: ")
