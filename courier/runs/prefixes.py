"""Short references: the machine holding a run resolves a prefix of its ID (docs/cli.md#short-references).

The caller cannot resolve a prefix: only the run's machine knows its records. So the
receiver does it once, before the operation's handler, and every handler (and every reply)
sees the whole ID.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from courier.errors import UsageError
from protocol.refs import is_run_id

NAMED_AT_MOST = 5  # an ambiguous prefix names this many candidates


def run_ids_under(directory: Path, prefix: str, suffix: str = "") -> list[str]:
    """The run IDs starting with `prefix` among the entries `<id><suffix>` of `directory` (none when it is absent)."""
    try:
        with os.scandir(directory) as entries:
            names = [entry.name.removesuffix(suffix) for entry in entries if entry.name.startswith(prefix)]
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [name for name in names if is_run_id(name)]


def resolve(prefix: str, candidates: Iterable[str]) -> str:
    """The one run ID `prefix` names; none: the prefix itself (the handler then says unknown run)."""
    found = sorted(set(candidates))
    if len(found) == 1:
        return found[0]
    if not found:
        return prefix
    raise UsageError(f'ambiguous run ID prefix "{prefix}": {_named(prefix, found)} (give more digits)')


def _named(prefix: str, found: list[str]) -> str:
    """The first candidates, each cut where it stops looking like the others (`agt-3f2a9c01…`)."""
    shown = found[:NAMED_AT_MOST]
    length = len(prefix) + 2
    while length < len(shown[0]) and len({run_id[:length] for run_id in shown}) < len(shown):
        length += 1
    named = ", ".join(f"{run_id[:length]}…" for run_id in shown)
    return named + (f" and {len(found) - len(shown)} more" if len(found) > len(shown) else "")
