"""The one RFC 3339 rule (docs/cli.md#results): UTC, millisecond precision, `Z`; parsing accepts any offset."""

from __future__ import annotations

from datetime import UTC, datetime

from protocol import limits


def utc_now() -> datetime:
    return datetime.now(UTC)


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_rfc3339(text: str) -> datetime:
    """ValueError for text that is not a timestamp."""
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def epoch_seconds(text: str, default: float = 0.0) -> float:
    """The timestamp as seconds since the epoch, `default` when it does not parse."""
    try:
        return parse_rfc3339(text).timestamp()
    except ValueError:
        return default


def rfc3339_ms(epoch_ms: int) -> str:
    """Milliseconds since the epoch as the one RFC 3339 form."""
    return rfc3339(datetime.fromtimestamp(epoch_ms / limits.MS_PER_SECOND, UTC))
