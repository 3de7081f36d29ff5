"""A scripted stand-in for a model: just enough of the OpenAI Responses streaming API for `codex exec`.

It listens on 127.0.0.1 (an ephemeral port), serves `POST <prefix>/v1/responses` as Server-Sent
Events and `GET <prefix>/v1/models` as an empty list, and answers each request from a small script
(a *scenario*). Which step of the script to play is decided the way a real model "decides": by
counting the tool outputs (`function_call_output` / `custom_tool_call_output` items) the harness
sent back in the request's `input`. Tool calls use whatever tool shape the request's `tools` list
offers (a `custom` `apply_patch` tool or a function one; `exec_command`, `shell_command` or `shell`).

Scenarios (see `SCENARIOS`):

* ``write-file``: runs ``ls``, then adds ``hello.txt`` with `apply_patch`, then says
  ``Created hello.txt.``; every response reports known usage.
* ``fail``: every response ends with ``response.failed`` carrying `FAIL_MESSAGE`.
* ``http-500``: every request gets HTTP 500 with `FAIL_MESSAGE` as the JSON error message.
* ``commit``: writes ``committed.txt`` and tries ``git add`` + ``git commit`` in one command, then
  reports back.
* ``supervise``: a supervisor that drives wb through its MCP tools: calls ``dispatch`` with the
  JSON object that follows ``dispatch:`` in the user's prompt, then ``await`` on the run it got,
  then reports ``Supervised <ref>: <state>.``. The tool names come from the request's `tools`
  list (see `mcp_tool`), as a model would read them.
* ``network``: tries to fetch ``http://127.0.0.1:<this server's port>/ping`` from a command
  (bash's ``/dev/tcp``, so no curl is needed), then reports back. A ``GET /ping`` that arrives is
  recorded in `requests` like any other request, so a caller can tell whether it got through.

The default scenario is the constructor's; a URL prefix selects another one per request:
``base_url_for("fail")`` is ``http://127.0.0.1:<port>/fail/v1``. Only the standard library is used,
so the module can back a `wb demo` command as well as the test suite.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Final

__all__ = [
    "COMMIT_COMMAND",
    "COMMIT_MESSAGE",
    "FAIL_MESSAGE",
    "HELLO_CONTENT",
    "HELLO_PATH",
    "NETWORK_MESSAGE",
    "SCENARIOS",
    "WRITE_FILE_LIST_COMMAND",
    "WRITE_FILE_MESSAGE",
    "ModelServer",
    "RecordedRequest",
    "ServedResponse",
    "TokenUsage",
    "mcp_tool",
    "network_command",
]

SCENARIOS: Final = ("write-file", "fail", "http-500", "commit", "network", "supervise")

HELLO_PATH: Final = "hello.txt"
HELLO_CONTENT: Final = "hello from the scripted model\n"
WRITE_FILE_LIST_COMMAND: Final = "ls"
WRITE_FILE_MESSAGE: Final = "Created hello.txt."
FAIL_MESSAGE: Final = "scripted upstream failure (wb demo model server)"
COMMIT_COMMAND: Final = (
    "echo committed > committed.txt && git add committed.txt && "
    "git -c user.name=wb-demo -c user.email=wb-demo@example.invalid commit -q -m 'wb demo commit'"
)
COMMIT_MESSAGE: Final = "I tried to commit committed.txt."
NETWORK_MESSAGE: Final = "I tried to reach the network."
PING_BODY: Final = b"pong\n"

_TOOL_OUTPUT_TYPES: Final = frozenset({"function_call_output", "custom_tool_call_output"})
_MAX_BODY_BYTES: Final = 64 * 1024 * 1024


@dataclass(frozen=True)
class TokenUsage:
    """Token counts one response reports, named as Codex names them in `turn.completed.usage`.

    `cached_input_tokens` is part of `input_tokens` and `reasoning_output_tokens` part of
    `output_tokens`, as in the Responses API's `*_tokens_details`.
    """

    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0
    reasoning_output_tokens: int = 0

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            self.input_tokens + other.input_tokens,
            self.cached_input_tokens + other.cached_input_tokens,
            self.output_tokens + other.output_tokens,
            self.reasoning_output_tokens + other.reasoning_output_tokens,
        )

    def responses_api(self) -> dict[str, Any]:
        """The `response.usage` object of the Responses API."""
        return {
            "input_tokens": self.input_tokens,
            "input_tokens_details": {"cached_tokens": self.cached_input_tokens},
            "output_tokens": self.output_tokens,
            "output_tokens_details": {"reasoning_tokens": self.reasoning_output_tokens},
            "total_tokens": self.input_tokens + self.output_tokens,
        }

    def as_dict(self) -> dict[str, int]:
        return {
            "input_tokens": self.input_tokens,
            "cached_input_tokens": self.cached_input_tokens,
            "output_tokens": self.output_tokens,
            "reasoning_output_tokens": self.reasoning_output_tokens,
        }


@dataclass(frozen=True)
class RecordedRequest:
    """One request the server received. `body` is the decoded JSON, or None when absent or not JSON."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: Any
    raw_body: bytes = field(repr=False, default=b"")


