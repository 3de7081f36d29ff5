"""The README is the front door (docs/testing.md): at most 250 lines, with what a new user needs first."""

from __future__ import annotations

from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_is_short_and_has_the_front_doors_sections() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings == [
        "## Two commands on a fresh machine", "## Install", "## Configure a provider and a profile",
        "## Configure a machine", "## The supervisor pattern", "## Where to read on",
    ]  # fmt: skip
    assert "bash scripts/demo.sh" in text and "bash .ci/run" in text
