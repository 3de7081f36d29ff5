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

A URL prefix selects the scenario per request: `base_url_for("fail")` is
``http://127.0.0.1:<port>/fail`` (the CLI appends ``/v1beta/models/...``). Only the standard
library is used, so the module backs `wb demo` as well as the test suite.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Final

from courier.demo.model_server import FAIL_MESSAGE, HELLO_CONTENT, HELLO_PATH, WRITE_FILE_LIST_COMMAND, RecordedRequest

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

GEMINI_SCENARIOS: Final = ("write-file", "fail", "limits")
GEMINI_WRITE_FILE_MESSAGE: Final = "Created hello.txt with a greeting."
_FINAL_CHUNKS: Final = ("Created hello.txt ", "with a greeting.")
_MAX_BODY_BYTES: Final = 64 * 1024 * 1024
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
class GeminiUsage:
    """One response's `usageMetadata`: `cached` is part of `prompt`, `thoughts` apart from `candidates`."""

    prompt: int = 0
    cached: int = 0
    candidates: int = 0
    thoughts: int = 0

    def __add__(self, other: GeminiUsage) -> GeminiUsage:
        return GeminiUsage(
            self.prompt + other.prompt,
            self.cached + other.cached,
            self.candidates + other.candidates,
            self.thoughts + other.thoughts,
        )

    def metadata(self) -> dict[str, int]:
        return {
            "promptTokenCount": self.prompt,
            "cachedContentTokenCount": self.cached,
            "candidatesTokenCount": self.candidates,
            "thoughtsTokenCount": self.thoughts,
            "totalTokenCount": self.prompt + self.candidates + self.thoughts,
        }

    def wb_usage(self) -> dict[str, int]:
        """What wb reports for this usage (contract §6.3): the CLI's `result.stats`, renamed."""
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


_SCRIPTS: Final[dict[str, Callable[[str | None, int], _Step]]] = {
    "write-file": _write_file,
    "fail": _fail,
    "limits": _limits,
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


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: GeminiServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # silence the per-request stderr line
        pass

    def _read_body(self) -> bytes:
        length = int(self.headers.get("content-length") or 0)
        if length > _MAX_BODY_BYTES:
            raise ValueError("request body too large")
        return self.rfile.read(length) if length > 0 else b""

    def _send(self, status: int, content_type: str, data: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_json(self, status: int, value: Any) -> None:
        self._send(status, "application/json", json.dumps(value).encode())

    def _error(self, status: int, message: str, kind: str) -> None:
        self._send_json(status, {"error": {"code": status, "message": message, "status": kind}})

    def _route(self) -> tuple[str, str, str] | None:
        """(scenario, model, method) for `[/<scenario>]/v1beta/models/<model>:<method>`; None otherwise."""
        parts = self.path.split("?", 1)[0].strip("/").split("/")
        scenario = self.server.owner.scenario
        if parts and parts[0] in _SCRIPTS:
            scenario, parts = parts[0], parts[1:]
        if len(parts) != 3 or parts[0] != _API_VERSION or parts[1] != "models" or ":" not in parts[2]:
            return None
        model, method = parts[2].split(":", 1)
        return scenario, model, method

    def do_GET(self) -> None:
        self.server.owner._record(RecordedRequest("GET", self.path, dict(self.headers.items()), None))
        self._error(404, f"no such path: {self.path}", "NOT_FOUND")

    def do_POST(self) -> None:
        try:
            raw = self._read_body()
        except ValueError as exc:
            self._error(400, str(exc), "INVALID_ARGUMENT")
            self.close_connection = True
            return
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = None
        owner = self.server.owner
        owner._record(RecordedRequest("POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body, raw))
        route = self._route()
        if route is None:
            self._error(404, f"no such path: {self.path}", "NOT_FOUND")
            return
        if not isinstance(body, dict):
            self._error(400, "the body is not a JSON object", "INVALID_ARGUMENT")
            return
        scenario, model, method = route
        if method == "countTokens":
            self._send_json(200, {"totalTokens": 100})
            return
        if method not in ("streamGenerateContent", "generateContent"):
            self._error(404, f"no such method: {method}", "NOT_FOUND")
            return
        step_number = _step_of(body)
        step = _SCRIPTS[scenario](workspace_of(body), step_number)
        owner._served_response(GeminiServed(scenario, step_number, step.http_status, step.usage, model))
        if step.http_status != 200:
            self._error(step.http_status, FAIL_MESSAGE, "INVALID_ARGUMENT")
            return
        chunks = [
            _chunk(parts, final=index == len(step.chunks) - 1, usage=step.usage, model=model)
            for index, parts in enumerate(step.chunks)
        ]
        if method == "generateContent":
            merged = [part for parts in step.chunks for part in parts]
            self._send_json(200, _chunk(merged, final=True, usage=step.usage, model=model))
            return
        data = "".join(f"data: {json.dumps(chunk)}\r\n\r\n" for chunk in chunks).encode()
        self._send(200, "text/event-stream", data)


class GeminiServer:
    """The scripted Gemini server. Use as a context manager, or call `start()` and `stop()`.

    `base_url` is the provider `base_url` to configure (`http://127.0.0.1:<port>`); `requests`
    and `served` are snapshots, safe to read while the server runs.
    """

    def __init__(self, scenario: str = "write-file", *, host: str = "127.0.0.1", port: int = 0) -> None:
        if scenario not in _SCRIPTS:
            raise ValueError(f"unknown scenario {scenario!r}; known: {', '.join(GEMINI_SCENARIOS)}")
        self.scenario = scenario
        self._host = host
        self._port = port
        self._lock = threading.Lock()
        self._requests: list[RecordedRequest] = []
        self._served: list[GeminiServed] = []
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("the Gemini server is already running")
        server = _Server((self._host, self._port), _Handler)
        server.owner = self
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="wb-gemini-server", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def __enter__(self) -> GeminiServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the Gemini server is not running")
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def base_url_for(self, scenario: str) -> str:
        if scenario not in _SCRIPTS:
            raise ValueError(f"unknown scenario {scenario!r}; known: {', '.join(GEMINI_SCENARIOS)}")
        return f"{self.base_url}/{scenario}"

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    @property
    def served(self) -> list[GeminiServed]:
        with self._lock:
            return list(self._served)

    def usage_reported(self, scenario: str | None = None) -> GeminiUsage:
        total = GeminiUsage()
        for response in self.served:
            if response.usage is not None and scenario in (None, response.scenario):
                total += response.usage
        return total

    def clear(self) -> None:
        with self._lock:
            self._requests.clear()
            self._served.clear()

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(request)

    def _served_response(self, response: GeminiServed) -> None:
        with self._lock:
            self._served.append(response)
