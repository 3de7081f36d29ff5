"""Sanitising foreign text before it reaches a terminal (docs/cli.md#conventions-shared-by-every-command): the one
sanitiser."""

from __future__ import annotations

import re

# Every character of Unicode categories Cc (controls), Cf (format: bidi, zero-width, soft
# hyphen, tags), Zl and Zp (U+2028, U+2029), and Cs (lone surrogates, which cannot even be
# encoded); written out so importing costs no walk over Unicode (a unit test checks the class
# against unicodedata). The ranges are a little wider than today's assignments where a block
# is reserved for format characters.
_UNSAFE_CLASS = (
    "\x00-\x09\x0b-\x1f\x7f-\x9f\xad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e"
    "\u200b-\u200f\u2028-\u202e\u2060-\u206f\ud800-\udfff\ufeff\ufff9-\ufffb"
    "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0001\U000e0020-\U000e007f"
)
_UNSAFE = re.compile(f"[{_UNSAFE_CLASS}]")
_UNSAFE_OR_NEWLINE = re.compile(f"[{_UNSAFE_CLASS}\n]")
_UNSAFE_ASCII = re.compile("[\x00-\x09\x0b-\x1f\x7f]")  # the ASCII members of _UNSAFE_CLASS


def sanitize(text: str, *, keep_newlines: bool = False) -> str:
    """Replace control, format (bidi, zero-width, soft hyphen), separator and surrogate characters with spaces."""
    return (_UNSAFE if keep_newlines else _UNSAFE_OR_NEWLINE).sub(" ", text)


def escape_controls(text: str) -> str:
    """Show the characters `sanitize` replaces as escapes (`\\x1b`, `\\u202e`); newlines stay."""
    return _UNSAFE.sub(lambda m: m.group().encode("unicode_escape", "backslashreplace").decode("ascii"), text)


def escape_json_unsafe(json_text: str) -> str:
    """JSON text with every character `sanitize` replaces written as a `\\uXXXX` escape (a surrogate
    pair above U+FFFF): bidi marks, U+2028/2029, zero-width characters, C1 controls, lone surrogates.

    The same document to any JSON parser, and none of them raw for a terminal, a log viewer or an
    older JavaScript parser (U+2028 ends a string there). `json_text` must come from a JSON encoder:
    those characters can then only stand inside strings (C0 controls there are escaped already).
    """
    if json_text.isascii():  # the usual document: only the ASCII part of the class can occur (4x faster)
        return _UNSAFE_ASCII.sub(_json_escape, json_text)
    return _UNSAFE.sub(_json_escape, json_text)


def _json_escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code > 0xFFFF:
        code -= 0x10000
        return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
    return f"\\u{code:04x}"


def clip_bytes(text: str, limit: int, marker: str = "…") -> str:
    """Cut text to at most `limit` UTF-8 bytes including the marker, on a character boundary."""
    raw = text.encode()
    if len(raw) <= limit:
        return text
    room = limit - len(marker.encode())
    return raw[:room].decode("utf-8", "ignore") + marker
