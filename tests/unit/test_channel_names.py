"""Channel names have one home, the registry (docs/protocol.md#channel-names).

The published machines schema fixes the form of a `channel` value, not the list, so adding a
channel touches its module, one registry line and its config model, and no schema: these
tests fail when the schema goes back to an enum, or a registry name breaks the form or is
missing from the docs.
"""

from __future__ import annotations

import json
import re

import jsonschema
from conftest import REPO_ROOT

from courier import schemas
from courier.channels.registry import CHANNELS
from courier.config import TARGET_MODELS
from protocol.documents import CHANNEL_NAME, MachineProbe, MachinesDocument

MACHINES_SCHEMA = REPO_ROOT / "docs" / "schema" / "machines.json"
PROTOCOL_DOC = REPO_ROOT / "docs" / "protocol.md"


def _row(channel: object) -> dict[str, object]:
    return {
        "machine": "box",
        "channel": channel,
        "wb_path": None,
        "ok": True,
        "error": None,
        "wb_version": None,
        "schema_version": None,
        "rtt_ms": None,
        "clock_offset_ms": None,
        "harnesses": None,
    }


def test_every_registry_channel_has_the_published_form_and_is_its_classs_kind_and_its_targets_key() -> None:
    for name, load in CHANNELS.items():
        assert re.fullmatch(CHANNEL_NAME, name), name
        channel = load()
        assert channel.kind == name
        assert channel.target_model.channel == name  # the wb.yaml key its config model is read from
    assert list(TARGET_MODELS) == list(CHANNELS)  # wb.yaml reads exactly the registry's kinds, in its order
    assert all(TARGET_MODELS[name] is load().target_model for name, load in CHANNELS.items())


def test_the_published_schema_fixes_the_form_of_a_channel_name_not_a_list() -> None:
    schema = json.loads(MACHINES_SCHEMA.read_text())
    assert json.loads(schemas.render("machines")) == schema  # `wb schema machines` prints the same
    validator = jsonschema.Draft202012Validator(schema)
    field = schema["$defs"]["MachineProbe"]["properties"]["channel"]
    assert "enum" not in json.dumps(field)
    # A channel added to the registry later is a valid row as it stands; a malformed name is not.
    for name in [*CHANNELS, "docker", "kubectl-exec", None]:
        assert validator.is_valid([_row(name)]), name
    for bad in ["SSH", "", "1ssh", "ssh exec", "x" * 33]:
        assert not validator.is_valid([_row(bad)]), bad
    # The model that prints the rows agrees with what it publishes.
    MachinesDocument.model_validate([_row("docker")])


def test_docs_protocol_names_every_registry_channel() -> None:
    text = PROTOCOL_DOC.read_text()
    section = text.split("### Channel names", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`([a-z][a-z0-9-]*)`", section.split("today", 1)[1].split(".", 1)[0]))
    assert named == set(CHANNELS), f"docs/protocol.md#channel-names: {sorted(named)}, registry: {sorted(CHANNELS)}"
    assert CHANNEL_NAME.strip("^$") in json.dumps(json.loads(MACHINES_SCHEMA.read_text()))


def test_a_row_shows_how_its_channel_reaches_the_machine_without_naming_the_channel() -> None:
    """A new channel that runs a command (as exec does) shows its argv with no edit of the document."""
    by_command = MachineProbe.model_validate({**_row("docker"), "argv": ["docker", "exec", "-i", "box"]}).to_json()
    assert by_command["argv"] == ["docker", "exec", "-i", "box"] and not {"host", "user", "port"} & set(by_command)
    by_host = MachineProbe.model_validate({**_row("ssh"), "host": "h", "port": 22}).to_json()
    assert (by_host["host"], by_host["user"], by_host["port"]) == ("h", None, 22) and "argv" not in by_host
    misconfigured = MachineProbe.model_validate(_row("exec")).to_json()
    assert misconfigured["argv"] is None and "host" not in misconfigured
