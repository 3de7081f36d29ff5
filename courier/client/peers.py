"""What each configured machine last said it supports, kept between commands (docs/protocol.md#optional-features).

A caller sends an optional field (a budget) only to a peer that lists it: asking `version` first
would cost every such command a second round trip, a second SSH connection when cold. So the
client keeps each machine's last `version` answer in `<home>/peers.json` (0600, replaced
atomically), tied to the machine's target as configured (a changed address or channel is another
peer), and checks the `wb_version` every reply carries against it (courier/client/client.py).
The file holds no secret: versions and capability names.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from protocol import limits

PEERS_FILE = "peers.json"


@dataclass(frozen=True)
class Peer:
    wb_version: str | None
    capabilities: tuple[str, ...]


def target_key(target: Any) -> str:
    """The configured target, digested: what `version` was asked over."""
    return hashlib.sha256(target.model_dump_json().encode()).hexdigest()[:16]


def load(home: Path, machine: str, key: str) -> Peer | None:
    """The machine's last answer when it was asked over the same target; else None."""
    entry = _read(home).get(machine)
    if not isinstance(entry, dict) or entry.get("target") != key:
        return None
    version, capabilities = entry.get("wb_version"), entry.get("capabilities")
    if not (version is None or isinstance(version, str)) or not isinstance(capabilities, list):
        return None
    return Peer(version, tuple(item for item in capabilities if isinstance(item, str)))


def save(home: Path, machine: str, key: str, peer: Peer) -> None:
    """Keep the machine's answer; a home that cannot be written only costs the next command a question."""
    from courier.runs.store import write_private

    peers = _read(home)
    entry = {"target": key, "wb_version": peer.wb_version, "capabilities": list(peer.capabilities)}
    if peers.get(machine) == entry:
        return
    peers[machine] = entry
    with contextlib.suppress(OSError):
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_private(home / PEERS_FILE, json.dumps(peers, sort_keys=True).encode())


def _read(home: Path) -> dict[str, Any]:
    try:
        fd = os.open(home / PEERS_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        with os.fdopen(fd, "rb") as handle:
            document = json.loads(handle.read(limits.MIB))  # a few hundred bytes a machine
    except (OSError, ValueError):
        return {}
    return document if isinstance(document, dict) else {}