@dataclass(frozen=True)
class ServedResponse:
    """One scripted model response: its scenario, step, HTTP status and the usage it reported (if any)."""

    scenario: str
    step: int
    status: int
    usage: TokenUsage | None
    thread: str | None  # the request's `prompt_cache_key` (Codex sends its thread id there)


# --------------------------------------------------------------------------- SSE building blocks


def _tool_names(body: Mapping[str, Any]) -> dict[str, str]:
    """name → type of each tool the request offers (a tool without a name is keyed by its type)."""
    offered: dict[str, str] = {}
    tools = body.get("tools")
    if isinstance(tools, list):
        for tool in tools:
            if isinstance(tool, dict):
                kind = str(tool.get("type", ""))
                offered[str(tool.get("name") or kind)] = kind
    return offered


def _function_call(call_id: str, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "type": "response.output_item.done",
        "item": {"type": "function_call", "call_id": call_id, "name": name, "arguments": json.dumps(arguments)},
    }


def _shell_call(body: Mapping[str, Any], call_id: str, command: str) -> dict[str, Any]:
    offered = _tool_names(body)
    if "exec_command" in offered:
        return _function_call(call_id, "exec_command", {"cmd": command})
    if "shell_command" in offered:
        return _function_call(call_id, "shell_command", {"command": command})
    return _function_call(call_id, "shell", {"command": ["bash", "-lc", command]})


def _patch_call(body: Mapping[str, Any], call_id: str, patch: str) -> dict[str, Any]:
    kind = _tool_names(body).get("apply_patch")
    if kind == "custom":
        return {
            "type": "response.output_item.done",
            "item": {"type": "custom_tool_call", "call_id": call_id, "name": "apply_patch", "input": patch},
        }
    if kind is not None:
        return _function_call(call_id, "apply_patch", {"input": patch})
    # No apply_patch tool on offer (an uncatalogued model): Codex still intercepts it in a shell command.
    return _shell_call(body, call_id, f"apply_patch <<'EOF'\n{patch}EOF\n")


def _message(item_id: str, text: str) -> dict[str, Any]:
    return {
        "type": "response.output_item.done",
        "item": {
            "type": "message",
            "role": "assistant",
            "id": item_id,
            "content": [{"type": "output_text", "text": text}],
        },
    }


def _reasoning(item_id: str, text: str) -> dict[str, Any]:
    return {
        "type": "response.output_item.done",
        "item": {"type": "reasoning", "id": item_id, "summary": [{"type": "summary_text", "text": text}]},
    }


def _add_file_patch(path: str, content: str) -> str:
    lines = "".join(f"+{line}\n" for line in content.splitlines())
    return f"*** Begin Patch\n*** Add File: {path}\n{lines}*** End Patch\n"


# --------------------------------------------------------------------------- scenarios


@dataclass(frozen=True)
class _Step:
    """What one response says: output items (SSE events) and usage; or a failure."""

    events: list[dict[str, Any]]
    usage: TokenUsage | None = None
    failed: str | None = None  # a response.failed message
    http_status: int = 200


