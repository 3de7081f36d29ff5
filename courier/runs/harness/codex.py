"""The Codex CLI harness (docs/codex-notes.md#the-argv; docs/runs.md#terminal-state; docs/runs.md#summaries): its argv,
its event stream, its final message.

Everything here reads harness output tolerantly: unknown event types and keys are ignored,
blank lines are skipped, and a line that is not a JSON object becomes a diagnostic. Nothing
here decides the terminal state; the owner does that from `EventSummary` and the exit code.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from courier.config import Provider
from courier.runs.harness.interface import (
    EventParser,
    Harness,
    Launch,
    is_usage_limit,
    plural_files,
)
from courier.runs.harness.lines import action_lines, clean
from courier.runs.harness.message import bounded_message, message_bytes, read_message_file
from courier.runs.harness.transcript import LineActions, lines_backwards
from protocol import limits
from protocol.models import Usage

# Item types that count as tool calls (docs/runs.md#summaries).
TOOL_CALL_TYPES = frozenset({"command_execution", "file_change", "mcp_tool_call"})

_PROVIDER_NAME = re.compile(r"[a-z0-9_-]{1,32}")
_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]{0,63}")
# A thread ID as Codex prints it (a UUID); never an option, never a path.
_SESSION_ID = re.compile(r"[0-9A-Za-z][0-9A-Za-z-]{0,127}")
# The notice real Codex writes to stderr (merged into the event stream) when its prompt comes on a stdin
# that is not a terminal, as every run's does: neither a worker action nor a diagnostic.
STDIN_NOTICE = "Reading additional input from stdin..."
_USAGE_FIELDS = (
    "input_tokens",
    "cached_input_tokens",
    "cache_write_input_tokens",
    "output_tokens",
    "reasoning_output_tokens",
)


# --------------------------------------------------------------------------- argv


def toml_string(value: str) -> str:
    """A TOML basic string for `value`: JSON's escaping, plus DEL, which TOML also forbids raw."""
    if any("\ud800" <= ch <= "\udfff" for ch in value):
        raise ValueError("value contains an unpaired surrogate and cannot be passed to the harness")
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def codex_argv(
    *,
    worktree: str,
    model: str,
    provider_name: str,
    provider: Provider,
    reasoning: str | None,
    network: bool,
    last_message_path: str,
    env_key: str,
    resume_session: str | None = None,
    confined: bool = False,
) -> list[str]:
    """The exact `codex exec` command line of docs/codex-notes.md#the-argv (no `--ephemeral`: sessions are kept
    in the run's private CODEX_HOME so a later run can continue them, docs/cli.md, wb agent continue).

    With `resume_session`, the same options then `resume <session> -` (docs/cli.md, wb agent continue): the
    exec options go before the subcommand, which takes only the session ID and the prompt.

    The task is never part of it: the trailing `-` makes Codex read the prompt from stdin.
    `env_key` names the variable the harness reads the credential from: the provider's
    `credential_env`, or `FILE_CREDENTIAL_ENV` for a `credential_file` provider.
    Raises ValueError for a configuration Codex would refuse or that cannot be expressed safely.
    """
    if provider.wire_api != "responses":
        raise ValueError(
            f'provider "{provider_name}" uses wire_api "{provider.wire_api}", which Codex no longer accepts; '
            "set wire_api: responses for it in wb.yaml"
        )
    if not _PROVIDER_NAME.fullmatch(provider_name):
        raise ValueError(f"provider name {provider_name!r} must match ^[a-z0-9_-]{{1,32}}$")
    if not _ENV_NAME.fullmatch(env_key):
        raise ValueError(f"credential variable {env_key!r} must match ^[A-Z_][A-Z0-9_]{{0,63}}$")
    for what, path in (("worktree", worktree), ("last message path", last_message_path)):
        if not os.path.isabs(path):
            raise ValueError(f"{what} must be an absolute path, got {path!r}")
    if not model or model.startswith("-"):
        raise ValueError(f"model {model!r} must be a non-empty identifier not starting with '-'")
    if resume_session is not None and not _SESSION_ID.fullmatch(resume_session):
        raise ValueError(f"session ID {resume_session!r} is not a Codex thread ID")

    # Bare TOML keys allow A-Za-z0-9_-, so `wb_<name>` is a valid dotted-key segment as is.
    pid = f"wb_{provider_name}"
    table = f"model_providers.{pid}"
    overrides: list[tuple[str, str]] = [
        ("model_provider", toml_string(pid)),
        (f"{table}.name", toml_string(provider_name)),
        (f"{table}.base_url", toml_string(provider.base_url)),
        (f"{table}.wire_api", toml_string("responses")),
        (f"{table}.env_key", toml_string(env_key)),
    ]
    for key in ("request_max_retries", "stream_max_retries", "stream_idle_timeout_ms"):
        number = getattr(provider, key)
        if number is not None:
            overrides.append((f"{table}.{key}", str(int(number))))
    overrides += [
        ("approval_policy", toml_string("never")),
        ("shell_environment_policy.inherit", toml_string("core")),
        ("shell_environment_policy.exclude", json.dumps(["*KEY*", "*TOKEN*", "*SECRET*"], separators=(",", ":"))),
    ]
    if reasoning is not None:
        overrides.append(("model_reasoning_effort", toml_string(reasoning)))
    if network:
        overrides.append(("sandbox_workspace_write.network_access", "true"))
    if confined:
        # Inside wb's sandbox the machine's /tmp is read-only, and Codex's own bubblewrap would fail
        # making /tmp/.git there; its TMPDIR (the run's private one) stays writable (docs/harnesses.md).
        overrides.append(("sandbox_workspace_write.exclude_slash_tmp", "true"))

    argv = [
        "codex", "exec", "--json", "--ignore-user-config",
        "-C", worktree, "-s", "workspace-write", "-m", model,
    ]  # fmt: skip
    for key, value in overrides:
        argv += ["-c", f"{key}={value}"]
    argv += ["-o", last_message_path]
    if resume_session is not None:
        argv += ["resume", resume_session]
    argv.append("-")
    return argv


