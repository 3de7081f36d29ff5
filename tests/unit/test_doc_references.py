"""References a reader can follow: every rule the code cites is in the repository's own docs.

A citation is `docs/FILE.md`, `docs/FILE.md#anchor` (a heading's GitHub anchor) or
`docs/cli.md, wb agent COMMAND` (a command section, whose anchor is unreadable). No file cites
a numbered section (`§5.5`) of a document the repository does not hold, and none names a
path outside the repository.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
THIS_FILE = Path(__file__).resolve()  # holds the patterns and planted samples, so it is not scanned
SKIPPED_DIRS = {".git", ".venv", "node_modules", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"}
SKIPPED_DIRS |= {".hypothesis", "build", "dist"}

# A numbered section (`§7.4`, `contract §5`) or a part of an outside document.
SECTION_CITATION = re.compile(r"§\s*\d|\bcontract\s+part\s+(one|two|three)\b", re.IGNORECASE)
# Places outside the repository a file must not name; split so this file does not name them.
OUTSIDE_PATHS = tuple(
    a + b
    for a, b in [
        ("/work/", "shared"),
        ("/work/", "wt/"),
        ("/work/", "main"),
        ("../", "reference/"),
        ("../", "seeds/"),
        ("contract", ".md"),
        ("spec/", "design.md"),
    ]
)

DOC_CITATION = re.compile(r"(?<![\w./-])docs/([\w.-]+\.md)(?:#([\w-]+))?")
COMMAND_CITATION = re.compile(r"(?<![\w./-])docs/([\w.-]+\.md), (wb(?: agent)? [a-z]+)")
MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def repository_files(root: Path) -> list[Path]:
    """Every text file of the tree: code, tests, docs, scripts, README (not .git, .venv, caches)."""
    found: list[Path] = []
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if any(part in SKIPPED_DIRS or part.endswith(".egg-info") for part in relative.parts[:-1]):
            continue
        if relative.parts[0] in SKIPPED_DIRS or not path.is_file() or path.is_symlink() or path == THIS_FILE:
            continue
        found.append(path)
    return found


def text_of(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    kept = "".join(c for c in heading.strip().lower() if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def headings(markdown: str) -> list[str]:
    """The headings of a Markdown text, outside code fences, as written (markup kept)."""
    found: list[str] = []
    fenced = False
    for line in markdown.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (match := re.match(r"#{1,6} +(.+?) *#* *$", line)):
            found.append(match.group(1))
    return found


def anchors(markdown: str) -> set[str]:
    """Every anchor GitHub gives the headings, `-1`, `-2` … for repeats."""
    seen: dict[str, int] = {}
    for heading in headings(markdown):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        if count:
            seen[f"{base}-{count}"] = 1
    return set(seen)


def problems(root: Path) -> list[str]:
    """What a reader could not follow, one line each: `<file>:<line>: <why>`."""
    found: list[str] = []
    docs: dict[str, str | None] = {}

    def doc(name: str) -> str | None:
        if name not in docs:
            path = root / "docs" / name
            docs[name] = text_of(path) if path.is_file() else None
        return docs[name]

    for path in repository_files(root):
        text = text_of(path)
        if text is None:
            continue
        relative = path.relative_to(root)
        for number, line in enumerate(text.splitlines(), 1):
            where = f"{relative}:{number}"
            if SECTION_CITATION.search(line):
                found.append(f"{where}: cites a numbered section of a document outside the repository: {line.strip()}")
            outside = [name for name in OUTSIDE_PATHS if name in line]
            found.extend(f"{where}: names {name!r}, outside the repository" for name in outside)
            for match in DOC_CITATION.finditer(line):
                name, anchor = match.group(1), match.group(2)
                target = doc(name)
                if target is None:
                    found.append(f"{where}: cites docs/{name}, which does not exist")
                elif anchor and anchor not in anchors(target):
                    found.append(f"{where}: cites docs/{name}#{anchor}, but no heading there has that anchor")
            for match in COMMAND_CITATION.finditer(line):
                name, command = match.group(1), match.group(2)
                target = doc(name) or ""
                if not any(h.strip("` ").startswith(command) for h in headings(target)):
                    found.append(f"{where}: cites docs/{name}, {command}, but no heading there starts with it")
            if path.suffix == ".md":
                found.extend(f"{where}: {why}" for why in link_problems(root, path, line))
    return found


def link_problems(root: Path, source: Path, line: str) -> list[str]:
    """Relative Markdown links that leave the repository, or name a missing file or anchor."""
    found: list[str] = []
    for match in MARKDOWN_LINK.finditer(line):
        target = match.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL, or an anchor of this page (checked as a heading below when cited)
        file_part, _, anchor = target.partition("#")
        resolved = (source.parent / file_part).resolve()
        if not resolved.is_relative_to(root.resolve()):
            found.append(f"links to {target}, outside the repository")
        elif not resolved.exists():
            found.append(f"links to {target}, which does not exist")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(text_of(resolved) or ""):
            found.append(f"links to {target}, but no heading there has that anchor")
    return found


def test_every_reference_in_the_repository_can_be_followed() -> None:
    assert problems(ROOT) == []


def test_the_anchors_are_githubs() -> None:
    assert slug("The receiver's rules") == "the-receivers-rules"
    assert slug("`wb agent dispatch`") == "wb-agent-dispatch"
    assert slug("Latest figures — 2026-11-29") == "latest-figures--2026-11-29"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}


@pytest.mark.parametrize(
    ("planted", "complaint"),
    [
        ('"""The bounds (contract §5.5)."""\n', "cites a numbered section"),
        ("# see §7.4\n", "cites a numbered section"),
        ("# the rules of contract Part two\n", "cites a numbered section"),
        ('SPEC = "/work/' + "shar" + 'ed/sp' + 'ec"\n', "outside the repository"),
        ("# docs/missing.md\n", "docs/missing.md, which does not exist"),
        ("# docs/runs.md#no-such-heading\n", "no heading there has that anchor"),
        ("# docs/cli.md, wb agent frobnicate\n", "no heading there starts with it"),
    ],
)
def test_a_reference_that_cannot_be_followed_is_named(tmp_path: Path, planted: str, complaint: str) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "runs.md").write_text("# Runs\n\n## States and liveness\n")
    (tmp_path / "docs" / "cli.md").write_text("# CLI\n\n## `wb agent stop REF`\n")
    (tmp_path / "ok.py").write_text("# docs/runs.md#states-and-liveness; docs/cli.md, wb agent stop\n")
    assert problems(tmp_path) == []
    (tmp_path / "bad.py").write_text(planted)
    found = problems(tmp_path)
    assert len(found) == 1 and found[0].startswith("bad.py:1: ") and complaint in found[0], found


def test_a_markdown_link_out_of_the_repository_or_to_a_missing_anchor_is_named(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "runs.md").write_text("# Runs\n\n## The store\n")
    (tmp_path / "docs" / "a.md").write_text(
        "[ok](runs.md#the-store) [web](https://example.com/x.md)\n[out](../../elsewhere/spec.md)\n[gone](runs.md#nope)\n"
    )
    found = problems(tmp_path)
    assert [f.split(": ", 1)[0] for f in found] == ["docs/a.md:2", "docs/a.md:3"], found
