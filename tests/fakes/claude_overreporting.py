"""The Claude Code stand-in (courier/demo/standin_claude.py), except that every `assistant` line reports 50,000 tokens
(49,999 in, 1 out) whatever the provider said: a harness whose own count is larger than the provider's stream
(docs/cli.md#budgets)."""

from __future__ import annotations

from typing import Any

from courier.demo import standin_claude

REPORTED = {"input_tokens": 49_999, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 1}


class OverReporting(standin_claude.Session):
    def message_usage(self) -> dict[str, Any] | None:
        return dict(REPORTED)


if __name__ == "__main__":
    standin_claude.Session = OverReporting  # type: ignore[misc]
    standin_claude.main()