# --------------------------------------------------------------------------- events


def _message_of(value: Any) -> str | None:
    """`value["message"]` when it is a string (used for `error` events and `turn.failed.error`)."""
    if isinstance(value, dict):
        message = value.get("message")
        if isinstance(message, str):
            return message
    return None


def _usage_of(value: Any) -> Usage | None:
    if not isinstance(value, dict):
        return None
    fields = {
        key: number
        for key in _USAGE_FIELDS
        if isinstance(number := value.get(key), int) and not isinstance(number, bool) and number >= 0
    }
    if not fields:
        return None
    return Usage(**fields)


class EventSummary(EventParser):
    """What a Codex `--json` stdout stream said (docs/runs.md#terminal-state; docs/runs.md#summaries), built one line
    at a time.

    Memory stays bounded: at most `DIAGNOSTICS_MAX` diagnostics of at most 240 bytes each,
    and the text of the last agent message (one line, so ≤ 8 MiB).
    """

    def __init__(self) -> None:
        super().__init__()
        self.turn_completed = False
        self.turn_failed = False
        self.failure_message: str | None = None
        # The message of an `error` event that was just recorded as the last diagnostic.
        self._pending_error: str | None = None

    @property
    def thread_id(self) -> str | None:
        return self.session_id

    @property
    def last_agent_message(self) -> str | None:
        return self.last_message

    def skipped_oversize_line(self, size: int) -> None:
        self._pending_error = None
        super().skipped_oversize_line(size)

    def malformed(self, text: str) -> None:
        if is_stdin_notice(text):
            return
        self._pending_error = None
        super().malformed(text)

    def event(self, event: dict[str, Any], line: bytes) -> bytes:
        kind = event.get("type")
        pending_error, self._pending_error = self._pending_error, None
        if kind == "thread.started":
            if isinstance(event.get("thread_id"), str):
                self.session_id = event["thread_id"]
        elif kind == "turn.completed":
            self.turn_completed = True
            self.usage = _usage_of(event.get("usage"))
        elif kind == "turn.failed":
            self.turn_failed = True
            message = _message_of(event.get("error"))
            if message is not None:
                self.failure_message = clean(message, limits.RUN_FAILURE_MESSAGE_MAX_BYTES)
                if is_usage_limit(message):
                    self.usage_limit = self.failure_message  # `exceeded retry limit, last status: 429 …`
                # Codex repeats the failure as a top-level `error` right before `turn.failed`:
                # it is the failure, not a separate diagnostic.
                if pending_error == message:
                    self._diagnostics.pop()
            else:
                self.failure_message = self.failure_message or "the harness reported a failed turn"
        elif kind == "error":
            message = _message_of(event)
            if message is not None and self.diagnose(message):
                self._pending_error = message
        elif kind == "item.completed":
            item = event.get("item")
            if isinstance(item, dict):
                self._item_completed(item)
        return line

    def _item_completed(self, item: dict[str, Any]) -> None:
        item_type = item.get("type")
        if item_type in TOOL_CALL_TYPES:
            self.tool_calls += 1
        elif item_type == "agent_message":
            text = item.get("text")
            if isinstance(text, str):
                self.last_message = text
        elif item_type == "error":
            message = _message_of(item)
            if message is not None:
                self.diagnose(message)

    def failure(self, exit_code: int | None) -> str | None:
        """The terminal state after stop and timeout: exit code, failed turn, no terminal turn event.

        The order is the owner's, docs/runs.md#terminal-state.
        """
        turn_failure = f"harness reported a failed turn: {self.failure_message or 'no message'}"
        if exit_code not in (None, 0):
            return f"harness exited with code {exit_code}" + (f"; {turn_failure}" if self.turn_failed else "")
        if self.turn_failed:
            return turn_failure
        if not self.turn_completed:
            return "no terminal turn event"
        return None


