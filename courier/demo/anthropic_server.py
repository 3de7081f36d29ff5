"""A scripted stand-in for a model behind the Anthropic Messages API, with SSE: just enough for `claude -p`.

It listens on 127.0.0.1 (an ephemeral port) and serves `POST <prefix>/v1/messages` as Server-Sent
Events, the way `courier.demo.model_server` serves the Responses API for Codex. Which step of a
scenario to play is decided by counting the `tool_result` blocks the harness sent back in the
request's `messages`. A request that offers no tools (Claude Code's side requests, such as a
title for the session) gets a one-word text answer and is recorded but not counted as a step.

Scenarios (see `SCENARIOS`; a URL prefix selects one: ``base_url_for("fail")`` is
``http://127.0.0.1:<port>/fail``, and Claude Code appends ``/v1/messages``):

* ``write-file``: runs ``ls`` with the Bash tool, writes ``hello.txt`` with the Write tool
  (the absolute path under the working directory Claude Code states in its system prompt),
  then says ``Created hello.txt.``; every response reports known usage.
* ``fail``: every request gets HTTP 400 with `FAIL_MESSAGE` (Claude Code does not retry a 400).
* ``commit``: runs ``git add`` + ``git commit`` of a new file with Bash, then reports back.
* ``endless``: runs ``true`` with Bash at every step, never finishing; each response reports
  400 tokens (300 in, 100 out), so a budget is what ends it.
* ``endless-unmetered``: as ``endless``, but no response carries usage (a provider whose stream
  reports none: the metering relay must take the harness's figure, docs/cli.md#budgets).
* ``outside``: writes ``../outside-write-tool.txt`` (next to the worktree) with the Write tool,
  then ``../outside-bash.txt`` with Bash, then reports back: what the permission flags allow.

Only the standard library is used, so the module can back `wb demo` as well as the test suite.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from courier.demo.model_server import (
    COMMIT_COMMAND,
    COMMIT_MESSAGE,
    FAIL_MESSAGE,
    HELLO_CONTENT,
    HELLO_PATH,
    PROBE_MESSAGE,
    WRITE_FILE_LIST_COMMAND,
    WRITE_FILE_MESSAGE,
    probe_command,
)
from courier.demo.scripted_http import FieldSum, ScriptedHandler, ScriptedServer, sse, sum_usage

__all__ = [
    "COMMIT_COMMAND",
    "COMMIT_MESSAGE",
    "FAIL_MESSAGE",
    "HELLO_CONTENT",
    "HELLO_PATH",
    "SCENARIOS",
    "WRITE_FILE_LIST_COMMAND",
    "WRITE_FILE_MESSAGE",
    "AnthropicServer",
    "MessagesUsage",
    "ServedMessage",
]

SCENARIOS: Final = ("write-file", "fail", "commit", "outside", "endless", "endless-unmetered", "probe")
LIMIT_MESSAGE: Final = "Rate limit reached (wb scripted usage limit); try again in 3s."
OUTSIDE_PATH: Final = "../outside-write-tool.txt"
OUTSIDE_COMMAND: Final = "echo from-bash > ../outside-bash.txt"
OUTSIDE_MESSAGE: Final = "I tried to write outside the worktree."
SIDE_ANSWER: Final = "Greeting"
_WORKING_DIRECTORY = re.compile(r"(?:Primary working directory|Working directory): *(/[^\s<]*)")


@dataclass(frozen=True)
class MessagesUsage(FieldSum):
    """Token counts one response reports, as the Messages API names them (cache reads and writes
    are not part of `input_tokens` there)."""

    input_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    output_tokens: int = 0

    def as_wb_usage(self) -> dict[str, int]:
        """What wb reports for this usage (docs/cli.md#results: `input_tokens` counts cache reads and writes)."""
        return {
            "input_tokens": self.input_tokens + self.cache_read_input_tokens + self.cache_creation_input_tokens,
            "cached_input_tokens": self.cache_read_input_tokens,
            "cache_write_input_tokens": self.cache_creation_input_tokens,
            "output_tokens": self.output_tokens,
        }


@dataclass(frozen=True)
class ServedMessage:
    """One scripted response: its scenario, step (None for a side request), HTTP status and usage."""

    scenario: str
    step: int | None
    status: int
    usage: MessagesUsage | None


@dataclass(frozen=True)
class _Step:
    blocks: list[dict[str, Any]]  # content blocks: {"type":"text","text"} or {"type":"tool_use","name","input"}
    usage: MessagesUsage | None = None
    http_status: int = 200


WRITE_FILE_USAGE: Final = (
    MessagesUsage(1500, 0, 200, 40),
    MessagesUsage(1700, 1500, 0, 60),
    MessagesUsage(1900, 1700, 0, 12),
)
ONE_COMMAND_USAGE: Final = (MessagesUsage(1100, 0, 0, 30), MessagesUsage(1300, 1100, 0, 10))


def _working_directory(body: Mapping[str, Any]) -> str | None:
    """The working directory Claude Code names in its system prompt (or first message), if any."""
    texts: list[str] = []
    system = body.get("system")
    if isinstance(system, str):
        texts.append(system)
    elif isinstance(system, list):
        texts += [str(block.get("text", "")) for block in system if isinstance(block, dict)]
    messages = body.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[0], dict):
        content = messages[0].get("content")
        if isinstance(content, list):
            texts += [str(block.get("text", "")) for block in content if isinstance(block, dict)]
    for text in texts:
        found = _WORKING_DIRECTORY.search(text)
        if found:
            return found.group(1).rstrip("/.")
    return None


