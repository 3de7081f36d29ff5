"""The Gemini CLI harness (docs/harnesses.md): `gemini -o stream-json`, a private home, its event stream.

Facts verified with the real 0.61.0 binary (docs/harnesses.md, "Gemini CLI 0.61.0"):

* `GEMINI_CLI_HOME` replaces the home directory for everything the CLI keeps (`<it>/.gemini`:
  settings, trusted folders, policies, extensions, chats); the user's own `~/.gemini` is then
  never read. HOME stays the user's, so the worker's commands see the user's git identity.
* Headless runs need an auth method chosen in settings (`security.auth.selectedType`
  `gemini-api-key`); with only GOOGLE_GEMINI_BASE_URL set the CLI picks `gateway` and exits 41.
* `auto_edit` registers the edit tools; `run_shell_command` is registered only when a policy
  allows it, which the private home's `policies/wb.toml` does. A headless run registers no
  tool that would ask for approval, so nothing can hang on a prompt.
* The CLI writes error reports (which quote the request, task included) to `os.tmpdir()`:
  TMPDIR points inside the private home so they stay in the run directory.
* `--resume <uuid>` resumes the session with that ID from `<home>/.gemini/tmp/<project>/chats`
  (the project is the worktree, so a copy of the parent's home finds it); an unknown ID exits 42.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from courier.runs.harness.interface import (
    EventParser,
    Harness,
    Launch,
    is_usage_limit,
    plural_files,
)
from courier.runs.harness.lines import action_lines, clean
from courier.runs.harness.transcript import lines_backwards
from protocol import limits
from protocol.models import Usage

EXECUTABLE = "gemini"
APPROVAL_MODE = "auto_edit"
API_KEY_ENV = "GEMINI_API_KEY"
BASE_URL_ENV = "GOOGLE_GEMINI_BASE_URL"
TASK_PLACEHOLDER = "[task]"
SHELL_TOOL = "run_shell_command"
FILE_TOOLS = frozenset({"write_file", "replace", "edit", "smart_edit"})
MCP_PREFIX = "mcp_"
# stderr lines the CLI writes beside the stream (one pipe): its start-up profiler's notices and
# the repeat of a failed tool call's error, which the `tool_result` event already carries.
_KNOWN_STDERR = (b"[STARTUP] ", b"Error executing tool ")
# The final message is kept up to its bound plus what a masked credential may take back.
_KEPT_MESSAGE_BYTES = limits.FINAL_MESSAGE_MAX_BYTES + 1 + limits.CREDENTIAL_FILE_MAX_BYTES

# The private home's settings: API-key auth against GOOGLE_GEMINI_BASE_URL, no telemetry or
# update checks, no project `.env` files, credentials kept out of the worker's commands.
SETTINGS: dict[str, Any] = {
    "security": {
        "auth": {"selectedType": "gemini-api-key"},
        "environmentVariableRedaction": {"enabled": True},
    },
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
    "advanced": {"ignoreLocalEnv": True},
    # Terminal advice and the ripgrep fallback notice would land in the transcript as noise.
    "ui": {"showCompatibilityWarnings": False},
    "tools": {"useRipgrep": False},
}
# A session ID as the CLI mints it (`randomUUID`). Nothing else is passed to --resume: the CLI
# reads `latest` or a small number there as "the newest" or "the n-th" session of the project.
_SESSION_ID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")

# auto_edit approves edits; this rule approves shell commands too, and nothing else.
SHELL_POLICY = f'[[rule]]\ntoolName = "{SHELL_TOOL}"\ndecision = "allow"\npriority = 100\n'


# --------------------------------------------------------------------------- start


def gemini_argv(model: str, resume_session: str | None = None) -> list[str]:
    """The exact command line (docs/harnesses.md); the task goes on stdin, which makes the run headless.

    With `resume_session`, `--resume <session>` (docs/cli.md, wb agent continue): 0.61.0 looks the ID up
    among the project's sessions in its home before it reads its index numbers.
    """
    if not model or model.startswith("-"):
        raise ValueError(f"model {model!r} must be a non-empty identifier not starting with '-'")
    argv = [EXECUTABLE, "-o", "stream-json", "-m", model, "--approval-mode", APPROVAL_MODE]
    if resume_session is not None:
        if not _SESSION_ID.fullmatch(resume_session):
            raise ValueError(f"session ID {resume_session!r} is not a Gemini CLI session ID (a UUID)")
        argv += ["--resume", resume_session]
    return argv


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)


def prepare_gemini_home(home: Path, worktree: str) -> None:
    """Settings, this run's one trusted folder and the shell policy, in `<home>/.gemini`."""
    gemini_dir = home / ".gemini"
    (gemini_dir / "policies").mkdir(mode=0o700, parents=True, exist_ok=True)
    (home / "tmp").mkdir(mode=0o700, exist_ok=True)
    _write_private(gemini_dir / "settings.json", json.dumps(SETTINGS, indent=2) + "\n")
    trusted = {path: "TRUST_FOLDER" for path in dict.fromkeys((worktree, os.path.realpath(worktree)))}
    _write_private(gemini_dir / "trustedFolders.json", json.dumps(trusted, indent=2) + "\n")
    _write_private(gemini_dir / "policies" / "wb.toml", SHELL_POLICY)