# --------------------------------------------------------------------------- logs


def _action_of(event: dict[str, Any]) -> str | None:
    """The worker action one well-formed event stands for, unsanitised, or None."""
    kind = event.get("type")
    if kind == "error":
        message = _message_of(event)
        return None if message is None else f"diagnostic: {message}"
    if kind == "turn.failed":
        message = _message_of(event.get("error"))
        return f"diagnostic: {message if message is not None else 'the harness reported a failed turn'}"
    if kind != "item.completed":
        return None
    item = event.get("item")
    if not isinstance(item, dict):
        return None
    item_type = item.get("type")
    if item_type == "command_execution":
        command = item.get("command")
        return f"ran: {command if isinstance(command, str) else json.dumps(command)}"
    if item_type == "file_change":
        changes = item.get("changes")
        return plural_files(len(changes) if isinstance(changes, list) else 0)
    if item_type == "mcp_tool_call":
        server, tool = item.get("server"), item.get("tool")
        return f"called {server if isinstance(server, str) else '?'}.{tool if isinstance(tool, str) else '?'}"
    if item_type == "error":
        message = _message_of(item)
        return None if message is None else f"diagnostic: {message}"
    return None


def is_stdin_notice(text: str) -> bool:
    return text.strip() == STDIN_NOTICE


def codex_line_actions(line: bytes | None) -> tuple[dict[str, Any] | None, list[str] | None]:
    """As `action_lines`, except that Codex's stdin notice stands for nothing (a blank line's answer)."""
    if line is not None and len(line) <= 2 * len(STDIN_NOTICE) and is_stdin_notice(line.decode("utf-8", "replace")):
        return None, []
    return action_lines(line)


