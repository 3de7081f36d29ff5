"""A run's final message: read without trusting the file, bounded to 4096 bytes (docs/protocol.md#bounds)."""

from __future__ import annotations

import codecs
import os
import stat

from protocol import limits


def _cut_utf8(data: bytes, limit: int) -> str:
    """At most `limit` bytes of `data` as text, dropping a character the cut split in two."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    return decoder.decode(data[:limit], final=False)


def message_bytes(text: str | None) -> tuple[bytes, int] | None:
    """(bytes, size) of a message taken from the stream, or None when there is none."""
    if not text:
        return None
    data = text.encode("utf-8", "replace")
    return data, len(data)


def read_message_file(path: str | os.PathLike[str], extra: int = 0) -> tuple[bytes, int] | None:
    """(first bytes, size) of a regular, non-empty file, reading at most the bound + 1 (+ extra) bytes; else None.

    Opened without following a symlink and without blocking on a FIFO the worker may have put there.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:  # a store file linked from elsewhere is not read
            return None
        want = limits.FINAL_MESSAGE_MAX_BYTES + 1 + extra
        data = b""
        while len(data) < want:
            piece = os.read(fd, want - len(data))
            if not piece:
                break
            data += piece
    except OSError:
        return None
    finally:
        os.close(fd)
    if not data:
        return None
    # The size on disk, unless the file grew or shrank while being read.
    size = info.st_size if len(data) > limits.FINAL_MESSAGE_MAX_BYTES else len(data)
    return data, max(size, len(data))


def bounded_message(data: bytes, size: int, *, secret: bytes = b"", mask: bytes = b"") -> str:
    """The stored final message: `secret` masked first (a cut never leaves a fragment), then the bound.

    Longer than 4096 bytes → the first 4096 plus `\\n[… truncated: the final message was N bytes]`.
    """
    if secret and secret in data:
        data = data.replace(secret, mask)
        size += data.count(mask) * (len(mask) - len(secret))
    if size <= limits.FINAL_MESSAGE_MAX_BYTES:
        return data.decode("utf-8", "replace")
    cut = _cut_utf8(data, limits.FINAL_MESSAGE_MAX_BYTES)
    return f"{cut}\n[… truncated: the final message was {size} bytes]"
