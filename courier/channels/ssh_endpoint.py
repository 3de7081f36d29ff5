"""One SSH machine as wb.yaml names it: what the SSH code (courier/channels/ssh_client.py) connects to, and what the
cold CLI hands its SSH carrier (courier/channels/ssh_carrier.py). Imports no asyncssh."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Endpoint:
    """One machine as wb.yaml names it; unset fields fall back to the ssh config, then defaults."""

    machine: str
    host: str
    user: str | None = None
    port: int | None = None
