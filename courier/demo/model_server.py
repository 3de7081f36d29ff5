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
* ``endless``: runs ``true`` at every step, never finishing; each response reports 400 tokens
  (300 in, 100 out), so a budget is what ends it.
* ``endless-unmetered``: as ``endless``, but no response carries usage (a provider whose stream
  reports none, docs/cli.md#budgets).
* ``network``: tries to fetch ``http://127.0.0.1:<this server's port>/ping`` from a command
  (bash's ``/dev/tcp``, so no curl is needed), then reports back. A ``GET /ping`` that arrives is
  recorded in `requests` like any other request, so a caller can tell whether it got through.

The default scenario is the constructor's; a URL prefix selects another one per request:
``base_url_for("fail")`` is ``http://127.0.0.1:<port>/fail/v1``. Only the standard library is used,
so the module can back a `wb demo` command as well as the test suite.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from courier.demo.scripted_http import FieldSum, RecordedRequest, ScriptedHandler, ScriptedServer, sse, sum_usage

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

SCENARIOS: Final = (
    "write-file", "fail", "http-500", "commit", "network", "supervise", "endless", "endless-unmetered", "probe"
)  # fmt: skip
ENDLESS_COMMAND: Final = "true"
# Each response of the `endless` scenario reports 300 + 100 = 400 tokens (a budget's arithmetic).
ENDLESS_USAGE: Final = 400

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
PROBE_MESSAGE: Final = "I probed the sandbox."
# What the `probe` scenarios of every scripted server ask the worker to look for (docs/security.md#confined-runs).
PROBE_CANARY_PATH: Final = ".ssh/id_canary"
PING_BODY: Final = b"pong\n"
LIMIT_MESSAGE: Final = "Rate limit reached (wb scripted usage limit); try again in 3s."

_TOOL_OUTPUT_TYPES: Final = frozenset({"function_call_output", "custom_tool_call_output"})


@dataclass(frozen=True)
class TokenUsage(FieldSum):
    """Token counts one response reports, named as Codex names them in `turn.completed.usage`.

    `cached_input_tokens` is part of `input_tokens` and `reasoning_output_tokens` part of
    `output_tokens`, as in the Responses API's `*_tokens_details`.
    """

    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0
    reasoning_output_tokens: int = 0

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


def _endless(body: Mapping[str, Any], step: int, port: int) -> _Step:
    return _Step([_shell_call(body, f"call_true_{step}", ENDLESS_COMMAND)], TokenUsage(300, 0, 100, 0))


def _endless_unmetered(body: Mapping[str, Any], step: int, port: int) -> _Step:
    return _Step([_shell_call(body, f"call_true_{step}", ENDLESS_COMMAND)])


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


# The script a test commits to the repository as `probe.sh` before a `probe` run: each attempt prints one
# `PROBE-1 <what>: ` line. A script, so every CLI runs one plain command (the Gemini CLI's policy refuses
# subshells and redirections it cannot parse).
PROBE_SCRIPT: Final = f"""#!/bin/bash
say() {{ printf 'PROBE-%d %s: ' 1 "$1"; }}
say canary; cat "$HOME/{PROBE_CANARY_PATH}" 2>&1; echo
say plant; (echo x > "$HOME/planted") 2>&1 && echo written; echo
say loopback; (exec 3<>/dev/tcp/127.0.0.1/$1) 2>/dev/null && echo REACHED || echo UNREACHABLE
say processes; ls /proc | grep -c '^[0-9]'
say environ; tr '\\0' ' ' < /proc/self/environ; echo
echo x > probed.txt && say worktree && echo written
"""


def probe_command(port: int) -> str:
    """The `probe` scenario's command: run the committed probe.sh against this server's own port."""
    return f"bash probe.sh {port}"


def _probe(body: Mapping[str, Any], step: int, port: int) -> _Step:
    if step == 0:
        return _Step([_shell_call(body, "call_probe", probe_command(port))], ONE_COMMAND_USAGE[0])
    return _Step([_message("msg_1", PROBE_MESSAGE)], ONE_COMMAND_USAGE[1])


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
    "probe": _probe,
    "supervise": _supervise,
    "endless": _endless,
    "endless-unmetered": _endless_unmetered,
}


def _step_of(body: Mapping[str, Any]) -> int:
    items = body.get("input")
    if not isinstance(items, list):
        return 0
    return sum(1 for item in items if isinstance(item, dict) and item.get("type") in _TOOL_OUTPUT_TYPES)


# --------------------------------------------------------------------------- HTTP


def _not_found(request: ScriptedHandler) -> None:
    request.send_json(404, {"error": {"message": f"no such path: {request.path}", "type": "not_found"}})


class ModelServer(ScriptedServer[ServedResponse]):
    """The scripted Responses API server. Use as a context manager, or call `start()` and `stop()`.

    `base_url` is the provider `base_url` to configure (`http://127.0.0.1:<port>/v1`);
    `base_url_for(name)` selects another scenario by URL prefix. `requests` and `served` are
    snapshots, safe to read while the server runs.
    """

    scenarios = SCENARIOS
    api_root = "/v1"

    def usage_reported(self, scenario: str | None = None, thread: str | None = None) -> TokenUsage:
        """The sum of the usage the scripted responses reported, optionally for one scenario or thread."""
        return sum_usage(
            TokenUsage(),
            (r.usage for r in self.served if scenario in (None, r.scenario) and thread in (None, r.thread)),
        )

    def pings(self) -> int:
        """How many `GET /ping` requests arrived (the `network` scenario's command sends one)."""
        return sum(1 for request in self.requests if request.method == "GET" and request.path == "/ping")

    def refuse_body(self, request: ScriptedHandler, message: str) -> None:
        request.send_json(400, {"error": {"message": message, "type": "invalid_request_error"}})

    def handle(self, request: ScriptedHandler, body: Any) -> None:
        route = request.api_path()
        if request.command == "GET":
            if request.path.split("?", 1)[0] == "/ping":
                request.send(200, "text/plain", PING_BODY)
            elif route is not None and route[1] == "/models":
                request.send_json(200, {"object": "list", "data": [], "models": []})
            else:
                _not_found(request)
            return
        if route is None or route[1] != "/responses":
            _not_found(request)
            return
        if not isinstance(body, dict):
            error = {"message": "the body is not a JSON object", "type": "invalid_request_error"}
            request.send_json(400, {"error": error})
            return
        scenario = route[0]
        step_number = _step_of(body)
        retry_after = self.take_limit(step_number)
        if retry_after is not None:
            error = {"message": LIMIT_MESSAGE, "type": "rate_limit_exceeded", "code": "rate_limit_exceeded"}
            request.send_json(429, {"error": error}, {"retry-after": retry_after})
            return
        step = _SCRIPTS[scenario](body, step_number, int(request.server.server_address[1]))
        cache_key = body.get("prompt_cache_key")
        thread = cache_key if isinstance(cache_key, str) else None
        self._serve(ServedResponse(scenario, step_number, step.http_status, step.usage, thread))
        if step.http_status != 200:
            error = {"message": FAIL_MESSAGE, "type": "server_error", "code": "server_error"}
            request.send_json(step.http_status, {"error": error})
            return
        response_id = f"resp_{scenario}_{step_number}_{self._next_id()}"
        events: list[dict[str, Any]] = [{"type": "response.created", "response": {"id": response_id}}]
        if step.failed is not None:
            error = {"code": "server_error", "message": step.failed}
            events.append({"type": "response.failed", "response": {"id": response_id, "error": error}})
        else:
            events += step.events
            usage = step.usage.responses_api() if step.usage is not None else None
            events.append({"type": "response.completed", "response": {"id": response_id, "usage": usage}})
        request.send(200, "text/event-stream", sse(events))
