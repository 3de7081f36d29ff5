"""A scripted stand-in for a Gemini model: just enough of `streamGenerateContent?alt=sse` for the Gemini CLI.

It listens on 127.0.0.1 (an ephemeral port) and serves
`POST <prefix>/v1beta/models/<model>:streamGenerateContent?alt=sse` as Server-Sent Events (and
`:generateContent` / `:countTokens` as plain JSON, which the CLI may call for side questions).
As `courier.demo.model_server` does for Codex, it answers from a small script (a *scenario*); the
step to play is the number of `functionResponse` parts the CLI sent back in the request's
`contents`, so a run replays the same way every time.

Scenarios (see `GEMINI_SCENARIOS`):

* ``write-file``: runs ``ls`` (`run_shell_command`), then writes ``hello.txt`` (`write_file`),
  then says `WRITE_FILE_MESSAGE` in two text chunks; every response reports known usage.
* ``fail``: every request gets HTTP 400 with `FAIL_MESSAGE` (the CLI does not retry a 400).
* ``limits``: one command that says whether it sees GEMINI_API_KEY and commits in the worktree,
  then a `write_file` just outside the workspace, then `LIMITS_MESSAGE`.
* ``endless``: runs ``true`` at every step, never finishing; each response reports 400 tokens
  (300 prompt, 100 candidates), so a budget is what ends it.
* ``endless-unmetered``: as ``endless``, but no response carries `usageMetadata` (a provider whose
  stream reports none, docs/cli.md#budgets).

A URL prefix selects the scenario per request: `base_url_for("fail")` is
``http://127.0.0.1:<port>/fail`` (the CLI appends ``/v1beta/models/...``). Only the standard
library is used, so the module backs `wb demo` as well as the test suite.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from courier.demo.model_server import (
    FAIL_MESSAGE,
    HELLO_CONTENT,
    HELLO_PATH,
    PROBE_MESSAGE,
    WRITE_FILE_LIST_COMMAND,
    probe_command,
)
from courier.demo.scripted_http import FieldSum, ScriptedHandler, ScriptedServer, sse, sum_usage

__all__ = [
    "GEMINI_SCENARIOS",
    "GEMINI_WRITE_FILE_MESSAGE",
    "LIMITS_COMMAND",
    "LIMITS_MESSAGE",
    "LIMITS_OUTSIDE_NAME",
    "GeminiServed",
    "GeminiServer",
    "GeminiUsage",
]

GEMINI_SCENARIOS: Final = ("write-file", "fail", "limits", "endless", "endless-unmetered", "probe")
LIMIT_MESSAGE: Final = "Resource has been exhausted (wb scripted usage limit); try again in 3s."
GEMINI_WRITE_FILE_MESSAGE: Final = "Created hello.txt with a greeting."
_FINAL_CHUNKS: Final = ("Created hello.txt ", "with a greeting.")
_API_VERSION: Final = "v1beta"
_WORKSPACE: Final = re.compile(r"\*\*Workspace Directories:\*\*\n\s*- (/[^\n]*)")
LIMITS_COMMAND: Final = (
    "printenv GEMINI_API_KEY >/dev/null && echo key-visible || echo key-hidden; "
    "echo committed > committed.txt && git add committed.txt && "
    "git -c user.name=wb-demo -c user.email=wb-demo@example.invalid commit -q -m 'wb demo commit' && echo commit-ok"
)
LIMITS_OUTSIDE_NAME: Final = "outside-the-worktree.txt"
LIMITS_MESSAGE: Final = "I tried the limits."


@dataclass(frozen=True)
class GeminiUsage(FieldSum):
    """One response's `usageMetadata`: `cached` is part of `prompt`, `thoughts` apart from `candidates`."""

    prompt: int = 0
    cached: int = 0
    candidates: int = 0
    thoughts: int = 0

    def metadata(self) -> dict[str, int]:
        return {
            "promptTokenCount": self.prompt,
            "cachedContentTokenCount": self.cached,
            "candidatesTokenCount": self.candidates,
            "thoughtsTokenCount": self.thoughts,
            "totalTokenCount": self.prompt + self.candidates + self.thoughts,
        }

    def wb_usage(self) -> dict[str, int]:
        """What wb reports for this usage (docs/cli.md#results): the CLI's `result.stats`, renamed."""
        return {"input_tokens": self.prompt, "cached_input_tokens": self.cached, "output_tokens": self.candidates}