# Usage each scripted response reports. Distinct numbers, so a sum tells which responses it counts.
WRITE_FILE_USAGE: Final = (
    TokenUsage(1500, 0, 40, 16),
    TokenUsage(1700, 1500, 60, 0),
    TokenUsage(1900, 1700, 12, 0),
)
ONE_COMMAND_USAGE: Final = (TokenUsage(1100, 0, 30, 0), TokenUsage(1300, 1100, 10, 0))


def _write_file(body: Mapping[str, Any], step: int, port: int) -> _Step:
    if step == 0:
        return _Step(
            [_reasoning("rs_0", "**Listing files**"), _shell_call(body, "call_ls", WRITE_FILE_LIST_COMMAND)],
            WRITE_FILE_USAGE[0],
        )
    if step == 1:
        return _Step([_patch_call(body, "call_patch", _add_file_patch(HELLO_PATH, HELLO_CONTENT))], WRITE_FILE_USAGE[1])
    return _Step([_message("msg_2", WRITE_FILE_MESSAGE)], WRITE_FILE_USAGE[2])


def _fail(body: Mapping[str, Any], step: int, port: int) -> _Step:
    return _Step([], failed=FAIL_MESSAGE)


def _http_500(body: Mapping[str, Any], step: int, port: int) -> _Step:
    return _Step([], http_status=500)


def _commit(body: Mapping[str, Any], step: int, port: int) -> _Step:
    if step == 0:
        return _Step([_shell_call(body, "call_commit", COMMIT_COMMAND)], ONE_COMMAND_USAGE[0])
    return _Step([_message("msg_1", COMMIT_MESSAGE)], ONE_COMMAND_USAGE[1])


def network_command(port: int) -> str:
    """The command the `network` scenario runs: one HTTP GET of /ping on loopback, with bash only."""
    return (
        f"exec 3<>/dev/tcp/127.0.0.1/{port} && "
        "printf 'GET /ping HTTP/1.0\\r\\nHost: 127.0.0.1\\r\\n\\r\\n' >&3 && cat <&3"
    )


def _network(body: Mapping[str, Any], step: int, port: int) -> _Step:
    if step == 0:
        return _Step([_shell_call(body, "call_net", network_command(port))], ONE_COMMAND_USAGE[0])
    return _Step([_message("msg_1", NETWORK_MESSAGE)], ONE_COMMAND_USAGE[1])


def mcp_tool(body: Mapping[str, Any], tool: str) -> tuple[str | None, str] | None:
    """How the request offers an MCP server's `tool`: (namespace, name) or None.

    Codex 0.169.0 offers a server's tools as one `namespace` tool named `mcp__<server>` whose
    functions keep the MCP names (a call then carries `namespace` and `name`); a flat function
    named `mcp__<server>__<tool>` is accepted too.
    """
    for offered in body.get("tools") or []:
        if not isinstance(offered, dict):
            continue
        name = str(offered.get("name", ""))
        if offered.get("type") == "namespace" and name.startswith("mcp__"):
            inner = offered.get("tools") or []
            if any(isinstance(t, dict) and t.get("name") == tool for t in inner):
                return name, tool
        if offered.get("type") == "function" and name.startswith("mcp__") and name.endswith(f"__{tool}"):
            return None, name
    return None