def _bash(command: str) -> dict[str, Any]:
    return {"type": "tool_use", "name": "Bash", "input": {"command": command, "description": "Run the command"}}


def _write_file(body: Mapping[str, Any], step: int) -> _Step:
    if step == 0:
        blocks = [{"type": "text", "text": "I'll look first."}, _bash(WRITE_FILE_LIST_COMMAND)]
        return _Step(blocks, WRITE_FILE_USAGE[0])
    if step == 1:
        cwd = _working_directory(body)
        path = f"{cwd}/{HELLO_PATH}" if cwd else HELLO_PATH
        write = {"type": "tool_use", "name": "Write", "input": {"file_path": path, "content": HELLO_CONTENT}}
        return _Step([write], WRITE_FILE_USAGE[1])
    return _Step([{"type": "text", "text": WRITE_FILE_MESSAGE}], WRITE_FILE_USAGE[2])


def _fail(body: Mapping[str, Any], step: int) -> _Step:
    return _Step([], http_status=400)


def _commit(body: Mapping[str, Any], step: int) -> _Step:
    if step == 0:
        return _Step([_bash(COMMIT_COMMAND)], ONE_COMMAND_USAGE[0])
    return _Step([{"type": "text", "text": COMMIT_MESSAGE}], ONE_COMMAND_USAGE[1])


def _endless(body: Mapping[str, Any], step: int) -> _Step:
    return _Step([_bash("true")], MessagesUsage(300, 0, 0, 100))


def _outside(body: Mapping[str, Any], step: int) -> _Step:
    if step == 0:
        cwd = _working_directory(body) or "."
        write = {"type": "tool_use", "name": "Write", "input": {"file_path": f"{cwd}/{OUTSIDE_PATH}", "content": "x\n"}}
        return _Step([write], ONE_COMMAND_USAGE[0])
    if step == 1:
        return _Step([_bash(OUTSIDE_COMMAND)], ONE_COMMAND_USAGE[0])
    return _Step([{"type": "text", "text": OUTSIDE_MESSAGE}], ONE_COMMAND_USAGE[1])


def _probe(step: int, port: int) -> _Step:
    if step == 0:
        return _Step([_bash(probe_command(port))], ONE_COMMAND_USAGE[0])
    return _Step([{"type": "text", "text": PROBE_MESSAGE}], ONE_COMMAND_USAGE[1])


_SCRIPTS: Final[dict[str, Callable[[Mapping[str, Any], int], _Step]]] = {
    "write-file": _write_file,
    "fail": _fail,
    "commit": _commit,
    "outside": _outside,
    "endless": _endless,
    "endless-unmetered": _endless,
}


def _step_of(body: Mapping[str, Any]) -> int:
    count = 0
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            count += sum(1 for block in content if isinstance(block, dict) and block.get("type") == "tool_result")
    return count