@dataclass(frozen=True)
class GeminiServed:
    """One scripted response: its scenario, step, HTTP status, the usage it reported (if any) and its model."""

    scenario: str
    step: int
    status: int
    usage: GeminiUsage | None
    model: str


@dataclass(frozen=True)
class _Step:
    chunks: list[list[dict[str, Any]]]  # the parts of each SSE chunk
    usage: GeminiUsage | None = None
    http_status: int = 200


# Distinct numbers, so a sum tells which responses it counts.
WRITE_FILE_USAGE: Final = (GeminiUsage(2100, 0, 40, 12), GeminiUsage(2300, 2000, 60, 0), GeminiUsage(2500, 2200, 15, 0))


def _call(name: str, args: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"functionCall": {"name": name, "args": args}}]


def _write_file(workspace: str | None, step: int) -> _Step:
    if step == 0:
        return _Step([_call("run_shell_command", {"command": WRITE_FILE_LIST_COMMAND, "description": "List files"})],
                     WRITE_FILE_USAGE[0])  # fmt: skip
    if step == 1:
        path = f"{workspace}/{HELLO_PATH}" if workspace else HELLO_PATH
        return _Step([_call("write_file", {"file_path": path, "content": HELLO_CONTENT})], WRITE_FILE_USAGE[1])
    return _Step([[{"text": chunk}] for chunk in _FINAL_CHUNKS], WRITE_FILE_USAGE[2])


def _fail(workspace: str | None, step: int) -> _Step:
    return _Step([], http_status=400)


def _limits(workspace: str | None, step: int) -> _Step:
    """A command that reads the key and commits; a file write outside the workspace; a final text."""
    if step == 0:
        return _Step([_call("run_shell_command", {"command": LIMITS_COMMAND, "description": "Probe"})],
                     WRITE_FILE_USAGE[0])  # fmt: skip
    if step == 1:
        outside = f"{os.path.dirname(workspace or '/')}/{LIMITS_OUTSIDE_NAME}"
        return _Step([_call("write_file", {"file_path": outside, "content": "escaped\n"})], WRITE_FILE_USAGE[1])
    return _Step([[{"text": LIMITS_MESSAGE}]], WRITE_FILE_USAGE[2])


def _endless(workspace: str | None, step: int) -> _Step:
    call = _call("run_shell_command", {"command": "true", "description": "Nothing"})
    return _Step([call], GeminiUsage(300, 0, 100, 0))


def _probe(step: int, port: int) -> _Step:
    if step == 0:
        return _Step([_call("run_shell_command", {"command": probe_command(port), "description": "Probe"})],
                     GeminiUsage(300, 0, 30, 0))
    return _Step([[{"text": PROBE_MESSAGE}]], GeminiUsage(400, 300, 10, 0))


_SCRIPTS: Final[dict[str, Callable[[str | None, int], _Step]]] = {
    "write-file": _write_file,
    "fail": _fail,
    "limits": _limits,
    "endless": _endless,
    "endless-unmetered": lambda workspace, step: _Step(_endless(workspace, step).chunks),
}


