"""Length-prefixed frames of byte fields on the courier's unix socket.

Light: the thin client imports it on every warm command, so it needs no module beyond
`_socket` (the C module under `socket`: the `socket` package's enum set-up alone costs a
warm command several milliseconds) and protocol.limits; lengths are packed with int.to_bytes.
"""

from __future__ import annotations

import _socket
import sys

from protocol import limits

_LENGTH_SIZE = 4
FRAME_MAX_BYTES = limits.COURIER_FRAME_MAX_BYTES
# The exit of a command whose courier went away under it, outcome unknown: a transport failure (docs/cli.md#exit-codes).
LOST_EXIT = limits.EXIT_TRANSPORT


class FrameError(Exception):
    """The peer sent something that is not a frame, or closed mid-frame."""


def _length(value: int) -> bytes:
    return value.to_bytes(_LENGTH_SIZE, "big")  # network order, as struct "!I"


def read_length(data: bytes, offset: int = 0) -> int:
    return int.from_bytes(data[offset : offset + _LENGTH_SIZE], "big")


def pack(fields: list[bytes]) -> bytes:
    """One frame: total length, field count, then each field length-prefixed."""
    body = b"".join(_length(len(item)) + item for item in fields)
    body = _length(len(fields)) + body
    return _length(len(body)) + body


def unpack(body: bytes) -> list[bytes]:
    if len(body) < _LENGTH_SIZE:
        raise FrameError("short frame")
    count = read_length(body)
    offset = _LENGTH_SIZE
    fields: list[bytes] = []
    for _ in range(count):
        if offset + _LENGTH_SIZE > len(body):
            raise FrameError("truncated frame")
        size = read_length(body, offset)
        offset += _LENGTH_SIZE
        if offset + size > len(body):
            raise FrameError("truncated field")
        fields.append(body[offset : offset + size])
        offset += size
    if offset != len(body):
        raise FrameError("trailing bytes in frame")
    return fields


def recv_exact(sock: _socket.socket, size: int) -> bytes:
    chunks: list[bytes] = []
    remaining = size
    while remaining:
        chunk = sock.recv(min(remaining, limits.READ_CHUNK_BYTES))
        if not chunk:
            raise FrameError("the peer closed the connection")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def recv_frame(sock: _socket.socket) -> list[bytes]:
    """One whole frame from a blocking socket."""
    size = read_length(recv_exact(sock, _LENGTH_SIZE))
    if size > FRAME_MAX_BYTES:
        raise FrameError(f"frame of {size} bytes is over the limit")
    return unpack(recv_exact(sock, size))


def send_frame(sock: _socket.socket, fields: list[bytes], fds: list[int] | None = None) -> None:
    data = pack(fields)
    if fds:
        # What socket.send_fds sends: the descriptors as an array of C ints (SCM_RIGHTS).
        rights = b"".join(fd.to_bytes(4, sys.byteorder, signed=True) for fd in fds)
        sent = sock.sendmsg([data], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, rights)])
        data = data[sent:]
    if data:
        sock.sendall(data)