def gemini_environment(launch: Launch, env: dict[str, str]) -> dict[str, str]:
    """The allowlist, the one credential as GEMINI_API_KEY, the base URL and the private home.

    A `credential_file` provider's value (or a `credential_env` of another name) is moved to
    GEMINI_API_KEY, the only variable the CLI reads a Gemini API key from.
    """
    result = dict(env)
    if launch.provider is None:
        raise ValueError("the gemini harness needs a provider")
    value = result.pop(launch.env_key, "") if launch.env_key else ""
    if value:
        result[API_KEY_ENV] = value
    tmp = str(launch.home / "tmp")
    result.update(
        {
            BASE_URL_ENV: launch.provider.base_url,
            "GEMINI_CLI_HOME": str(launch.home),
            "TMPDIR": tmp,
            "TMP": tmp,
            "TEMP": tmp,
            # The CLI otherwise starts a second node process only to raise its heap limit: half its start-up.
            "GEMINI_CLI_NO_RELAUNCH": "true",
        }
    )
    return result


# --------------------------------------------------------------------------- events


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _error_message(value: Any) -> str | None:
    return _text(value.get("message")) if isinstance(value, dict) else None


def _count(stats: dict[str, Any], key: str) -> int | None:
    number = stats.get(key)
    return number if isinstance(number, int) and not isinstance(number, bool) and number >= 0 else None


def usage_of(stats: Any) -> Usage | None:
    """`result.stats` as wb's usage (docs/cli.md#results): `input_tokens` already counts the `cached` ones."""
    if not isinstance(stats, dict):
        return None
    fields = {
        "input_tokens": _count(stats, "input_tokens"),
        "cached_input_tokens": _count(stats, "cached"),
        "output_tokens": _count(stats, "output_tokens"),
    }
    found = {key: number for key, number in fields.items() if number is not None}
    if not any(found.values()):
        return None  # nothing was counted (a failure before any model response)
    return Usage(**found)


def mask_task(event: dict[str, Any], line: bytes) -> bytes:
    """The stored form of the CLI's echo of the task: the event with its content replaced."""
    masked = {key: (TASK_PLACEHOLDER if key == "content" else value) for key, value in event.items()}
    newline = b"\n" if line.endswith(b"\n") else b""
    return json.dumps(masked, ensure_ascii=False, separators=(",", ":")).encode() + newline


class GeminiEvents(EventParser):
    """What a Gemini CLI `-o stream-json` stream said, built one line at a time in bounded memory."""

    def __init__(self) -> None:
        super().__init__()
        self.status: str | None = None  # result.status
        self.failure_message: str | None = None
        self._message = bytearray()  # the current assistant text, at most _KEPT_MESSAGE_BYTES
        self._message_size = 0
        self._after_tool = False  # a tool call since the last assistant text: the next text starts anew

    def malformed(self, text: str) -> None:
        if not text.encode().startswith(_KNOWN_STDERR):
            super().malformed(text)

    @property
    def final_text(self) -> tuple[bytes, int] | None:
        return (bytes(self._message), self._message_size) if self._message_size else None

    def event(self, event: dict[str, Any], line: bytes) -> bytes:
        kind = event.get("type")
        if kind == "init":
            if isinstance(event.get("session_id"), str):
                self.session_id = event["session_id"]
        elif kind == "message":
            if event.get("role") == "user":
                return mask_task(event, line)
            if event.get("role") == "assistant":
                self._assistant(_text(event.get("content")) or "")
        elif kind == "tool_use":
            self.tool_calls += 1
            self._after_tool = True
        elif kind == "tool_result":
            self._after_tool = True
            if event.get("status") == "error":
                self.diagnose(_tool_failure(event))
        elif kind == "error":
            message = _text(event.get("message"))
            if message is not None:
                self.diagnose(message)
        elif kind == "result":
            self.status = _text(event.get("status")) or "?"
            self.usage = usage_of(event.get("stats"))
            if self.status != "success":
                message = _error_message(event.get("error")) or f"status {self.status}"
                self.failure_message = clean(message, limits.RUN_FAILURE_MESSAGE_MAX_BYTES)
                if is_usage_limit(message):  # "[API Error: Resource has been exhausted …] Please wait …"
                    self.usage_limit = clean(message.splitlines()[0] if message else message)
        return line

    def _assistant(self, text: str) -> None:
        """Concatenate the deltas of the last assistant turn (text before a tool call is commentary)."""
        if self._after_tool:
            self._message.clear()
            self._message_size = 0
            self._after_tool = False
        data = text.encode("utf-8", "replace")
        self._message_size += len(data)
        room = _KEPT_MESSAGE_BYTES - len(self._message)
        if room > 0:
            self._message += data[:room]

    def failure(self, exit_code: int | None) -> str | None:
        """Success is exit 0 and `result.status == "success"`; any non-zero exit is a failure."""
        reported = f"harness reported an error: {self.failure_message}" if self.failure_message else None
        if exit_code not in (None, 0):
            return f"harness exited with code {exit_code}" + (f"; {reported}" if reported else "")
        if reported:
            return reported
        if self.status is None:
            return "no terminal result event"
        return None


