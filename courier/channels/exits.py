"""The words for a remote command that ended without a usable reply: stderr, cut to one line.

Shared by the channels' exit rules (`Channel.classify_exit`) and the caller's refusal of a
reply it cannot trust (courier/call/caller.py).
"""

from __future__ import annotations

from courier.text import clip_bytes, sanitize
from protocol import limits


def stderr_excerpt(stderr: bytes) -> str:
    """One sanitised line of at most 1024 bytes: the end of stderr, where the error usually is."""
    text = " ".join(sanitize(stderr.decode("utf-8", "replace")).split())
    if not text:
        return "(nothing on stderr)"
    limit = limits.REMOTE_STDERR_EXCERPT_MAX_BYTES
    raw = text.encode()
    if len(raw) <= limit:
        return text
    marker = "…"
    tail = raw[len(raw) - (limit - len(marker.encode())) :].decode("utf-8", "ignore")
    return clip_bytes(marker + tail, limit)


def first_stderr_line(stderr: bytes) -> str:
    """The first line of stderr with a letter in it, sanitised, at most 1024 bytes (an exec command's own complaint).

    Lines without letters are decoration, not the complaint: ssh's changed-host-key warning
    starts with a row of `@`, and quoting that row alone tells the user nothing.
    """
    for line in stderr.decode("utf-8", "replace").splitlines():
        text = " ".join(sanitize(line).split())
        if any(character.isalpha() for character in text):
            return clip_bytes(text, limits.REMOTE_STDERR_EXCERPT_MAX_BYTES)
    return "(nothing on stderr)"
