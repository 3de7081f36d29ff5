"""Every `--json` output a test produces is checked against its committed schema (docs/schema/*.json)."""

from __future__ import annotations

import functools
import itertools
import json
import subprocess
from pathlib import Path
from typing import Any

import jsonschema

from courier.ops import REGISTRY

SCHEMA_DIR = Path(__file__).resolve().parents[1] / "docs" / "schema"
# Documents printed one per line (wb agent watch --json), each checked on its own.
LINE_DOCUMENTS = frozenset({"event", "follow-line"})
# Counted so a test can prove the check ran (tests/unit/test_schemas.py).
checked: list[str] = []


@functools.cache
def validator(name: str) -> jsonschema.protocols.Validator:
    schema = json.loads((SCHEMA_DIR / f"{name}.json").read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)  # type: ignore[no-any-return]


def schema_for(args: tuple[str, ...] | list[str]) -> str | None:
    """The schema of what `wb ARGS` prints on stdout, or None when it prints no JSON document."""
    pairs = itertools.pairwise(args)
    wants_json = "--json" in args or "--format=json" in args or ("--format", "json") in pairs
    if not wants_json:
        return None
    words = [a for a in args if not a.startswith("-")]
    if words[:1] == ["machines"]:
        return "machines"
    if words[:2] == ["config", "check"]:
        return "config-check"
    if words[:2] == ["agent", "logs"] and "--follow" in args:
        return "follow-line"
    if words[:1] != ["agent"] or len(words) < 2:
        return None
    op = REGISTRY.get(words[1])  # `wb agent NAME` is operation NAME: its module names what it prints
    if op is None:
        return None
    name = op.printed_all if "--all" in args and op.printed_all else op.printed
    if name is None or not (SCHEMA_DIR / f"{name}.json").exists():
        return None
    return name


def check(name: str, document: Any) -> None:
    errors = sorted(validator(name).iter_errors(document), key=lambda e: list(e.absolute_path))
    assert not errors, f"output does not follow docs/schema/{name}.json: " + "; ".join(
        f"{'/'.join(map(str, e.absolute_path)) or '(document)'}: {e.message}" for e in errors[:5]
    )
    checked.append(name)


def check_output(args: tuple[str, ...] | list[str], done: subprocess.CompletedProcess[str]) -> None:
    """Validate stdout of a finished `wb` against the schema its arguments select (when it printed any)."""
    name = schema_for(list(args))
    if name is None or not done.stdout.strip():
        return
    if name in LINE_DOCUMENTS:
        for line in done.stdout.splitlines():
            check(name, json.loads(line))
        return
    check(name, json.loads(done.stdout))
