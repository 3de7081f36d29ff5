"""The Codex CLI harness (contract §7.3, §7.5, §7.6): its argv, its event stream, its final message.

Everything here reads harness output tolerantly: unknown event types and keys are ignored,
blank lines are skipped, and a line that is not a JSON object becomes a diagnostic. Nothing
here decides the terminal state; the owner does that from `EventSummary` and the exit code.
"""

from __future__ import annotations

import codecs
import json
import os
import re
import stat
from collections.abc import Iterator
from typing import Any

from courier.config import Provider
from courier.text import clip_bytes, sanitize
from protocol import limits
from protocol.models import Usage

# The variable a `credential_file` provider's value is injected as (contract §7.4).
FILE_CREDENTIAL_ENV = "WB_AGENT_PROVIDER_CREDENTIAL"

# Item types that count as tool calls (contract §7.6).
TOOL_CALL_TYPES = frozenset({"command_execution", "file_change", "mcp_tool_call"})

DIAGNOSTICS_MAX = 50
DIAGNOSTIC_MAX_BYTES = limits.LOG_ACTION_MAX_BYTES
FAILURE_MESSAGE_MAX_BYTES = 4096
MALFORMED_EXCERPT_CHARS = 120

_PROVIDER_NAME = re.compile(r"[a-z0-9_-]{1,32}")
_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]{0,63}")
# A thread ID as Codex prints it (a UUID); never an option, never a path.
_SESSION_ID = re.compile(r"[0-9A-Za-z][0-9A-Za-z-]{0,127}")
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
) -> list[str]:
    """The exact `codex exec` command line of contract §7.3 (no `--ephemeral`: sessions are kept
    in the run's private CODEX_HOME so a later run can continue them, §15.4).

    With `resume_session`, the same options then `resume <session> -` (contract §15.4): the
    exec options go before the subcommand, which takes only the session ID and the prompt.

    The task is never part of it: the trailing `-` makes Codex read the prompt from stdin.
    `env_key` names the variable the harness reads the credential from: the provider's
    `credential_env`, or `FILE_CREDENTIAL_ENV` for a `credential_file` provider.
    Raises ValueError for a configuration Codex would refuse or that cannot be expressed safely.
    """
    if provider.wire_api != "responses":
        raise ValueError(
            f'provider "{provider_name}" uses wire_api "{provider.wire_api}", which Codex no longer accepts; '
            'set wire_api: responses for it in wb.yaml'
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


def _clean(text: str, limit: int = DIAGNOSTIC_MAX_BYTES) -> str:
    """Sanitised, valid UTF-8 (JSON may decode lone surrogates) and at most `limit` bytes."""
    return clip_bytes(sanitize(text.encode("utf-8", "replace").decode()), limit)


def _decode(line: bytes) -> tuple[str, Any, bool]:
    """(text, value, ok): ok is False when the line is not a JSON object."""
    text = line.decode("utf-8", "replace").rstrip("\r\n")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return text, None, False
    return text, value, isinstance(value, dict)


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


def _malformed(text: str) -> str:
    return sanitize(text[:MALFORMED_EXCERPT_CHARS])


class EventSummary:
    """What a Codex `--json` stdout stream said, built one line at a time.

    Feed every stdout line (with or without its newline) to `feed`. Lines are numbered from 1
    in the order they were produced, counting blank lines and lines reported through
    `skipped_oversize_line`. Memory stays bounded: at most `DIAGNOSTICS_MAX` diagnostics of
    at most 240 bytes each, and the text of the last agent message (one line, so ≤ 8 MiB).
    """

    def __init__(self) -> None:
        self.thread_id: str | None = None
        self.turn_completed = False
        self.turn_failed = False
        self.failure_message: str | None = None
        self.usage: Usage | None = None
        self.tool_calls = 0
        self.last_agent_message: str | None = None
        self.lines = 0
        self.events = 0
        self._diagnostics: list[str] = []
        self._diagnostics_dropped = 0
        # The message of an `error` event that was just recorded as the last diagnostic.
        self._pending_error: str | None = None

    @property
    def diagnostics(self) -> list[str]:
        """Harness diagnostics in arrival order; the last entry counts any that were dropped."""
        if not self._diagnostics_dropped:
            return list(self._diagnostics)
        return [*self._diagnostics, f"… and {self._diagnostics_dropped} more harness diagnostic(s)"]

    def _diagnose(self, text: str) -> bool:
        """Record one diagnostic; False when the bound made it only a count."""
        if len(self._diagnostics) >= DIAGNOSTICS_MAX - 1:
            self._diagnostics_dropped += 1
            return False
        self._diagnostics.append(_clean(text))
        return True

    def skipped_oversize_line(self, size: int) -> None:
        """Record that the owner skipped a stdout line of `size` bytes (over the 8 MiB line bound)."""
        self.lines += 1
        self._pending_error = None
        self._diagnose(
            f"skipped event line {self.lines}: {size} bytes is over the {limits.EVENT_LINE_MAX_BYTES}-byte line limit"
        )

    def feed(self, line: bytes) -> None:
        self.lines += 1
        if not line or line.isspace():
            return
        text, event, ok = _decode(line)
        if not ok:
            self._pending_error = None
            self._diagnose(f"malformed event line {self.lines}: {_malformed(text)}")
            return
        self.events += 1
        kind = event.get("type")
        pending_error, self._pending_error = self._pending_error, None
        if kind == "thread.started":
            if isinstance(event.get("thread_id"), str):
                self.thread_id = event["thread_id"]
        elif kind == "turn.completed":
            self.turn_completed = True
            self.usage = _usage_of(event.get("usage"))
        elif kind == "turn.failed":
            self.turn_failed = True
            message = _message_of(event.get("error"))
            if message is not None:
                self.failure_message = _clean(message, FAILURE_MESSAGE_MAX_BYTES)
                # Codex repeats the failure as a top-level `error` right before `turn.failed`:
                # it is the failure, not a separate diagnostic.
                if pending_error == message:
                    self._diagnostics.pop()
            else:
                self.failure_message = self.failure_message or "the harness reported a failed turn"
        elif kind == "error":
            message = _message_of(event)
            if message is not None and self._diagnose(message):
                self._pending_error = message
        elif kind == "item.completed":
            item = event.get("item")
            if isinstance(item, dict):
                self._item_completed(item)

    def _item_completed(self, item: dict[str, Any]) -> None:
        item_type = item.get("type")
        if item_type in TOOL_CALL_TYPES:
            self.tool_calls += 1
        elif item_type == "agent_message":
            text = item.get("text")
            if isinstance(text, str):
                self.last_agent_message = text
        elif item_type == "error":
            message = _message_of(item)
            if message is not None:
                self._diagnose(message)


# --------------------------------------------------------------------------- logs


def _plural_files(count: int) -> str:
    return "changed 1 file" if count == 1 else f"changed {count} files"


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
        return _plural_files(len(changes) if isinstance(changes, list) else 0)
    if item_type == "mcp_tool_call":
        server, tool = item.get("server"), item.get("tool")
        return f"called {server if isinstance(server, str) else '?'}.{tool if isinstance(tool, str) else '?'}"
    if item_type == "error":
        message = _message_of(item)
        return None if message is None else f"diagnostic: {message}"
    return None


_BLOCK = 1 << 20


def _lines_backwards(path: str | os.PathLike[str], block: int = _BLOCK) -> Iterator[bytes | None]:
    """The file's lines from last to first (without their newlines), read in blocks from the end.

    The empty text after a final newline comes out as a blank line. A line longer than
    `limits.EVENT_LINE_MAX_BYTES` is not accumulated: it comes out as None (the owner never
    stores one, so it means the file was written by something else).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{os.fspath(path)} is not a regular file")
        position = handle.seek(0, os.SEEK_END)
        carry = b""  # the start of the file's unread part holds the rest of this line
        oversize = False  # the line being accumulated is too long: its bytes are dropped
        while position > 0:
            step = min(block, position)
            position -= step
            handle.seek(position)
            buffer = handle.read(step)
            if not oversize:
                buffer += carry
            end = len(buffer)
            while (newline := buffer.rfind(b"\n", 0, end)) >= 0:
                if oversize:
                    oversize = False
                    yield None
                else:
                    yield buffer[newline + 1 : end]
                end = newline
            carry = b"" if oversize else buffer[:end]
            if len(carry) > limits.EVENT_LINE_MAX_BYTES:
                carry, oversize = b"", True
        yield None if oversize else carry


def worker_actions(events_path: str | os.PathLike[str], limit: int) -> list[str]:
    """The last `limit` worker actions of a transcript, oldest first (contract §3.5, §7.6).

    Reads backwards from the end of the file, so the cost is proportional to how far back
    the last `limit` actions are, not to the file's size. Each action is sanitised and at
    most 240 bytes, a cut one ending in `…`. A missing file, a symlink or anything but a
    regular file raises OSError.
    """
    if limit <= 0:
        return []
    found: list[str] = []
    failed_message: str | None = None  # a turn.failed's message, to drop the `error` Codex repeats before it
    for line in _lines_backwards(events_path):
        if line is None:
            action: str | None = f"diagnostic: event line over {limits.EVENT_LINE_MAX_BYTES} bytes"
            failed_message = None
        elif not line or line.isspace():
            continue
        else:
            text, event, ok = _decode(line)
            if not ok:
                action = f"diagnostic: malformed event line: {_malformed(text)}"
                failed_message = None
            else:
                if (
                    failed_message is not None
                    and event.get("type") == "error"
                    and _message_of(event) == failed_message
                ):
                    failed_message = None
                    continue
                failed_message = _message_of(event.get("error")) if event.get("type") == "turn.failed" else None
                action = _action_of(event)
        if action is not None:
            found.append(_clean(action, limits.LOG_ACTION_MAX_BYTES))
            if len(found) >= limit:
                break
    found.reverse()
    return found


# --------------------------------------------------------------------------- final message


def _cut_utf8(data: bytes, limit: int) -> str:
    """At most `limit` bytes of `data` as text, dropping a character the cut split in two."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    return decoder.decode(data[:limit], final=False)


def _bounded(data: bytes, size: int) -> str:
    """The final message from its first bytes and its full size in bytes (contract §10)."""
    if size <= limits.FINAL_MESSAGE_MAX_BYTES:
        return data.decode("utf-8", "replace")
    cut = _cut_utf8(data, limits.FINAL_MESSAGE_MAX_BYTES)
    return f"{cut}\n[… truncated: the final message was {size} bytes]"


def _read_message_file(path: str | os.PathLike[str], extra: int = 0) -> tuple[bytes, int] | None:
    """(first bytes, size) of a regular, non-empty file, reading at most the bound + 1 byte; else None.

    Opened without following a symlink and without blocking on a FIFO the worker may have put there.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        want = limits.FINAL_MESSAGE_MAX_BYTES + 1 + extra
        data = b""
        while len(data) < want:
            piece = os.read(fd, want - len(data))
            if not piece:
                break
            data += piece
    except OSError:
        return None
    finally:
        os.close(fd)
    if not data:
        return None
    # The size on disk, unless the file grew or shrank while being read.
    size = info.st_size if len(data) > limits.FINAL_MESSAGE_MAX_BYTES else len(data)
    return data, max(size, len(data))


def final_message(
    last_message_path: str | os.PathLike[str], summary: EventSummary, *, secret: bytes = b"", mask: bytes = b""
) -> str | None:
    """The run's final message: the `-o` file when present and non-empty, else the last agent message.

    At most 4096 bytes of it, plus `\\n[… truncated: the final message was N bytes]` when longer.
    `secret` is replaced by `mask` before the cut, so a cut can never leave a fragment of it.
    The text is not sanitised here (it is stored; output sanitises it).
    """
    read = _read_message_file(last_message_path, extra=len(secret))
    if read is not None:
        data, size = read
    else:
        message = summary.last_agent_message
        if not message:
            return None
        data = message.encode("utf-8", "replace")
        size = len(data)
    if secret and secret in data:
        data = data.replace(secret, mask)
        size += data.count(mask) * (len(mask) - len(secret))
    return _bounded(data, size)
