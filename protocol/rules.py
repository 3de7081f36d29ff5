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


def token_bound_ok(tokens: int) -> bool:
    """The one budget rule for tokens (docs/cli.md#budgets): a bound is at least one token."""
    return tokens >= 1


def cost_bound_ok(dollars: float) -> bool:
    """The one budget rule for cost (docs/cli.md#budgets): above $0 and at most COST_USD_MAX (not NaN)."""
    return 0 < dollars <= limits.COST_USD_MAX


def check_budget(max_tokens: int, max_cost_usd: float) -> None:
    """A request's budget fields, where 0 means no bound; the flags' check (courier/commands.py) uses the same
    rule, so the caller and the receiver refuse exactly the same values."""
    if max_tokens and not token_bound_ok(max_tokens):
        raise RequestRefused("max_tokens must be a whole number of at least 1 (0: no bound)")
    if max_cost_usd and not cost_bound_ok(max_cost_usd):
        raise RequestRefused(f"max_cost_usd must be above 0 and at most {limits.COST_USD_MAX:g} dollars (0: no bound)")