def _message_events(
    message_id: str, model: str, blocks: list[dict[str, Any]], usage: MessagesUsage, *, metered: bool = True
) -> bytes:
    """One streamed message: message_start, a start/delta/stop per block, message_delta, message_stop (without any
    `usage` when not `metered`)."""
    start_usage = {
        "input_tokens": usage.input_tokens,
        "cache_creation_input_tokens": usage.cache_creation_input_tokens,
        "cache_read_input_tokens": usage.cache_read_input_tokens,
        "output_tokens": 1,
    }
    message: dict[str, Any] = {
        "id": message_id, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": start_usage,
    }  # fmt: skip
    if not metered:
        del message["usage"]
    events: list[dict[str, Any]] = [{"type": "message_start", "message": message}]
    stop_reason = "end_turn"
    for index, block in enumerate(blocks):
        if block["type"] == "tool_use":
            stop_reason = "tool_use"
            start = {"type": "tool_use", "id": f"toolu_{message_id}_{index}", "name": block["name"], "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        else:
            start = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        events += [
            {"type": "content_block_start", "index": index, "content_block": start},
            {"type": "content_block_delta", "index": index, "delta": delta},
            {"type": "content_block_stop", "index": index},
        ]
    delta_event: dict[str, Any] = {
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason, "stop_sequence": None},
        "usage": {"output_tokens": usage.output_tokens},
    }
    if not metered:
        del delta_event["usage"]
    events += [delta_event, {"type": "message_stop"}]
    return sse(events)


def _error(
    request: ScriptedHandler, status: int, kind: str, message: str, headers: Mapping[str, str] | None = None
) -> None:
    request.send_json(status, {"type": "error", "error": {"type": kind, "message": message}}, headers)


class AnthropicServer(ScriptedServer[ServedMessage]):
    """The scripted Messages server. Use as a context manager, or call `start()` and `stop()`.

    `base_url` is the provider `base_url` to configure (`http://127.0.0.1:<port>`, Claude Code
    appends `/v1/messages`); `base_url_for(name)` selects another scenario by URL prefix.
    """

    scenarios = SCENARIOS
    methods = frozenset({"GET", "POST", "HEAD"})
    thread_name = "wb-anthropic-server"

    def usage_reported(self, scenario: str | None = None, *, side: bool = True) -> MessagesUsage:
        """The sum of the usage the responses reported (optionally one scenario; side requests when `side`)."""
        return sum_usage(
            MessagesUsage(),
            (s.usage for s in self.served if scenario in (None, s.scenario) and (side or s.step is not None)),
        )

    def refuse_body(self, request: ScriptedHandler, message: str) -> None:
        _error(request, 413, "request_too_large", message)

    def handle(self, request: ScriptedHandler, body: Any) -> None:
        if request.command == "HEAD":
            request.send(200, "text/plain", b"")
            return
        route = request.api_path() if request.command == "POST" else None
        if route is None or route[1] != "/messages":
            _error(request, 404, "not_found_error", f"no such path: {request.path}")
            return
        if not isinstance(body, dict):
            _error(request, 400, "invalid_request_error", "the body is not a JSON object")
            return
        scenario = route[0]
        model = str(body.get("model") or "claude-scripted")
        message_id = f"msg_{scenario.replace('-', '')}{self._next_id():04d}"
        metered = not scenario.endswith("-unmetered")
        if not body.get("tools"):
            usage = MessagesUsage(10, 0, 0, 1)
            self._serve(ServedMessage(scenario, None, 200, usage if metered else None))
            side = [{"type": "text", "text": SIDE_ANSWER}]
            request.send(200, "text/event-stream", _message_events(message_id, model, side, usage, metered=metered))
            return
        step_number = _step_of(body)
        retry_after = self.take_limit(step_number)
        if retry_after is not None:
            _error(request, 429, "rate_limit_error", LIMIT_MESSAGE, {"retry-after": retry_after})
            return
        if scenario == "probe":  # its command names this server's own port
            step = _probe(step_number, int(request.server.server_address[1]))
        else:
            step = _SCRIPTS[scenario](body, step_number)
        self._serve(ServedMessage(scenario, step_number, step.http_status, step.usage if metered else None))
        if step.http_status != 200:
            _error(request, step.http_status, "invalid_request_error", FAIL_MESSAGE)
            return
        assert step.usage is not None
        events = _message_events(message_id, model, step.blocks, step.usage, metered=metered)
        request.send(200, "text/event-stream", events)
