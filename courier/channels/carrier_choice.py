"""What a cold command starts before anything is imported: the SSH carrier (courier/channels/ssh_carrier.py),
an exec machine's receiver (courier/channels/exec_early.py), or nothing.

Imports nothing until it reads wb.yaml's parsed copy: every cold command asks, most of them to hear no.
"""

from __future__ import annotations

from protocol.entry import REMOTE_ARGUMENT

TYPE_CHECKING = False  # typing's own import loads `re`: this module runs before anything else is imported
if TYPE_CHECKING:
    from typing import Any


def plan(argv: list[str]) -> tuple[bool, list[list[str]]]:
    """Whether to fork the SSH carrier (`wanted`), and the receiver command line of each exec machine this
    command names (`--to NAME`, a reference) as wb.yaml's parsed copy gives it, `argv + [wb_path or wb,
    --wb-internal-agent-remote]` (what the exec channel runs for a one-shot call); the copy is read once for
    both. No receiver without a copy (no guess: the command is the user's own), and none for `--all`,
    `--to auto` or `wb machines`, which may never call a given machine."""
    named = _named(argv)
    if named is None:
        return False, []
    names, every = named
    targets = _targets()
    if targets is None:
        return True, []  # no parsed copy: the carrier on a guess, but no command of the user's
    ssh = any(_kind(body) == "ssh" for name, body in targets.items() if every or name in names)
    return ssh, [] if every else _receivers(targets, names)


def wanted(argv: list[str]) -> bool:
    """Whether this command is about to call a machine over SSH: it names another machine (`--to NAME`,
    `--to auto`, a reference `NAME:agt-…`, `--all`, `wb machines`) and wb.yaml, as its parsed copy says when
    there is one (courier/config_cache.py), has such an SSH machine. A wrong guess costs a copy that imports
    asyncssh for nothing, on another core."""
    return plan(argv)[0]


def _receivers(targets: dict[str, Any], names: set[str]) -> list[list[str]]:
    found = []
    for name in sorted(names):
        body = targets.get(name)
        way = body.get("exec") if _kind(body) == "exec" and isinstance(body, dict) else None
        if not isinstance(way, dict):
            continue
        command, wb_path = way.get("argv"), way.get("wb_path")
        if not isinstance(command, list) or not command or not all(isinstance(p, str) and p for p in command):
            continue
        if wb_path is None or (isinstance(wb_path, str) and wb_path):
            found.append([*command, wb_path or "wb", REMOTE_ARGUMENT])
    return found


def _kind(body: Any) -> str:
    """A target's channel as wb.yaml names it: "exec" for an `exec:` entry alone, else "ssh"."""
    return "exec" if isinstance(body, dict) and "exec" in body and "ssh" not in body else "ssh"


def _named(argv: list[str]) -> tuple[set[str], bool] | None:
    """The machines a command names, and whether it reaches every machine; None when it calls none."""
    if "--help" in argv or not argv or argv[0] not in ("agent", "machines"):
        return None
    names: set[str] = set()
    every = argv[0] == "machines" or "--all" in argv
    for i, token in enumerate(argv):
        if token == "--to" and i + 1 < len(argv):
            names.add(argv[i + 1])
        elif token.startswith("--to="):
            names.add(token[len("--to=") :])
        elif not token.startswith("-") and ":" in token and token.partition(":")[2].startswith("agt-"):
            names.add(token.partition(":")[0])
    if any(name == "auto" or name.startswith("auto:") for name in names):
        every = True
    if not (every or names):
        return None
    return names, every


def _targets() -> dict[str, Any] | None:
    """`session_move.targets` of wb.yaml's parsed copy ({} when it has none); None without a copy."""
    from courier import config_cache
    from courier.paths import config_path

    path = config_path()
    try:
        document = config_cache.read_copy(path, path.stat())
    except OSError:
        return None
    if document is None:
        return None
    targets = (document.get("session_move") or {}).get("targets") if isinstance(document, dict) else None
    return targets if isinstance(targets, dict) else {}
