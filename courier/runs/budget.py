"""Run budgets (docs/cli.md#budgets, docs/cli.md): which bounds are in force, which are refused, when one is crossed."""

from __future__ import annotations

from courier.config import Profile
from courier.errors import UsageError
from courier.runs.harness import spec_for
from protocol.models import Budget, Price, RemoteRequest, UsageLimitPolicy


def budget_in_force(profile: Profile, request: RemoteRequest) -> Budget | None:
    """The profile's budget, each bound replaced by the request's flag when given (--max-tokens, --max-cost-usd)."""
    setting = profile.budget
    tokens = request.max_tokens or (setting.tokens if setting else None)
    cost = request.max_cost_usd or (setting.cost_usd if setting else None)
    if tokens is None and not cost:
        return None
    return Budget(tokens=tokens, cost_usd=float(cost) if cost else None)


def price_of(profile: Profile) -> Price | None:
    """The profile's price as the record keeps it (docs/config.md#price)."""
    setting = profile.price
    if setting is None:
        return None
    return Price.model_validate(setting.model_dump())


def check_budget(budget: Budget | None, harness: str, profile_name: str, price: Price | None = None) -> None:
    """Refuse a bound the harness cannot be held to: unknown usage never counts as zero (exit 2).

    A cost bound is checked after every model response: from its tokens at the profile's `price`, or from a
    harness whose stream reports each response's cost (none of the supported CLIs does)."""
    if budget is None:
        return
    spec = spec_for(harness)
    if not spec.wire_apis:
        raise UsageError(
            f"profile {profile_name}: harness {spec.name} reports no usage, so a budget cannot be enforced for it; "
            "drop budget from the profile and --max-tokens/--max-cost-usd from the command"
        )
    if budget.cost_usd is not None and price is None and not spec.reports_cost:
        raise UsageError(
            f"profile {profile_name}: harness {spec.name} ({spec.display}) reports no cost per model response, so a "
            "cost_usd budget cannot be enforced without a price; give the profile a price "
            "(price: {input_usd_per_mtok: X, output_usd_per_mtok: Y}) or bound its tokens instead "
            "(budget.tokens or --max-tokens)"
        )


def usage_limit_policy(profile: Profile, harness: str, profile_name: str) -> UsageLimitPolicy | None:
    """The profile's on_usage_limit as the record keeps it; refused for a harness that cannot resume (exit 2)."""
    setting = profile.on_usage_limit
    if setting is None or not setting.resume:
        return None
    spec = spec_for(harness)
    if not spec.can_resume:
        raise UsageError(
            f"profile {profile_name}: harness {spec.name} cannot resume a session, so on_usage_limit.resume "
            "cannot be honoured; drop on_usage_limit from the profile"
        )
    return UsageLimitPolicy(max_waits=setting.max_waits, max_wait_ms=setting.max_wait_ms, prompt=setting.prompt)


def exceeded(budget: Budget | None, tokens: int | None, cost_usd: float | None) -> str | None:
    """The failure once a bound is crossed (`budget exceeded: 12,345 tokens of 10,000`), else None."""
    if budget is None:
        return None
    if budget.tokens is not None and tokens is not None and tokens > budget.tokens:
        return f"budget exceeded: {tokens:,} tokens of {budget.tokens:,}"
    if budget.cost_usd is not None and cost_usd is not None and cost_usd > budget.cost_usd:
        return f"budget exceeded: ${cost_usd:.4f} of ${budget.cost_usd:.4f}"
    return None
