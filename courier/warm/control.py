"""`wb courier status` and `wb courier stop`: ask this environment's courier over its socket."""

from __future__ import annotations

import json
import os
import socket
from typing import Any

from courier.channels import courier_frames as frames
from courier.channels import courier_socket as place

_TIMEOUT_S = 10.0


def _ask(kind: bytes) -> list[bytes] | None:
    """The courier's answer, or None when no courier serves this environment."""
    path = place.socket_path(os.environ)
    if path is None:
        return None
    sock = place.connect(path, socket.socket, _TIMEOUT_S)
    if sock is None:
        return None
    try:
        frames.send_frame(sock, [kind])
        return frames.recv_frame(sock)
    except (OSError, frames.FrameError):
        return None
    finally:
        sock.close()


def where() -> str | None:
    return place.socket_path(os.environ)


def why_nowhere() -> str:
    """Why `where()` is None ("" when it is not)."""
    return place.no_run_dir_reason(os.environ)


def status() -> dict[str, Any] | None:
    reply = _ask(b"status")
    if not reply or reply[0] != b"status" or len(reply) != 2:
        return None
    document = json.loads(reply[1])
    return document if isinstance(document, dict) else None


def stop() -> int | None:
    """The stopped courier's pid, or None when none was running."""
    reply = _ask(b"stop")
    if not reply or reply[0] != b"stopping" or len(reply) != 2:
        return None
    return int(reply[1])