def worker_actions(
    events_path: str | os.PathLike[str] | int, limit: int, line_actions: LineActions = codex_line_actions
) -> list[str]:
    """The last `limit` worker actions of a Codex transcript, oldest first.

    See docs/cli.md, wb agent logs, and docs/runs.md#summaries.

    As `transcript.last_actions`, except that the `error` event Codex repeats right before a
    `turn.failed` with the same message is one action, not two.
    """
    if limit <= 0:
        return []
    found: list[str] = []
    failed_message: str | None = None  # a turn.failed's message, to drop the `error` Codex repeats before it
    for line in lines_backwards(events_path):
        event, actions = line_actions(line)
        if actions is not None:
            if not actions:
                continue
            action: str | None = actions[0]
            failed_message = None
        else:
            assert event is not None
            if failed_message is not None and event.get("type") == "error" and _message_of(event) == failed_message:
                failed_message = None
                continue
            failed_message = _message_of(event.get("error")) if event.get("type") == "turn.failed" else None
            action = _action_of(event)
        if action is not None:
            found.append(clean(action, limits.LOG_ACTION_MAX_BYTES))
            if len(found) >= limit:
                break
    found.reverse()
    return found


# --------------------------------------------------------------------------- final message


def final_message(
    last_message_path: str | os.PathLike[str], summary: EventSummary, *, secret: bytes = b"", mask: bytes = b""
) -> str | None:
    """The run's final message: the `-o` file when present and non-empty, else the last agent message.

    At most 4096 bytes of it, plus `\\n[… truncated: the final message was N bytes]` when longer.
    `secret` is replaced by `mask` before the cut, so a cut can never leave a fragment of it.
    The text is not sanitised here (it is stored; output sanitises it).
    """
    found = read_message_file(last_message_path, extra=len(secret)) or message_bytes(summary.last_message)
    return None if found is None else bounded_message(*found, secret=secret, mask=mask)


# --------------------------------------------------------------------------- the harness


class Codex(Harness):
    """The Codex CLI (docs/codex-notes.md#the-argv): `codex exec --json`, CODEX_HOME private to the run."""

    name = "codex"

    def argv(self, launch: Launch) -> list[str]:
        assert launch.provider is not None
        return codex_argv(
            worktree=launch.worktree,
            model=launch.model,
            provider_name=launch.provider_name,
            provider=launch.provider,
            reasoning=launch.reasoning,
            network=launch.network,
            last_message_path=str(launch.last_message_path),
            env_key=launch.env_key,
            resume_session=launch.resume_session,
            confined=launch.confined,
        )

    def environment(self, launch: Launch, env: dict[str, str]) -> dict[str, str]:
        return {**env, "CODEX_HOME": str(launch.home)}

    def parser(self) -> EventSummary:
        return EventSummary()

    def final_message(self, launch: Launch, parser: EventParser, extra: int = 0) -> tuple[bytes, int] | None:
        return read_message_file(launch.last_message_path, extra=extra) or message_bytes(parser.last_message)

    def line_actions(self, line: bytes | None) -> tuple[dict[str, Any] | None, list[str] | None]:
        return codex_line_actions(line)

    def actions_of(self, event: dict[str, Any]) -> list[str]:
        action = _action_of(event)
        return [] if action is None else [action]

    def may_echo(self, event: dict[str, Any]) -> bool:
        return event.get("type") == "error"

    def echoed_by(self, event: dict[str, Any], following: dict[str, Any]) -> bool:
        # Codex repeats a failed turn's message as a top-level `error` right before `turn.failed`.
        return (
            event.get("type") == "error"
            and following.get("type") == "turn.failed"
            and _message_of(following.get("error")) == _message_of(event)
        )

    def worker_actions(self, events_path: str | os.PathLike[str] | int, limit: int) -> list[str]:
        return worker_actions(events_path, limit, self.line_actions)
