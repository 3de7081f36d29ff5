"""The head's own records of the runs it placed on a Ray cluster (docs/ray.md#what-the-head-keeps).

A run's record (run.json, transcript, worktree) lives on the node that runs it, in that
node's store. The head keeps only what it needs before and around that: one small JSON file
per run, `<home>/ray/<agent_id>.json` (0600 in a 0700 directory, replaced atomically), with
what the Result of a queued run shows (profile, resolved, repository, worktree, what it waits
for), the node once the run is found there, and the last Result the head saw of it, so that a
run whose node is gone can still be reported (`abandoned`, `failure: node <node> lost`).
Never the task.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from courier.errors import NotFound
from courier.runs.store import write_private
from protocol.models import Resolved, Result
from protocol.refs import check_run_id
from protocol.timestamps import rfc3339, utc_now

QUEUED, PLACED, ENDED = "queued", "placed", "ended"  # ENDED: it ended before any node started it


@dataclass
class Placement:
    agent_id: str
    created_at: str
    profile: str
    resolved: dict[str, Any]
    repository: str
    worktree_mode: str
    worktree: str
    wants: str  # "cpus=2, gpus=1": what the status line says it waits for
    branch: str = ""
    base: str = ""
    parent_id: str = ""
    phase: str = QUEUED
    node: str = ""  # the node's name (its `wb-node` label), once the run is found there
    node_id: str = ""  # Ray's node ID: liveness is decided by it
    pinned_node_id: str = ""  # continue: the run must start on its parent's node
    failure: str = ""  # ENDED: why
    finished_at: str = ""
    last: dict[str, Any] | None = field(default=None)  # the last Result seen from its node

    def queued_result(self) -> Result:
        return Result(
            agent_id=self.agent_id,
            state="queued",
            terminal=False,
            profile=self.profile,
            resolved=Resolved.model_validate(self.resolved),
            repository=self.repository,
            worktree_mode=self.worktree_mode,  # type: ignore[arg-type]
            worktree=self.worktree,
            branch=self.branch or None,
            base=self.base or None,
            started_at=self.created_at,
            parent_id=self.parent_id or None,
            queued_for=self.wants,
        )

    def ended_result(self) -> Result:
        result = self.queued_result()
        result.state, result.terminal, result.queued_for = "failed", True, None
        result.failure, result.finished_at = self.failure, self.finished_at or None
        return result

    def lost_result(self) -> Result:
        """Its node is gone: the last Result seen (or the queued facts), `abandoned` (docs/ray.md#failure-modes)."""
        result = Result.model_validate(self.last) if self.last else self.queued_result()
        result.state, result.terminal, result.queued_for = "abandoned", True, None
        result.owner_alive = result.worker_alive = False
        result.node = self.node or None
        result.failure = f"node {self.node or self.node_id[:12]} lost"
        return result


class Placements:
    """`<home>/ray/`: one file per run placed from this head."""

    def __init__(self, home: Path) -> None:
        self.root = home / "ray"

    def ensure(self) -> Placements:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        return self

    def path(self, agent_id: str) -> Path:
        return self.root / f"{check_run_id(agent_id)}.json"

    def exists(self, agent_id: str) -> bool:
        return self.path(agent_id).is_file()

    def save(self, placement: Placement) -> None:
        self.ensure()
        write_private(self.path(placement.agent_id), json.dumps(asdict(placement)).encode())

    def load(self, agent_id: str) -> Placement:
        try:
            fd = os.open(self.path(agent_id), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise NotFound(f"unknown agent run {agent_id} (no run placed from this Ray head: {self.root})") from None
        with os.fdopen(fd, "rb") as handle:
            return Placement(**json.loads(handle.read()))

    def all(self) -> list[Placement]:
        if not self.root.is_dir():
            return []
        found = []
        for entry in self.root.iterdir():
            if entry.suffix == ".json" and not entry.name.startswith(".") and not entry.is_symlink():
                with contextlib.suppress(OSError, ValueError, TypeError, NotFound):
                    found.append(self.load(entry.stem))
        return found

    def remove(self, agent_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path(agent_id).unlink()


def now() -> str:
    return rfc3339(utc_now())


def wants_text(cpus: float, gpus: float, memory: str | int | None, custom: dict[str, float | int]) -> str:
    """`cpus=2, gpus=1`: the amounts a run asks for, as the status line shows them (zero gpus omitted)."""
    parts = [f"cpus={cpus:g}"]
    if gpus:
        parts.append(f"gpus={gpus:g}")
    if memory:
        parts.append(f"memory={memory}")
    parts += [f"{name}={amount:g}" for name, amount in sorted(custom.items())]
    return ", ".join(parts)
