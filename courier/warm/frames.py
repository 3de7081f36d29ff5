"""Length-prefixed frames of byte fields on the courier's unix socket (light: struct and socket only)."""

from __future__ import annotations

import socket
import struct

from protocol import limits

_LENGTH = struct.Struct("!I")
FRAME_MAX_BYTES = 64 * 1024 * 1024  # above any request (8 MiB) or reply (4 MiB + 64 KiB) plus an environment


class FrameError(Exception):
    """The peer sent something that is not a frame, or closed mid-frame."""


def pack(fields: list[bytes]) -> bytes:
    """One frame: total length, field count, then each field length-prefixed."""
    body = b"".join(_LENGTH.pack(len(item)) + item for item in fields)
    body = _LENGTH.pack(len(fields)) + body
    return _LENGTH.pack(len(body)) + body


def unpack(body: bytes) -> list[bytes]:
    if len(body) < _LENGTH.size:
        raise FrameError("short frame")
    (count,) = _LENGTH.unpack_from(body, 0)
    offset = _LENGTH.size
    fields: list[bytes] = []
    for _ in range(count):
        if offset + _LENGTH.size > len(body):
            raise FrameError("truncated frame")
        (size,) = _LENGTH.unpack_from(body, offset)
        offset += _LENGTH.size
        if offset + size > len(body):
            raise FrameError("truncated field")
        fields.append(body[offset : offset + size])
        offset += size
    if offset != len(body):
        raise FrameError("trailing bytes in frame")
    return fields


def recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks: list[bytes] = []
    remaining = size
    while remaining:
        chunk = sock.recv(min(remaining, limits.READ_CHUNK_BYTES))
        if not chunk:
            raise FrameError("the peer closed the connection")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def recv_frame(sock: socket.socket) -> list[bytes]:
    """One whole frame from a blocking socket."""
    (size,) = _LENGTH.unpack(recv_exact(sock, _LENGTH.size))
    if size > FRAME_MAX_BYTES:
        raise FrameError(f"frame of {size} bytes is over the limit")
    return unpack(recv_exact(sock, size))


def send_frame(sock: socket.socket, fields: list[bytes], fds: list[int] | None = None) -> None:
    data = pack(fields)
    if fds:
        sent = socket.send_fds(sock, [data], fds)
        data = data[sent:]
    if data:
        sock.sendall(data)