def _mcp_call(body: Mapping[str, Any], call_id: str, tool: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    found = mcp_tool(body, tool)
    if found is None:
        raise LookupError(f"the request offers no MCP tool named {tool}")
    namespace, name = found
    event = _function_call(call_id, name, arguments)
    if namespace is not None:
        event["item"]["namespace"] = namespace
    return event


def _user_text(body: Mapping[str, Any]) -> str:
    parts: list[str] = []
    for item in body.get("input") or []:
        if isinstance(item, dict) and item.get("role") == "user":
            for content in item.get("content") or []:
                if isinstance(content, dict) and isinstance(content.get("text"), str):
                    parts.append(content["text"])
    return "\n".join(parts)


def _tool_document(body: Mapping[str, Any], index: int) -> dict[str, Any]:
    """The JSON document inside the index-th tool output (Codex prefixes it with a wall-time line)."""
    outputs = [i for i in body.get("input") or [] if isinstance(i, dict) and i.get("type") in _TOOL_OUTPUT_TYPES]
    text = outputs[index].get("output", "") if index < len(outputs) else ""
    if not isinstance(text, str) or "{" not in text:
        return {}
    try:
        document, _ = json.JSONDecoder().raw_decode(text[text.index("{") :])
    except ValueError:
        return {}
    return document if isinstance(document, dict) else {}


SUPERVISE_USAGE: Final = TokenUsage(900, 0, 20, 0)


def _supervise(body: Mapping[str, Any], step: int, port: int) -> _Step:
    if step == 0:
        prompt = _user_text(body)
        marker = prompt.find("dispatch:")
        arguments: Any = {}
        if marker >= 0:
            start = prompt.find("{", marker)
            arguments, _ = json.JSONDecoder().raw_decode(prompt[start:]) if start >= 0 else ({}, 0)
        try:
            return _Step([_mcp_call(body, "call_dispatch", "dispatch", arguments)], SUPERVISE_USAGE)
        except LookupError as exc:
            return _Step([_message("msg_0", f"I cannot supervise: {exc}.")], SUPERVISE_USAGE)
    if step == 1:
        started = _tool_document(body, 0)
        if "agent_id" not in started:
            return _Step([_message("msg_1", f"wb refused the dispatch: {started.get('message', started)}")])
        ref = f"{started['machine']}:{started['agent_id']}" if started.get("machine") else started["agent_id"]
        return _Step([_mcp_call(body, "call_await", "await", {"ref": ref, "wait_timeout": "5m"})], SUPERVISE_USAGE)
    started, finished = _tool_document(body, 0), _tool_document(body, 1)
    ref = f"{started.get('machine')}:{started.get('agent_id')}" if started.get("machine") else started.get("agent_id")
    state = finished.get("state") or f"not known ({finished.get('message', 'no answer')})"
    return _Step([_message("msg_2", f"Supervised {ref}: {state}.")], SUPERVISE_USAGE)


_SCRIPTS: Final[dict[str, Callable[[Mapping[str, Any], int, int], _Step]]] = {
    "write-file": _write_file,
    "fail": _fail,
    "http-500": _http_500,
    "commit": _commit,
    "network": _network,
    "supervise": _supervise,
}


def _step_of(body: Mapping[str, Any]) -> int:
    items = body.get("input")
    if not isinstance(items, list):
        return 0
    return sum(1 for item in items if isinstance(item, dict) and item.get("type") in _TOOL_OUTPUT_TYPES)


def _sse(events: list[dict[str, Any]]) -> bytes:
    return "".join(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n" for event in events).encode()


# --------------------------------------------------------------------------- HTTP


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: ModelServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # silence the per-request stderr line
        pass

    # -- plumbing

    def _read_body(self) -> bytes:
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
                if len(data) > _MAX_BODY_BYTES:
                    raise ValueError("request body too large")
        length = int(self.headers.get("content-length") or 0)
        if length > _MAX_BODY_BYTES:
            raise ValueError("request body too large")
        return self.rfile.read(length) if length > 0 else b""

    def _record(self, raw: bytes) -> Any:
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = None
        self.server.owner._record(
            RecordedRequest(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body, raw)
        )
        return body

    def _send(self, status: int, content_type: str, data: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_json(self, status: int, value: Any) -> None:
        self._send(status, "application/json", json.dumps(value).encode())

    def _route(self) -> tuple[str, str] | None:
        """(scenario, API path after /v1) for `/v1/...` or `/<scenario>/v1/...`; None otherwise."""
        path = self.path.split("?", 1)[0]
        parts = path.strip("/").split("/")
        if parts and parts[0] == "v1":
            return self.server.owner.scenario, "/" + "/".join(parts[1:])
        if len(parts) >= 2 and parts[0] in _SCRIPTS and parts[1] == "v1":
            return parts[0], "/" + "/".join(parts[2:])
        return None

    # -- methods

    def do_GET(self) -> None:
        self._record(b"")
        if self.path.split("?", 1)[0] == "/ping":
            self._send(200, "text/plain", PING_BODY)
            return
        route = self._route()
        if route is not None and route[1] == "/models":
            self._send_json(200, {"object": "list", "data": [], "models": []})
            return
        self._send_json(404, {"error": {"message": f"no such path: {self.path}", "type": "not_found"}})

    def do_POST(self) -> None:
        try:
            raw = self._read_body()
        except ValueError as exc:
            self._send_json(400, {"error": {"message": str(exc), "type": "invalid_request_error"}})
            self.close_connection = True
            return
        body = self._record(raw)
        route = self._route()
        if route is None or route[1] != "/responses":
            self._send_json(404, {"error": {"message": f"no such path: {self.path}", "type": "not_found"}})
            return
        if not isinstance(body, dict):
            error = {"message": "the body is not a JSON object", "type": "invalid_request_error"}
            self._send_json(400, {"error": error})
            return
        scenario = route[0]
        step_number = _step_of(body)
        step = _SCRIPTS[scenario](body, step_number, self.server.server_address[1])
        cache_key = body.get("prompt_cache_key")
        thread = cache_key if isinstance(cache_key, str) else None
        owner = self.server.owner
        owner._served_response(ServedResponse(scenario, step_number, step.http_status, step.usage, thread))
        if step.http_status != 200:
            error = {"message": FAIL_MESSAGE, "type": "server_error", "code": "server_error"}
            self._send_json(step.http_status, {"error": error})
            return
        response_id = f"resp_{scenario}_{step_number}_{owner._next_id()}"
        events: list[dict[str, Any]] = [{"type": "response.created", "response": {"id": response_id}}]
        if step.failed is not None:
            error = {"code": "server_error", "message": step.failed}
            events.append({"type": "response.failed", "response": {"id": response_id, "error": error}})
        else:
            events += step.events
            usage = step.usage.responses_api() if step.usage is not None else None
            events.append({"type": "response.completed", "response": {"id": response_id, "usage": usage}})
        self._send(200, "text/event-stream", _sse(events))


class ModelServer:
    """The scripted model server. Use as a context manager, or call `start()` and `stop()`.

    `base_url` is the provider `base_url` to configure (`http://127.0.0.1:<port>/v1`);
    `base_url_for(name)` selects another scenario by URL prefix. `requests` and `served` are
    snapshots, safe to read while the server runs.
    """

    def __init__(self, scenario: str = "write-file", *, host: str = "127.0.0.1", port: int = 0) -> None:
        if scenario not in _SCRIPTS:
            raise ValueError(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
        self.scenario = scenario
        self._host = host
        self._port = port
        self._lock = threading.Lock()
        self._requests: list[RecordedRequest] = []
        self._served: list[ServedResponse] = []
        self._ids = 0
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle

    def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("the model server is already running")
        server = _Server((self._host, self._port), _Handler)
        server.owner = self
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="wb-model-server", daemon=True)
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

    def __enter__(self) -> ModelServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    # -- addresses

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the model server is not running")
        return int(self._server.server_address[1])

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The provider base URL for the constructor's scenario."""
        return f"{self.origin}/v1"

    def base_url_for(self, scenario: str) -> str:
        """The provider base URL that plays `scenario` whatever the constructor said."""
        if scenario not in _SCRIPTS:
            raise ValueError(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
        return f"{self.origin}/{scenario}/v1"

    # -- what happened

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    @property
    def served(self) -> list[ServedResponse]:
        with self._lock:
            return list(self._served)

    def usage_reported(self, scenario: str | None = None, thread: str | None = None) -> TokenUsage:
        """The sum of the usage the scripted responses reported, optionally for one scenario or thread."""
        total = TokenUsage()
        for response in self.served:
            if scenario is not None and response.scenario != scenario:
                continue
            if thread is not None and response.thread != thread:
                continue
            if response.usage is not None:
                total += response.usage
        return total

    def pings(self) -> int:
        """How many `GET /ping` requests arrived (the `network` scenario's command sends one)."""
        return sum(1 for request in self.requests if request.method == "GET" and request.path == "/ping")

    def clear(self) -> None:
        with self._lock:
            self._requests.clear()
            self._served.clear()

    # -- called from handler threads

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(request)

    def _served_response(self, response: ServedResponse) -> None:
        with self._lock:
            self._served.append(response)

    def _next_id(self) -> int:
        with self._lock:
            self._ids += 1
            return self._ids
