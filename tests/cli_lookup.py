"""Where the real harness CLIs are on this machine, as the caller finds them.

The e2e tiers need the real `codex`, `claude` and `gemini`; a user may have them under a
non-default npm prefix rather than /usr/bin. The lookup (PATH without tests/fakes, then npm's
global bin) is shared by `require_cli` and by the loopback sshd machines, whose PATH must hold
the same directories so a remote run finds the CLI the caller found.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

FAKES = Path(__file__).resolve().parent / "fakes"
HARNESS_CLIS = ("codex", "claude", "gemini")


def search_path(path: str | None = None) -> str:
    """`path` (default: this process's PATH) without tests/fakes, so a fake is never taken for the real CLI."""
    dirs = (os.environ.get("PATH", "") if path is None else path).split(os.pathsep)
    return os.pathsep.join(d for d in dirs if d and Path(d).resolve() != FAKES.resolve())


def locate_cli(name: str) -> str | None:
    """The executable `name` on PATH (fakes left out), else in npm's global bin; None when neither has it."""
    return _locate(name, os.environ.get("PATH", ""))


@functools.cache
def _locate(name: str, path: str) -> str | None:
    search = search_path(path)
    found = shutil.which(name, path=search)
    npm = shutil.which("npm", path=search)
    if found is None and npm is not None:
        try:
            done = subprocess.run([npm, "prefix", "-g"], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return None
        prefix = done.stdout.strip()
        found = shutil.which(name, path=os.path.join(prefix, "bin")) if prefix else None
    return found


def cli_dirs(executable: str) -> list[str]:
    """The PATH directories `executable` needs: its own, then node's (an npm launcher is `#!/usr/bin/env node`)."""
    dirs = [str(Path(executable).parent)]
    node = shutil.which("node", path=search_path())
    if node is not None and str(Path(node).parent) not in dirs:
        dirs.append(str(Path(node).parent))
    return dirs


def harness_cli_dirs() -> list[str]:
    """The directories of every harness CLI found here (and node's), in lookup order, each once."""
    dirs: list[str] = []
    for name in HARNESS_CLIS:
        found = locate_cli(name)
        for directory in cli_dirs(found) if found is not None else []:
            if directory not in dirs:
                dirs.append(directory)
    return dirs
