"""The Claude Code harness (docs/harnesses.md): `claude -p --output-format stream-json`, its stream, its terminal rule.

Facts used here (Claude Code 2.1.328, checked with the real binary; docs/harnesses.md):
one `assistant` line per content block; `user` lines carry tool results; a run ends with one
`result` line (`is_error`, `result`, `usage`, `total_cost_usd`), except when it is interrupted
(SIGINT exits 0 with no `result`). Unknown types and keys are ignored.
"""

from __future__ import annotations

import os
import re
from typing import Any

from courier.runs.harness.interface import EventParser, Harness, Launch, MessageUsage, is_usage_limit, plural_files
from courier.runs.harness.lines import clean
from protocol import limits
from protocol.models import Usage

CREDENTIAL_ENV = "ANTHROPIC_API_KEY"
BASE_URL_ENV = "ANTHROPIC_BASE_URL"
FILE_TOOLS = frozenset({"Edit", "Write", "MultiEdit", "NotebookEdit"})
# acceptEdits: file edits inside the working directory need no prompt; Bash: commands need none;
# --permission-prompts none: anything else that would prompt is denied at once, never waited on.
NARROW_PERMISSIONS = ("--permission-mode", "acceptEdits", "--allowedTools", "Bash", "--permission-prompts", "none")
BYPASS_PERMISSIONS = ("--permission-mode", "bypassPermissions")


_RESET_EPOCH = re.compile(r"limit reached\|(\d{9,11})\b")
_SESSION_ID = re.compile(r"[0-9A-Za-z][0-9A-Za-z-]{0,127}")


def claude_argv(launch: Launch) -> list[str]:
    """The exact command line; the task goes on stdin. ValueError for what Claude Code would refuse."""
    if not launch.model or launch.model.startswith("-"):
        raise ValueError(f"model {launch.model!r} must be a non-empty identifier not starting with '-'")
    argv = ["claude", "-p", "--output-format", "stream-json", "--verbose", "--model", launch.model]
    if launch.reasoning is not None:
        argv += ["--effort", launch.reasoning]
    # No settings file (user, project or local: they may hold hooks or permission rules) and
    # only the MCP servers named by --mcp-config, of which there are none.
    argv += ["--setting-sources", "", "--strict-mcp-config"]
    if launch.permissions == "bypass":
        if os.geteuid() == 0:
            raise ValueError(
                "permissions: bypass cannot run as root: Claude Code refuses bypassPermissions with root privileges; "
                "run wb as a normal user or drop permissions: bypass from the profile"
            )
        argv += BYPASS_PERMISSIONS
    else:
        argv += NARROW_PERMISSIONS
    if launch.resume_session is not None:
        # docs/cli.md, wb agent continue; the `=` form, as the official SDK passes it, so an ID is never read as a flag.
        if not _SESSION_ID.fullmatch(launch.resume_session):
            raise ValueError(f"session ID {launch.resume_session!r} is not a Claude Code session ID")
        argv.append(f"--resume={launch.resume_session}")
    return argv


# --------------------------------------------------------------------------- events


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def usage_of(result: dict[str, Any]) -> Usage | None:
    """Usage (docs/cli.md#results) from a `result` event: `input_tokens` counts cache reads and writes (Anthropic's
    does not)."""
    usage = result.get("usage")
    if not isinstance(usage, dict):
        return None
    plain = _count(usage.get("input_tokens"))
    read = _count(usage.get("cache_read_input_tokens"))
    write = _count(usage.get("cache_creation_input_tokens"))
    output = _count(usage.get("output_tokens"))
    if plain is None and output is None:
        return None
    details = usage.get("output_tokens_details")
    thinking = _count(details.get("thinking_tokens")) if isinstance(details, dict) else None
    cost = result.get("total_cost_usd")
    return Usage(
        input_tokens=(plain or 0) + (read or 0) + (write or 0),
        cached_input_tokens=read,
        cache_write_input_tokens=write,
        output_tokens=output or 0,
        reasoning_output_tokens=thinking,
        cost_usd=float(cost) if isinstance(cost, int | float) and not isinstance(cost, bool) and cost >= 0 else None,
    )


def message_usage_of(event: dict[str, Any]) -> MessageUsage | None:
    """An `assistant` line's `message.usage`, by `message.id` (docs/cli.md#budgets): Claude Code repeats it on
    every content block of the message; its output count is the one of `message_start`."""
    message = event.get("message")
    if not isinstance(message, dict):
        return None
    message_id, usage = message.get("id"), message.get("usage")
    if not isinstance(message_id, str) or not 0 < len(message_id) <= 256 or not isinstance(usage, dict):
        return None
    counts = [_count(usage.get(key)) for key in ("input_tokens", "cache_read_input_tokens",
                                                   "cache_creation_input_tokens", "output_tokens")]  # fmt: skip
    if all(count is None for count in counts):
        return None
    plain, read, write, output = (count or 0 for count in counts)
    return MessageUsage(message_id, plain + read + write, output, read)


def _tool_uses(event: dict[str, Any]) -> list[dict[str, Any]]:
    message = event.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, list):
        return []
    return [block for block in content if isinstance(block, dict) and block.get("type") == "tool_use"]


