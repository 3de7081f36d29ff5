"""Sanitising foreign text before it reaches a terminal (contract §3)."""

from __future__ import annotations

import re

# C0/C1 controls, DEL, bidi controls and zero-width characters.
_UNSAFE = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]")
_UNSAFE_OR_NEWLINE = re.compile(_UNSAFE.pattern[:-1] + r"\n]")


def sanitize(text: str, *, keep_newlines: bool = False) -> str:
    """Replace control, bidi and zero-width characters with spaces."""
    return (_UNSAFE if keep_newlines else _UNSAFE_OR_NEWLINE).sub(" ", text)


def escape_controls(text: str) -> str:
    """Show control, bidi and zero-width characters as escapes (`\\x1b`, `\\u202e`); newlines stay."""
    return _UNSAFE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def clip_bytes(text: str, limit: int, marker: str = "…") -> str:
    """Cut text to at most `limit` UTF-8 bytes including the marker, on a character boundary."""
    raw = text.encode()
    if len(raw) <= limit:
        return text
    room = limit - len(marker.encode())
    return raw[:room].decode("utf-8", "ignore") + marker
