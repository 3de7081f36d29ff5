"""Go's time.ParseDuration grammar (docs/cli.md#conventions-shared-by-every-command), returning whole milliseconds."""

from __future__ import annotations

import re

from protocol import limits

_UNIT_NS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "μs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


class BadDuration(ValueError):
    pass


def parse_duration_ms(text: str) -> int:
    """Parse `90s`, `1h30m`, `500ms`, `-1s` or `0` into milliseconds (rounded down)."""
    body = text.strip()
    sign = 1
    if body[:1] in "+-" and body:
        sign = -1 if body[0] == "-" else 1
        body = body[1:]
    if body == "0":
        return 0
    if not body:
        raise BadDuration(f'invalid duration "{text}": expected e.g. 90s, 30m, 1h30m, 500ms or 0')
    total_ns = 0.0
    position = 0
    for match in _PART.finditer(body):
        if match.start() != position:
            break
        total_ns += float(match.group(1)) * _UNIT_NS[match.group(2)]
        position = match.end()
    if position != len(body):
        raise BadDuration(f'invalid duration "{text}": expected e.g. 90s, 30m, 1h30m, 500ms or 0')
    return sign * int(total_ns // _UNIT_NS["ms"])


def format_duration_ms(ms: int) -> str:
    """Render milliseconds the way Go's Duration.String would, at millisecond precision."""
    if ms == 0:
        return "0s"
    sign = "-" if ms < 0 else ""
    ms = abs(ms)
    hours, rest = divmod(ms, limits.MS_PER_HOUR)
    minutes, rest = divmod(rest, limits.MS_PER_MINUTE)
    seconds = rest / limits.MS_PER_SECOND
    out = ""
    if hours:
        out += f"{hours}h"
    if hours or minutes:
        out += f"{minutes}m"
    out += f"{seconds:g}s"
    return sign + out


def default_duration(ms: int) -> str:
    """A bound from protocol/limits.py as a flag default, in its shortest Go spelling ("30m", "1h")."""
    return re.sub(r"(?<=h)0m$", "", re.sub(r"(?<=[hm])0s$", "", format_duration_ms(ms)))
