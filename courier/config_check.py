"""`wb config check` (docs/config.md#checking-the-file): every problem of the wb.yaml wb would use, in one pass.

The other commands refuse the file at its first problem with the file itself and report an
entry's problem only when that entry is used; unknown sections and keys they ignore. This
reads the file the way they do (courier/config_file.py, courier/config.py), keeps every
problem instead, and adds the unknown names, each with the known key it is likely a typo of.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from courier.config import Problem, config_of
from courier.config_file import KNOWN_KEYS, read_document, settings_of
from courier.errors import UsageError
from courier.paths import config_path
from protocol.documents import ConfigCheckDocument, ConfigProblem

# Sections whose unknown keys every other command ignores; sandbox's are refused where they are read.
_LENIENT = ("agents", "session_move", "courier")
_KNOWN_PATHS = [*KNOWN_KEYS, *(f"{section}.{key}" for section, keys in KNOWN_KEYS.items() for key in keys)]
SUGGESTION_EDITS = 2  # docs/config.md#checking-the-file: a known name within this many edits is suggested


def check(path: Path | None = None) -> ConfigCheckDocument:
    """The problems of `path` (default: the file wb would use: WB_CONFIG, else the XDG location)."""
    path = path or config_path()
    if os.environ.get("WB_CONFIG") and not path.exists():
        missing = f"WB_CONFIG names {path}, which does not exist; create it or unset WB_CONFIG"
        return _document(path, [ConfigProblem(key=None, message=missing)])
    try:
        document = read_document(path, use_copy=False)  # the file itself; a check creates nothing
    except UsageError as exc:  # permissions, YAML, the top level: nothing more can be read
        return _document(path, [ConfigProblem(key=None, message=_without_path(str(exc), path))])
    problems = _unknown_names(document)
    refused: list[UsageError] = []
    config = config_of(settings_of(document, path, refused), path)
    for refusal in refused:
        message = _without_path(str(refusal), path)
        problems.append(ConfigProblem(key=message.split(": ", 1)[0], message=message))
    sections: list[tuple[str, dict[str, Any]]] = [
        ("agents.providers", config.providers),
        ("agents.profiles", config.profiles),
        ("session_move.targets", config.targets),
    ]
    for section, entries in sections:
        for name, entry in entries.items():
            if isinstance(entry, Problem):
                message = _without_path(entry.message, path)
                problems.append(ConfigProblem(key=f"{section}.{name}", message=message))
    return _document(path, problems)


def text_lines(found: ConfigCheckDocument) -> list[str]:
    """What `wb config check` prints: the file and how many problems, then one line per problem."""
    if found.ok:
        where = found.path if found.exists else f"{found.path} (absent: the built-ins are in use)"
        return [f"{where}: no problems"]
    count = len(found.problems)
    return [f"{found.path}: {count} problem{'s' if count != 1 else ''}", *(p.message for p in found.problems)]


def _document(path: Path, problems: list[ConfigProblem]) -> ConfigCheckDocument:
    return ConfigCheckDocument(path=str(path), exists=path.exists(), ok=not problems, problems=problems)


def _unknown_names(document: dict[str, Any]) -> list[ConfigProblem]:
    found = []
    for section, body in document.items():
        if section not in KNOWN_KEYS:
            found.append(_unknown(str(section), "unknown section"))
        elif section in _LENIENT and isinstance(body, dict):
            found += [_unknown(f"{section}.{key}", "unknown key") for key in body if key not in KNOWN_KEYS[section]]
    return found


def _unknown(key: str, what: str) -> ConfigProblem:
    near = suggestion(key.rsplit(".", 1)[-1])
    return ConfigProblem(key=key, message=f"{key}: {what}" + (f" (did you mean {near}?)" if near else ""))


def suggestion(name: str) -> str | None:
    """The known dotted key whose last name is nearest to `name`, within SUGGESTION_EDITS edits (first wins a tie)."""
    best: tuple[int, str] | None = None
    for known in _KNOWN_PATHS:
        edits = _edits(name, known.rsplit(".", 1)[-1])
        if edits <= SUGGESTION_EDITS and edits < len(name) and (best is None or edits < best[0]):
            best = (edits, known)
    return best[1] if best else None


def _edits(a: str, b: str) -> int:
    """Insertions, deletions, substitutions and swaps of two neighbours that turn `a` into `b` (optimal string
    alignment), so `profiels` is one edit from `profiles`."""
    before: list[int] | None = None
    row = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        current = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = a[i - 1] != b[j - 1]
            current[j] = min(row[j] + 1, current[j - 1] + 1, row[j - 1] + cost)
            if before is not None and i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                current[j] = min(current[j], before[j - 2] + 1)
        before, row = row, current
    return row[len(b)]


def _without_path(message: str, path: Path) -> str:
    return message.removeprefix(f"{path}: ")
