"""Reading one HTTP/1.1 request body from a `http.server` handler: the metering relay and the
demo's scripted model servers read the same bodies (Content-Length or chunked)."""

from __future__ import annotations

from email.message import Message
from io import BufferedIOBase
from typing import Final

from protocol import limits

# A model request carries a whole conversation; past this it is refused, not buffered.
MAX_BODY_BYTES: Final = limits.HTTP_BODY_MAX_BYTES


def read_body(rfile: BufferedIOBase, headers: Message) -> bytes:
    """The request body, de-chunked; ValueError past MAX_BODY_BYTES."""
    if headers.get("transfer-encoding", "").lower() != "chunked":
        length = int(headers.get("content-length") or 0)
        if length > MAX_BODY_BYTES:
            raise ValueError("request body too large")
        return rfile.read(length) if length > 0 else b""
    data = b""
    while True:
        size = int(rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
        if size == 0:
            while rfile.readline() not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return data
        data += rfile.read(size)
        rfile.readline()
        if len(data) > MAX_BODY_BYTES:
            raise ValueError("request body too large")