def _result_error(event: dict[str, Any]) -> str:
    """What a `result` with is_error says: its `errors`, else its `result` text, else its subtype."""
    errors = event.get("errors")
    if isinstance(errors, list) and any(isinstance(e, str) for e in errors):
        return "; ".join(e for e in errors if isinstance(e, str))
    text = event.get("result")
    if isinstance(text, str) and text:
        return text
    kind = event.get("subtype") or event.get("terminal_reason")
    return str(kind) if isinstance(kind, str) else "no message"


def _retry_notice(event: dict[str, Any]) -> str:
    attempt, most = event.get("attempt"), event.get("max_retries")
    status, error = event.get("error_status"), event.get("error")
    cause = " ".join(str(part) for part in (status, error) if isinstance(part, str | int) and part != "")
    return f"API retry {attempt}/{most}" + (f" ({cause})" if cause else "")


def actions_of(event: dict[str, Any]) -> list[str]:
    """The worker actions (docs/runs.md#summaries) of one event: tool_use blocks, retries, denials and a failed
    result."""
    kind = event.get("type")
    if kind == "assistant":
        actions: list[str] = []
        for block in _tool_uses(event):
            name = block.get("name")
            tool_input = block.get("input")
            if name == "Bash":
                command = tool_input.get("command") if isinstance(tool_input, dict) else None
                actions.append(f"ran: {command if isinstance(command, str) else '?'}")
            elif name in FILE_TOOLS:
                actions.append(plural_files(1))
            elif isinstance(name, str) and name.startswith("mcp__"):
                server, _, tool = name.removeprefix("mcp__").partition("__")
                actions.append(f"called {server}.{tool or '?'}")
        return actions
    if kind == "system":
        subtype = event.get("subtype")
        if subtype == "api_retry":
            return [f"diagnostic: {_retry_notice(event)}"]
        if subtype == "permission_denied":
            denial = event.get("message")
            return [f"diagnostic: {denial if isinstance(denial, str) else 'permission denied'}"]
        return []
    if kind == "result" and event.get("is_error") is not False:
        return [f"diagnostic: {_result_error(event)}"]
    return []


class ClaudeEvents(EventParser):
    """What a Claude Code stream-json stream said, one line at a time, in bounded memory."""

    reports_message_usage = True

    def __init__(self) -> None:
        super().__init__()
        self.result_seen = False
        self.result_failed = False
        self.failure_message: str | None = None

    def event(self, event: dict[str, Any], line: bytes) -> bytes:
        kind = event.get("type")
        if self.session_id is None and isinstance(event.get("session_id"), str):
            self.session_id = event["session_id"]
        if kind == "assistant":
            self.tool_calls += len(_tool_uses(event))
            usage = message_usage_of(event)
            if usage is not None:
                self.message_usage(usage)
        elif kind == "system" and event.get("subtype") in ("api_retry", "permission_denied"):
            for action in actions_of(event):
                self.diagnose(action.removeprefix("diagnostic: "))
        elif kind == "result":
            self._result(event)
        return line

    def _result(self, event: dict[str, Any]) -> None:
        self.result_seen = True
        self.usage = usage_of(event) or self.usage
        if event.get("is_error") is False:
            self.result_failed = False
            self.failure_message = None
            text = event.get("result")
            self.last_message = text if isinstance(text, str) else None
        else:
            self.result_failed = True
            self.failure_message = clean(_result_error(event), limits.RUN_FAILURE_MESSAGE_MAX_BYTES)
            # "API Error: Request rejected (429) · Rate limit reached …", api_error_status 429.
            if event.get("api_error_status") == 429 or is_usage_limit(self.failure_message):
                self.usage_limit = self.failure_message
                # A subscription's "Claude AI usage limit reached|<epoch seconds>" names its reset time.
                reset = _RESET_EPOCH.search(self.failure_message)
                self.limit_reset_at = float(reset.group(1)) if reset else None

    def failure(self, exit_code: int | None) -> str | None:
        """Success is exit 0 and a `result` with is_error false (SIGINT exits 0 without one)."""
        reported = f"harness reported an error: {self.failure_message or 'no message'}"
        if exit_code not in (None, 0):
            return f"harness exited with code {exit_code}" + (f"; {reported}" if self.result_failed else "")
        if not self.result_seen:
            return "no result event"
        if self.result_failed:
            return reported
        return None


class Claude(Harness):
    """Claude Code: `claude -p --output-format stream-json --verbose`, CLAUDE_CONFIG_DIR private to the run."""

    name = "claude"

    def argv(self, launch: Launch) -> list[str]:
        return claude_argv(launch)

    def environment(self, launch: Launch, env: dict[str, str]) -> dict[str, str]:
        """The credential under the one name Claude Code reads, whatever variable the provider names."""
        env = dict(env)
        value = env.pop(launch.env_key, None) if launch.env_key else None
        if value is not None:
            env[CREDENTIAL_ENV] = value
        if launch.provider is not None:
            env[BASE_URL_ENV] = launch.provider.base_url
            if launch.provider.request_max_retries is not None:
                env["CLAUDE_CODE_MAX_RETRIES"] = str(launch.provider.request_max_retries)
        env["CLAUDE_CONFIG_DIR"] = str(launch.home)
        env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] = "1"
        return env

    def parser(self) -> ClaudeEvents:
        return ClaudeEvents()

    def actions_of(self, event: dict[str, Any]) -> list[str]:
        return actions_of(event)
