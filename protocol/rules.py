"""The shape rules a request's fields must meet (docs/protocol.md#names-and-references; docs/cli.md#wb-agent-dispatch;
docs/protocol.md#the-request), each refusal a RequestRefused."""

from __future__ import annotations

from protocol import limits


class RequestRefused(ValueError):
    """A request that docs/protocol.md#the-request refuses; the message says what and how to fix it."""


def check_task(task: str) -> None:
    if not task.strip():
        raise RequestRefused("task is blank: give the worker something to do")
    size = len(task.encode("utf-8", "surrogatepass"))
    if size > limits.TASK_MAX_BYTES:
        raise RequestRefused(
            f"task is {size} bytes; the limit is {limits.TASK_MAX_BYTES} bytes ({limits.TASK_MAX_TEXT})"
        )
    try:
        task.encode("utf-8")
    except UnicodeEncodeError:
        raise RequestRefused("task is not valid UTF-8") from None


def check_ref_text(value: str, what: str) -> None:
    """Shape checks before git sees the value; git itself has the final word on the target."""
    if value.startswith("-"):
        raise RequestRefused(f'{what} "{value[:64]}" must not start with "-"')
    if len(value) > 256 or not value.isprintable() or any(ch.isspace() for ch in value):
        raise RequestRefused(f"{what} must be at most 256 printable characters without spaces")


def check_timeout_ms(value: int, what: str = "timeout_ms") -> None:
    if value <= 0:
        raise RequestRefused(f"{what} must be > 0")
    if value > limits.TIMEOUT_MAX_MS:
        raise RequestRefused(f"{what} must be at most {limits.TIMEOUT_MAX_MS} ({limits.TIMEOUT_MAX_TEXT})")
