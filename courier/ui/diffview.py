"""A run's patch cut into files and hunks for the run page (docs/ui.md, the run's page).

Pure text work on the patch `wb agent diff` prints; nothing here escapes (pages.py does),
so the parser can be tested on its own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from protocol.models import DiffResult

_FILE_HEADER = re.compile(r"^diff --git a/(.*) b/(.*)$")


@dataclass
class Line:
    kind: str  # "add", "del", "ctx" or "note" (`\ No newline at end of file`)
    text: str


@dataclass
class Hunk:
    header: str
    lines: list[Line] = field(default_factory=list)


@dataclass
class FileDiff:
    path: str
    status: str = ""
    insertions: int = 0
    deletions: int = 0
    binary: bool = False
    hunks: list[Hunk] = field(default_factory=list)


def split_patch(patch: str) -> list[tuple[str, list[str]]]:
    """(path, the file's lines) per `diff --git` block, in the patch's order."""
    blocks: list[tuple[str, list[str]]] = []
    for line in patch.split("\n"):
        header = _FILE_HEADER.match(line)
        if header:
            blocks.append((header.group(2), []))
        elif blocks:
            blocks[-1][1].append(line)
    return blocks


def _hunks(lines: list[str]) -> tuple[list[Hunk], bool]:
    hunks: list[Hunk] = []
    binary = False
    for line in lines:
        if line.startswith("@@"):
            hunks.append(Hunk(line))
        elif not hunks:
            binary = binary or line.startswith("Binary files ") or line == "GIT binary patch"
        elif line.startswith("+"):
            hunks[-1].lines.append(Line("add", line[1:]))
        elif line.startswith("-"):
            hunks[-1].lines.append(Line("del", line[1:]))
        elif line.startswith("\\"):
            hunks[-1].lines.append(Line("note", line))
        elif line.startswith(" "):
            hunks[-1].lines.append(Line("ctx", line[1:]))
    return hunks, binary


def files_of(diff: DiffResult) -> list[FileDiff]:
    """Every changed file with its counts (from the reply's file list) and its hunks (from the patch)."""
    parsed = {path: _hunks(lines) for path, lines in split_patch(diff.patch or "")}
    out = []
    for change in diff.files:
        hunks, binary = parsed.pop(change.path, ([], False))
        out.append(
            FileDiff(
                change.path,
                change.status,
                change.insertions,
                change.deletions,
                change.binary or binary,
                [] if change.binary else hunks,
            )
        )
    for path, (hunks, binary) in parsed.items():  # in the patch but not the list (a renamed file's old name)
        out.append(FileDiff(path, "", 0, 0, binary, hunks))
    return out
