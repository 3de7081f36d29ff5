"""`wb schema` and docs/schema/: generated from the models, valid draft 2020-12, never drifting."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from conftest import REPO_ROOT, Machine

from courier import schemas
from courier.ops.dispatch import build_dispatch
from tests import json_documents

SCHEMA_DIR = REPO_ROOT / "docs" / "schema"
CONTRACT_NAMES = {"result", "list", "fleet", "machines", "diff", "request", "response", "error"}


def test_the_committed_schemas_are_exactly_what_the_models_generate() -> None:
    stale = schemas.drifted(SCHEMA_DIR)
    assert stale == [], f"docs/schema drifted from the models: {stale}; run {schemas.REGENERATE}"


def test_the_check_command_names_a_drifted_file(tmp_path: Path) -> None:
    copy = tmp_path / "schema"
    shutil.copytree(SCHEMA_DIR, copy)
    assert _module("--check", str(copy)).returncode == 0
    (copy / "result.json").write_text('{"type": "object"}\n')
    (copy / "stray.json").write_text("{}\n")
    done = _module("--check", str(copy))
    assert done.returncode == 1
    assert "result.json differs from the models" in done.stderr and "stray.json" in done.stderr
    assert schemas.REGENERATE in done.stderr


@pytest.mark.parametrize("name", schemas.names())
def test_each_schema_is_draft_2020_12_with_an_id(name: str) -> None:
    document = json.loads((SCHEMA_DIR / f"{name}.json").read_text())
    assert document["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert document["$id"] == f"urn:wb:schema:1:{name}"
    jsonschema.Draft202012Validator.check_schema(document)


def test_every_document_the_contract_names_has_a_schema() -> None:
    assert set(schemas.names()) >= CONTRACT_NAMES


def test_wb_schema_lists_the_names_and_prints_each(machine: Machine) -> None:
    listed = machine.wb("schema")
    assert listed.returncode == 0, listed.stderr
    assert [line.split("\t")[0] for line in listed.stdout.splitlines()] == schemas.names()
    for name in ("result", "fleet", "error"):
        done = machine.wb("schema", name)
        assert done.returncode == 0 and done.stderr == ""
        assert done.stdout == (SCHEMA_DIR / f"{name}.json").read_text()


def test_wb_schema_refuses_an_unknown_name_listing_the_known_ones(machine: Machine) -> None:
    done = machine.wb("schema", "resutl")
    assert done.returncode == 2 and done.stdout == ""
    assert 'unknown schema "resutl"' in done.stderr and "result, list, fleet" in done.stderr


def test_a_request_wb_sends_and_the_reply_it_receives_follow_their_schemas(machine: Machine) -> None:
    _, request = build_dispatch(
        new_worktree="w1",
        use_worktree=None,
        profile="fake",
        task="do it",
        task_file=None,
        repo="acme/widget",
        branch=None,
        base=None,
        to=None,
        timeout="30m",
    )
    json_documents.check("request", json.loads(request.encode()))
    done = subprocess.run(
        [sys.executable, "-m", "courier.main", "--wb-internal-agent-remote"],
        input='{"schema_version": 1, "operation": "version"}',
        capture_output=True,
        text=True,
        env=machine.env,
        timeout=60,
    )
    json_documents.check("response", json.loads(done.stdout))
    refused = subprocess.run(
        [sys.executable, "-m", "courier.main", "--wb-internal-agent-remote"],
        input='{"schema_version": 1, "operation": "status", "agent_id": "nope"}',
        capture_output=True,
        text=True,
        env=machine.env,
        timeout=60,
    )
    reply = json.loads(refused.stdout)
    assert reply["failure_kind"] == "request"
    json_documents.check("response", reply)


def test_the_suite_validates_json_output_and_a_wrong_document_fails(machine: Machine) -> None:
    machine.clone()
    before = len(json_documents.checked)
    ref = machine.dispatch()
    machine.wb_json("agent", "await", ref)
    machine.wb_json("agent", "list")
    assert json_documents.checked[before:] == ["result", "list"]
    with pytest.raises(AssertionError, match=r"does not follow docs/schema/result\.json"):
        json_documents.check("result", {"agent_id": 7})


def _module(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "courier.schemas", *args], capture_output=True, text=True, cwd=REPO_ROOT, timeout=60
    )


def test_the_fleet_rows_and_their_documents_have_the_same_fields() -> None:
    """A field added to a row but not to its document would vanish from --json silently."""
    import dataclasses

    from courier.client.fleet import MachineRow, ProbeRow
    from protocol.documents import FleetMachine, MachineProbe

    # `resolved` is text only: the user and port the ssh config resolves (JSON keeps wb.yaml's, docs/cli.md).
    assert {f.name for f in dataclasses.fields(ProbeRow)} - {"resolved"} == set(MachineProbe.model_fields)
    assert {f.name for f in dataclasses.fields(MachineRow)} - {"results"} == set(FleetMachine.model_fields)


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (("agent", "logs", "agt-x", "--json"), "actions"),
        (("agent", "stop", "agt-x", "--format", "json"), "stopped"),
        (("agent", "prune", "--older-than", "0s", "--json"), "prune"),
        (("agent", "prune", "--older-than", "0s", "--all", "--json"), "prune-fleet"),
    ],
)
def test_the_json_of_logs_stop_and_prune_is_checked_against_its_published_schema(
    args: tuple[str, ...], name: str
) -> None:
    assert name in schemas.names()
    assert json_documents.schema_for(args) == name
