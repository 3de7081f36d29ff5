"""The repository stands on its own: no file reads or links anything outside the checkout."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from conftest import REPO_ROOT

# Built from parts so that this file does not match itself.
_OUTSIDE = re.compile("|".join([r"\.\./" + "shared", "shared" + "/reference", "shared" + "/spec"]))
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_CHECKED = (".py", ".md", ".sh", ".toml", ".yaml", ".yml", ".txt", ".cfg")


def _repository_files() -> list[Path]:
    """Tracked and new files of the checkout, ignored ones (.venv, caches) left out."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO_ROOT, capture_output=True, check=True,
    ).stdout.split(b"\0")  # fmt: skip
    return [REPO_ROOT / os.fsdecode(name) for name in listed if name and (REPO_ROOT / os.fsdecode(name)).is_file()]


def _text_files() -> list[Path]:
    files = _repository_files()
    scripts = [path for path in files if path.parent.name in ("fakes", ".ci", "scripts")]
    return [path for path in files if path.suffix in _CHECKED] + [p for p in scripts if p.suffix == ""]


def test_nothing_names_the_reference_material_outside_the_repository() -> None:
    offenders = []
    for path in _text_files():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if _OUTSIDE.search(line):
                offenders.append(f"{path.relative_to(REPO_ROOT)}:{number}: {line.strip()}")
    assert offenders == []


def test_every_relative_markdown_link_resolves_inside_the_repository() -> None:
    broken = []
    for path in _text_files():
        if path.suffix != ".md":
            continue
        for target in _LINK.findall(path.read_text()):
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a URL or an anchor in the same page
            resolved = (path.parent / target.split("#", 1)[0]).resolve()
            if not resolved.is_relative_to(REPO_ROOT) or not resolved.exists():
                broken.append(f"{path.relative_to(REPO_ROOT)}: {target}")
    assert broken == []


def test_the_reference_documents_exist_and_cover_every_command_and_exit_code() -> None:
    cli = (REPO_ROOT / "docs" / "cli.md").read_text()
    for command in ("dispatch", "status", "await", "list", "logs", "stop"):
        assert f"## `wb agent {command}" in cli, command
    assert "## `wb machines" in cli and "`wb --version`" in cli
    for code in ("0", "1", "2", "130", "141", "255"):
        assert f"\n| {code} |" in cli, code
    protocol = (REPO_ROOT / "docs" / "protocol.md").read_text()
    for section in ("## Transport", "## The request", "## The response", "## The receiver's rules",
                    "## The caller's rules", "## Bounds"):  # fmt: skip
        assert section in protocol, section
    readme = (REPO_ROOT / "README.md").read_text()
    assert "(docs/cli.md)" in readme and "(docs/protocol.md)" in readme