def _contents(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    contents = body.get("contents")
    return [c for c in contents if isinstance(c, dict)] if isinstance(contents, list) else []


def _step_of(body: Mapping[str, Any]) -> int:
    """How many tool results the CLI sent back: the script's position."""
    count = 0
    for content in _contents(body):
        parts = content.get("parts")
        if isinstance(parts, list):
            count += sum(1 for part in parts if isinstance(part, dict) and "functionResponse" in part)
    return count


def workspace_of(body: Mapping[str, Any]) -> str | None:
    """The first workspace directory the CLI told the model about in its session context."""
    for content in _contents(body):
        parts = content.get("parts")
        for part in parts if isinstance(parts, list) else []:
            text = part.get("text") if isinstance(part, dict) else None
            if isinstance(text, str) and (found := _WORKSPACE.search(text)):
                return found.group(1)
    return None


def _chunk(parts: list[dict[str, Any]], *, final: bool, usage: GeminiUsage | None, model: str) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if final:
        candidate["finishReason"] = "STOP"
    chunk: dict[str, Any] = {"candidates": [candidate], "modelVersion": model}
    if final and usage is not None:
        chunk["usageMetadata"] = usage.metadata()
    return chunk


def _error(
    request: ScriptedHandler, status: int, message: str, kind: str, headers: Mapping[str, str] | None = None
) -> None:
    request.send_json(status, {"error": {"code": status, "message": message, "status": kind}}, headers)


class GeminiServer(ScriptedServer[GeminiServed]):
    """The scripted Gemini server. Use as a context manager, or call `start()` and `stop()`.

    `base_url` is the provider `base_url` to configure (`http://127.0.0.1:<port>`); `requests`
    and `served` are snapshots, safe to read while the server runs.
    """

    scenarios = GEMINI_SCENARIOS
    label = "Gemini server"
    thread_name = "wb-gemini-server"

    def usage_reported(self, scenario: str | None = None) -> GeminiUsage:
        return sum_usage(GeminiUsage(), (r.usage for r in self.served if scenario in (None, r.scenario)))

    def refuse_body(self, request: ScriptedHandler, message: str) -> None:
        _error(request, 400, message, "INVALID_ARGUMENT")

    def handle(self, request: ScriptedHandler, body: Any) -> None:
        route = _route(request) if request.command == "POST" else None
        if route is None:
            _error(request, 404, f"no such path: {request.path}", "NOT_FOUND")
            return
        if not isinstance(body, dict):
            _error(request, 400, "the body is not a JSON object", "INVALID_ARGUMENT")
            return
        scenario, model, method = route
        if method == "countTokens":
            request.send_json(200, {"totalTokens": 100})
            return
        if method not in ("streamGenerateContent", "generateContent"):
            _error(request, 404, f"no such method: {method}", "NOT_FOUND")
            return
        step_number = _step_of(body)
        retry_after = self.take_limit(step_number)
        if retry_after is not None:
            _error(request, 429, LIMIT_MESSAGE, "RESOURCE_EXHAUSTED", {"retry-after": retry_after})
            return
        if scenario == "probe":  # its command names this server's own port
            step = _probe(step_number, int(request.server.server_address[1]))
        else:
            step = _SCRIPTS[scenario](workspace_of(body), step_number)
        self._serve(GeminiServed(scenario, step_number, step.http_status, step.usage, model))
        if step.http_status != 200:
            _error(request, step.http_status, FAIL_MESSAGE, "INVALID_ARGUMENT")
            return
        if method == "generateContent":
            merged = [part for parts in step.chunks for part in parts]
            request.send_json(200, _chunk(merged, final=True, usage=step.usage, model=model))
            return
        chunks = [
            _chunk(parts, final=index == len(step.chunks) - 1, usage=step.usage, model=model)
            for index, parts in enumerate(step.chunks)
        ]
        request.send(200, "text/event-stream", sse(chunks, named=False, newline="\r\n"))


def _route(request: ScriptedHandler) -> tuple[str, str, str] | None:
    """(scenario, model, method) for `[/<scenario>]/v1beta/models/<model>:<method>`; None otherwise."""
    scenario, parts = request.route()
    if len(parts) != 3 or parts[0] != _API_VERSION or parts[1] != "models" or ":" not in parts[2]:
        return None
    model, method = parts[2].split(":", 1)
    return scenario, model, method
