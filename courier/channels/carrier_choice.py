"""Whether a cold command forks the SSH carrier (courier/channels/ssh_carrier.py), judged before anything is imported.

Imports nothing until it reads wb.yaml's parsed copy: every cold command asks, most of them to hear no.
"""

from __future__ import annotations


def wanted(argv: list[str]) -> bool:
    """Whether this command is about to call a machine over SSH: it names another machine (`--to NAME`,
    `--to auto`, a reference `NAME:agt-…`, `--all`, `wb machines`) and wb.yaml, as its parsed copy says when
    there is one (courier/config_cache.py), has such an SSH machine. A wrong guess costs a copy that imports
    asyncssh for nothing, on another core."""
    if "--help" in argv or not argv or argv[0] not in ("agent", "machines"):
        return False
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
        return False
    kinds = _machine_kinds()
    if kinds is None:
        return True  # no parsed copy to ask: a guess
    return any(kind == "ssh" for name, kind in kinds.items() if every or name in names)


def _machine_kinds() -> dict[str, str] | None:
    """Each machine's channel ("ssh" or "exec") as wb.yaml's parsed copy names it; None without a copy."""
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
    if not isinstance(targets, dict):
        return {}
    return {
        str(name): "exec" if isinstance(body, dict) and "exec" in body and "ssh" not in body else "ssh"
        for name, body in targets.items()
    }
