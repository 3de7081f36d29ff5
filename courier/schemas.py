"""The JSON Schemas (draft 2020-12) of every document wb prints or sends, generated from the models.

`python -m courier.schemas --write docs/schema` rewrites the committed copies; `--check DIR`
exits 1 when they drifted from the models.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from protocol import limits
from protocol.documents import (
    ActionsDocument,
    ConfigCheckDocument,
    ErrorDocument,
    EventDocument,
    FleetDocument,
    FollowLine,
    ListDocument,
    LogsDocument,
    MachinesDocument,
    PruneDocument,
    PruneFleetDocument,
    StopDocument,
    WatchDocument,
)
from protocol.models import DiffResult, RemoteRequest, RemoteResponse, Result, StopResult

REGENERATE = "python -m courier.schemas --write docs/schema"
DRAFT = "https://json-schema.org/draft/2020-12/schema"

# name -> (model, what prints or sends it)
DOCUMENTS: dict[str, tuple[type[BaseModel], str]] = {
    "result": (Result, "one run: dispatch, status and await --json; the MCP dispatch, status and await tools"),
    "list": (ListDocument, "wb agent list --json"),
    "fleet": (FleetDocument, "wb agent list --all --json; the MCP list tool"),
    "machines": (MachinesDocument, "wb machines --json"),
    "diff": (DiffResult, "wb agent diff --json; the MCP diff tool"),
    "request": (RemoteRequest, "the request wb sends to another machine (stdin of wb --wb-internal-agent-remote)"),
    "response": (RemoteResponse, "the reply wb --wb-internal-agent-remote writes"),
    "error": (ErrorDocument, "a refusal: the MCP tools' error; the CLI prints its message as `error: ...`"),
    "logs": (LogsDocument, "the MCP logs tool"),
    "stop": (StopResult, "the MCP stop tool"),
    "actions": (ActionsDocument, "wb agent logs --json"),
    "stopped": (StopDocument, "wb agent stop --json"),
    "prune": (PruneDocument, "wb agent prune --json"),
    "prune-fleet": (PruneFleetDocument, "wb agent prune --all --json"),
    "event": (EventDocument, "each line of wb agent watch --json"),
    "watch": (WatchDocument, "the MCP watch tool"),
    "config-check": (ConfigCheckDocument, "wb config check --json"),
    "follow-line": (FollowLine, "each line of wb agent logs --follow --json"),
}


def names() -> list[str]:
    return list(DOCUMENTS)


def schema_id(name: str) -> str:
    return f"urn:wb:schema:{limits.SCHEMA_VERSION}:{name}"


def schema(name: str) -> dict[str, Any]:
    """The schema of one document; KeyError for an unknown name."""
    model, used_by = DOCUMENTS[name]
    body = model.model_json_schema(mode="serialization", by_alias=True)
    head: dict[str, Any] = {"$schema": DRAFT, "$id": schema_id(name)}
    if "description" not in body:
        head["description"] = used_by
    else:
        head["description"] = f"{body.pop('description')}\n\nUsed by: {used_by}."
    return {**head, **body}


def render(name: str) -> str:
    return json.dumps(schema(name), indent=2, ensure_ascii=False, sort_keys=False) + "\n"


def write(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name in names():
        path = directory / f"{name}.json"
        path.write_text(render(name), encoding="utf-8")
        written.append(path)
    return written


def drifted(directory: Path) -> list[str]:
    """Files that differ from the models (or are missing), and stray files."""
    out = [f"{name}.json" for name in names() if _read(directory / f"{name}.json") != render(name)]
    known = {f"{name}.json" for name in names()}
    out += [path.name for path in sorted(directory.glob("*.json")) if path.name not in known]
    return out


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--write":
        for path in write(Path(argv[1])):
            sys.stderr.write(f"wrote {path}\n")
        return 0
    if len(argv) == 2 and argv[0] == "--check":
        stale = drifted(Path(argv[1]))
        for file in stale:
            sys.stderr.write(f"error: {Path(argv[1]) / file} differs from the models; regenerate: {REGENERATE}\n")
        return 1 if stale else 0
    sys.stderr.write("usage: python -m courier.schemas (--write DIR | --check DIR)\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