# --------------------------------------------------------------------------- logs


def _tool_failure(event: dict[str, Any]) -> str:
    message = _error_message(event.get("error")) or _text(event.get("output")) or "a tool call failed"
    tool = _text(event.get("tool_id")) or ""
    name = tool.split("__", 1)[0] if "__" in tool else ""
    return f"{name} failed: {message}" if name else message


def tool_action(event: dict[str, Any]) -> str | None:
    """What a `tool_use` event did: `ran: …`, `changed 1 file`, `called server.tool`, or None."""
    name = _text(event.get("tool_name")) or ""
    parameters = event.get("parameters")
    parameters = parameters if isinstance(parameters, dict) else {}
    if name == SHELL_TOOL:
        command = parameters.get("command")
        return f"ran: {command if isinstance(command, str) else json.dumps(command)}"
    if name in FILE_TOOLS:
        return plural_files(1)
    if name.startswith(MCP_PREFIX):
        server, _, tool = name[len(MCP_PREFIX) :].partition("_")
        return f"called {server or '?'}.{tool or '?'}"
    return None


def _event_action(event: dict[str, Any]) -> str | None:
    kind = event.get("type")
    if kind == "tool_use":
        return tool_action(event)
    if kind == "tool_result" and event.get("status") == "error":
        return f"diagnostic: {_tool_failure(event)}"
    if kind == "error":
        message = _text(event.get("message"))
        return None if message is None else f"diagnostic: {message}"
    if kind == "result" and event.get("status") != "success":
        return f"diagnostic: {_error_message(event.get('error')) or 'the harness reported an error'}"
    return None


class _Backwards:
    """Worker actions for events read newest first: a tool call whose result was an error did not
    happen (its diagnostic says why), so it is not reported as done."""

    def __init__(self) -> None:
        self.failed: set[str] = set()

    def __call__(self, event: dict[str, Any]) -> list[str]:
        tool_id = _text(event.get("tool_id"))
        if event.get("type") == "tool_result" and event.get("status") == "error" and tool_id:
            self.failed.add(tool_id)
        elif event.get("type") == "tool_use" and tool_id in self.failed:
            return []
        action = _event_action(event)
        return [] if action is None else [action]


# --------------------------------------------------------------------------- the harness


class Gemini(Harness):
    """The Gemini CLI 0.61 (docs/harnesses.md)."""

    name = "gemini"

    def argv(self, launch: Launch) -> list[str]:
        if launch.provider is None or launch.provider.wire_api != "gemini":
            wire = launch.provider.wire_api if launch.provider else "none"
            raise ValueError(f'the gemini harness needs a provider with wire_api "gemini", not "{wire}"')
        return gemini_argv(launch.model, launch.resume_session)

    def environment(self, launch: Launch, env: dict[str, str]) -> dict[str, str]:
        return gemini_environment(launch, env)

    def prepare_home(self, launch: Launch) -> None:
        prepare_gemini_home(launch.home, launch.worktree)

    def parser(self) -> GeminiEvents:
        return GeminiEvents()

    def final_message(self, launch: Launch, parser: EventParser, extra: int = 0) -> tuple[bytes, int] | None:
        return parser.final_text if isinstance(parser, GeminiEvents) else None

    def actions_of(self, event: dict[str, Any]) -> list[str]:
        action = _event_action(event)
        return [] if action is None else [action]

    def may_echo(self, event: dict[str, Any]) -> bool:
        # A tool call is held back (reading forwards) until its result says whether it happened.
        return event.get("type") == "tool_use" and _text(event.get("tool_id")) is not None

    def echoed_by(self, event: dict[str, Any], following: dict[str, Any]) -> bool:
        """A call whose result, next, is an error did not happen: its diagnostic stands for it (as in `logs`)."""
        return (
            following.get("type") == "tool_result"
            and following.get("status") == "error"
            and _text(following.get("tool_id")) == _text(event.get("tool_id"))
        )

    def line_actions(self, line: bytes | None) -> tuple[dict[str, Any] | None, list[str] | None]:
        """As every harness's, except that the CLI's known stderr lines stand for nothing."""
        if line is not None and line.startswith(_KNOWN_STDERR):
            return None, []
        return action_lines(line)

    def worker_actions(self, events_path: str | os.PathLike[str] | int, limit: int) -> list[str]:
        """As `transcript.last_actions`, without the actions of failed calls."""
        if limit <= 0:
            return []
        found: list[str] = []
        backwards = _Backwards()
        for line in lines_backwards(events_path):
            event, actions = self.line_actions(line)
            if actions is None:
                assert event is not None
                actions = backwards(event)
            for action in reversed(actions):
                found.append(clean(action, limits.LOG_ACTION_MAX_BYTES))
                if len(found) >= limit:
                    break
            if len(found) >= limit:
                break
        found.reverse()
        return found
