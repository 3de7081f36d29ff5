"""The session files of the demo's stand-in CLIs: one JSONL file of records per session, in the CLI's home.

Each stand-in keeps its conversation where its real CLI keeps its sessions (under CODEX_HOME,
CLAUDE_CONFIG_DIR or GEMINI_CLI_HOME), so `wb agent continue`, which starts the new run with a
copy of the parent's home, finds it there and the stand-in resumes it as the real CLI would.
Files are private (0600 in 0700 directories): they hold the task. Standard library only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any


def append_records(path: str, records: Iterable[dict[str, Any]]) -> None:
    """Append `records` to the session file at `path`, creating it (and its directories) privately."""
    lines = "".join(json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n" for record in records)
    if not lines:
        return
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a", encoding="utf-8") as handle:
        handle.write(lines)


def read_records(path: str) -> list[dict[str, Any]] | None:
    """The records of the session file at `path` (a torn or foreign line skipped); None when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError):
        return None
    records = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def find_session_file(root: str, suffix: str) -> str | None:
    """The first file under `root` whose name ends with `suffix` (in sorted order), or None."""
    for directory, subdirs, files in os.walk(root):
        subdirs.sort()
        for name in sorted(files):
            if name.endswith(suffix):
                return os.path.join(directory, name)
    return None
