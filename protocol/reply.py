"""Finding the reply document in a remote's stdout, and refusing hostile JSON (docs/protocol.md#the-callers-rules).

A login shell may print noise before the document, so the candidates are offset 0 and
every `{` that starts a line; the document is the first candidate whose remainder,
trailing whitespace trimmed, is exactly one JSON object with an integer `schema_version`.
Deep nesting, huge numbers, NaN/Infinity and trailing garbage are refused, never
crashed on.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from typing import Any

from protocol import limits

# Go's int64 has 19 digits; a sign makes 20. Anything longer is not a protocol number.
_MAX_NUMBER_CHARS = 20
_MAX_FLOAT_CHARS = 64
_WHITESPACE = " \t\r\n"


class BadReply(ValueError):
    """The remote's stdout holds no trustworthy reply document; the message says why."""


class _Refused(ValueError):
    pass


def _parse_int(text: str) -> int:
    if len(text) > _MAX_NUMBER_CHARS:
        raise _Refused(f"a number with {len(text)} digits")
    return int(text)


def _parse_float(text: str) -> float:
    if len(text) > _MAX_FLOAT_CHARS:
        raise _Refused(f"a number of {len(text)} characters")
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"the out-of-range number {text[:32]}")
    return value


def _parse_constant(text: str) -> Any:
    raise _Refused(f"the non-JSON constant {text}")


_DECODER = json.JSONDecoder(parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant)


def nesting_depth(value: Any) -> int:
    """The deepest container nesting of a decoded value, computed without recursion.

    Level by level, carrying only the containers: a `list --all` reply holds thousands of
    scalars, and the walk must not touch each one twice (docs/benchmarks.md, fleet).
    """
    deepest = 0
    level = [value] if isinstance(value, (dict, list)) else []
    while level:
        deepest += 1
        below: list[Any] = []
        for item in level:
            children = item.values() if isinstance(item, dict) else item
            below.extend([child for child in children if isinstance(child, (dict, list))])
        level = below
    return deepest


# Outside a string a JSON document's only structure is brackets; strings never span lines.
_LINE_TOKEN = re.compile(r'"(?:[^"\\\n]|\\.)*"?|[{}\[\]]')


def _document_start(text: str, end: int) -> int | None:
    """Where the only candidate that can decode starts: the `{` matching the final `}`.

    A candidate's document ends at the bracket matching its own `{`, so at most one
    candidate (the one whose `{` matches the last `}`) can reach the end of the output.
    Finding it with one backward pass keeps hostile output with many `\n{` lines linear.
    """
    if end == 0 or text[end - 1] != "}":
        return None
    depth = 0
    line_end = end
    while line_end > 0:
        line_start = text.rfind("\n", 0, line_end) + 1
        brackets = [m for m in _LINE_TOKEN.finditer(text, line_start, line_end) if m.group() in "{}[]"]
        for match in reversed(brackets):
            depth += 1 if match.group() in "}]" else -1
            if depth == 0:
                position = match.start()
                if match.group() != "{":
                    return None
                at_line_start = position == line_start
                return position if at_line_start or not text[:position].strip(_WHITESPACE) else None
        line_end = line_start - 1
    return None


def _decode_at(text: str, start: int, end: int) -> dict[str, Any]:
    """Decode text[start:end] as exactly one JSON object with an integer schema_version."""
    begin = start
    while begin < end and text[begin] in _WHITESPACE:
        begin += 1
    if begin == end:
        raise BadReply("it is empty")
    if text[begin] != "{":
        raise BadReply("it is not a JSON object")
    try:
        document, stop = _DECODER.raw_decode(text, begin)
    except _Refused as exc:
        raise BadReply(f"it contains {exc}") from None
    except RecursionError:
        raise BadReply(f"it is nested deeper than {limits.REPLY_MAX_NESTING} levels") from None
    except json.JSONDecodeError as exc:
        raise BadReply(f"it is not valid JSON ({exc.msg} at byte {exc.pos - begin} of the document)") from None
    except ValueError as exc:  # e.g. the interpreter's own integer-digits limit
        raise BadReply(f"it contains an unusable value ({str(exc)[:120]})") from None
    if stop != end:
        raise BadReply(f"it has {end - stop} bytes of trailing garbage after the document")
    if not isinstance(document, dict):
        raise BadReply("it is not a JSON object")
    try:
        text[begin:stop].encode("utf-8")
    except UnicodeEncodeError:
        raise BadReply("it is not valid UTF-8") from None
    if nesting_depth(document) > limits.REPLY_MAX_NESTING:
        raise BadReply(f"it is nested deeper than {limits.REPLY_MAX_NESTING} levels")
    version = document.get("schema_version")
    if type(version) is not int:
        raise BadReply("its schema_version is missing or not an integer")
    return document


# A JSON string on one line (an unterminated one runs to the end of its line).
_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"?')


def _containers(text: str) -> int:
    """How many `{` and `[` stand outside strings: at C speed, and exact only when the quick count is over."""
    quick = text.count("{") + text.count("[")
    if quick <= limits.REPLY_CONTAINERS_MAX:
        return quick
    bare = _STRING.sub("", text)
    return bare.count("{") + bare.count("[")


_EMPTY_CONTAINER = re.compile(r"\{[ \t\r\n]*\}|\[[ \t\r\n]*\]")


def _values(text: str) -> int:
    """How many JSON values (scalars included) the text holds at most: at C speed, exact only when over.

    Every value but the outermost is an element of a non-empty container, whose n elements
    are separated by n - 1 commas, so the count is 1 + commas + non-empty containers, all
    outside strings. Counting them on the raw text (strings included) can only count more.
    """
    quick = 1 + text.count(",") + text.count("{") + text.count("[")
    if quick <= limits.REPLY_VALUES_MAX:
        return quick
    bare = _STRING.sub('""', text)
    containers = bare.count("{") + bare.count("[")
    return 1 + bare.count(",") + containers - len(_EMPTY_CONTAINER.findall(bare))


def find_reply(data: bytes) -> dict[str, Any]:
    """The reply document in a remote's stdout; BadReply saying why when there is none."""
    if not data.strip():
        raise BadReply("the reply is empty")
    text = data.decode("utf-8", "surrogateescape")
    if _containers(text) > limits.REPLY_CONTAINERS_MAX:
        # Refused before decoding or scanning it: each would build one Python object per bracket.
        raise BadReply(f"it holds more than {limits.REPLY_CONTAINERS_MAX} JSON objects and arrays")
    if _values(text) > limits.REPLY_VALUES_MAX:
        raise BadReply(f"it holds more than {limits.REPLY_VALUES_MAX} JSON values")
    end = len(text.rstrip(_WHITESPACE))
    if text.lstrip(_WHITESPACE).startswith("{"):
        # Offset 0 is the first candidate: when it decodes, it is the reply, and the backward
        # bracket scan (linear, but a regex step per character of a 1 MiB patch) is not needed.
        with contextlib.suppress(BadReply):
            return _decode_at(text, 0, end)
    start = _document_start(text, end)
    try:
        # Without a matching candidate, offset 0's failure is the most useful reason.
        return _decode_at(text, 0 if start is None else start, end)
    except BadReply as exc:
        raise BadReply(f"no reply document found ({exc})") from None
