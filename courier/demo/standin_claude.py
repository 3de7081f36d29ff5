"""The bundled stand-in for `claude` that `wb demo --harness claude` uses when Claude Code is not on PATH.

It accepts the argv wb builds for Claude Code (contract §14: `-p --output-format stream-json
--verbose --model MODEL` plus permission and settings flags), reads the task on stdin, and holds
a real, if tiny, conversation with the Anthropic Messages API at ANTHROPIC_BASE_URL
(`POST {base}/v1/messages`, streamed, the key from ANTHROPIC_API_KEY in `x-api-key`),
offering `Bash` and `Write`. It runs the commands the model asks for in the working directory
(no sandbox: it only ever talks to the demo's scripted server), writes files inside it, and
prints the stream-json lines Claude Code 2.1.328 prints: `system/init`, one `assistant` line
per content block, `user` tool results, and a final `result` with `usage` and
`total_cost_usd` (estimated from list prices, as Claude Code estimates it client-side). An
HTTP error ends with an `is_error` result and exit 1.

Run as `python -m courier.demo.standin_claude …` (the demo installs a `claude` wrapper).
Standard library only.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from typing import Any, NoReturn

MAX_TURNS = 8
COMMAND_TIMEOUT_S = 30.0
REQUEST_TIMEOUT_S = 30.0
OUTPUT_MAX_CHARS = 16 * 1024
# USD per million tokens (Claude Sonnet list prices): input, cache write, cache read, output.
PRICES = (3.0, 3.75, 0.30, 15.0)
_VALUE_FLAGS = ("--output-format", "--model", "--effort", "--setting-sources", "--permission-mode",
                "--allowedTools", "--permission-prompts", "--mcp-config", "--max-turns")  # fmt: skip
_TOOLS = [
    {
        "name": "Bash",
        "description": "Runs a shell command in the working directory.",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
    {
        "name": "Write",
        "description": "Writes a file.",
        "input_schema": {
            "type": "object",
            "properties": {"file_path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["file_path", "content"],
        },
    },
]


def emit(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event, separators=(",", ":"), ensure_ascii=False) + "\n")
    sys.stdout.flush()


def fatal(message: str) -> NoReturn:
    sys.stderr.write(f"Error: {message}\n")
    sys.exit(1)


def parse_args(argv: list[str]) -> dict[str, str]:
    options: dict[str, str] = {}
    args = iter(argv)
    for arg in args:
        if arg in _VALUE_FLAGS:
            options[arg] = next(args, "")
        elif arg in ("-p", "--print", "--verbose", "--strict-mcp-config"):
            options[arg] = "1"
        else:
            fatal(f"unknown option '{arg}'")
    if options.get("--output-format") != "stream-json":
        fatal("the stand-in only implements --output-format stream-json")
    if "--verbose" not in options:
        fatal("When using --print, --output-format=stream-json requires --verbose")
    return options


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class Session:
    def __init__(self, model: str, task: str) -> None:
        self.model = model
        self.task = task
        self.cwd = os.getcwd()
        self.session_id = str(uuid.uuid4())
        self.usage = {"input_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                      "output_tokens": 0}  # fmt: skip
        self.turns = 0
        self.started = time.monotonic()

    def line(self, kind: str, **fields: Any) -> None:
        emit({"type": kind, **fields, "session_id": self.session_id, "uuid": str(uuid.uuid4()), "timestamp": now()})

    def cost(self) -> float:
        u = self.usage
        tokens = (u["input_tokens"], u["cache_creation_input_tokens"], u["cache_read_input_tokens"], u["output_tokens"])
        return round(sum(t * p for t, p in zip(tokens, PRICES, strict=True)) / 1_000_000, 6)

    def result(self, text: str, *, error: bool = False, status: int | None = None) -> NoReturn:
        emit({
            "type": "result", "subtype": "success", "is_error": error,
            "duration_ms": int((time.monotonic() - self.started) * 1000), "num_turns": self.turns,
            "result": text, "stop_reason": None if error else "end_turn", "session_id": self.session_id,
            "total_cost_usd": self.cost(), "usage": dict(self.usage), "permission_denials": [],
            "terminal_reason": "api_error" if error else "completed", "api_error_status": status,
            "uuid": str(uuid.uuid4()),
        })  # fmt: skip
        sys.exit(1 if error else 0)

    def run(self) -> NoReturn:
        base = os.environ.get("ANTHROPIC_BASE_URL", "").rstrip("/")
        key = os.environ.get("ANTHROPIC_API_KEY", "")
        if not base or not key:
            fatal("the stand-in needs ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY (it only talks to the demo's server)")
        emit(
            {
                "type": "system",
                "subtype": "init",
                "cwd": self.cwd,
                "session_id": self.session_id,
                "tools": ["Bash", "Write"],
                "mcp_servers": [],
                "model": self.model,
                "permissionMode": "acceptEdits",
                "apiKeySource": "ANTHROPIC_API_KEY",
                "claude_code_version": "stand-in",
                "uuid": str(uuid.uuid4()),
            }
        )
        system = f"You are a coding agent.\nWorking directory: {self.cwd}\n"
        messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": self.task}]}]
        text = ""
        for _ in range(MAX_TURNS):
            self.turns += 1
            message = self.respond(f"{base}/v1/messages", key, system, messages)
            blocks = message["content"]
            messages.append({"role": "assistant", "content": blocks})
            for block in blocks:
                self.line("assistant", message={**message, "content": [block]}, parent_tool_use_id=None)
            calls = [b for b in blocks if b.get("type") == "tool_use"]
            texts = [str(b.get("text", "")) for b in blocks if b.get("type") == "text"]
            text = "".join(texts) or text
            if not calls:
                self.result(text)
            results = [self.call(c) for c in calls]
            messages.append({"role": "user", "content": results})
        self.result(f"Reached maximum number of turns ({MAX_TURNS})", error=True)

    def respond(self, url: str, key: str, system: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """One streamed message, rebuilt from its SSE events; usage added to the run's total."""
        body = {"model": self.model, "max_tokens": 4096, "system": system, "messages": messages, "tools": _TOOLS,
                "stream": True}  # fmt: skip
        headers = {"content-type": "application/json", "x-api-key": key, "anthropic-version": "2023-06-01"}
        request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
        message: dict[str, Any] = {}
        blocks: dict[int, dict[str, Any]] = {}
        partial: dict[int, str] = {}
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as reply:
                for raw in reply:
                    line = raw.decode("utf-8", "replace").strip()
                    if not line.startswith("data:"):
                        continue
                    event = json.loads(line[5:].strip())
                    kind = event.get("type")
                    if kind == "message_start":
                        message = dict(event["message"])
                        for name in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"):
                            self.usage[name] += int(message.get("usage", {}).get(name) or 0)
                    elif kind == "content_block_start":
                        blocks[event["index"]] = dict(event["content_block"])
                        partial[event["index"]] = ""
                    elif kind == "content_block_delta":
                        delta = event["delta"]
                        if delta.get("type") == "text_delta":
                            blocks[event["index"]]["text"] = blocks[event["index"]].get("text", "") + delta["text"]
                        elif delta.get("type") == "input_json_delta":
                            partial[event["index"]] += delta.get("partial_json", "")
                    elif kind == "message_delta":
                        self.usage["output_tokens"] += int(event.get("usage", {}).get("output_tokens") or 0)
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")
            self.result(f"API Error: {exc.code} {detail}", error=True, status=exc.code)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            self.result(f"API Error: {exc}", error=True)
        for index, block in blocks.items():
            if block.get("type") == "tool_use":
                block["input"] = json.loads(partial[index] or "{}")
        message["content"] = [blocks[i] for i in sorted(blocks)]
        return message

    def call(self, block: dict[str, Any]) -> dict[str, Any]:
        name, args = block.get("name"), block.get("input") if isinstance(block.get("input"), dict) else {}
        assert isinstance(args, dict)
        error = False
        if name == "Bash" and isinstance(args.get("command"), str):
            output = self.shell(args["command"])
            extra: Any = {"stdout": output, "stderr": "", "interrupted": False, "isImage": False}
        elif name == "Write" and isinstance(args.get("file_path"), str):
            output, error = self.write(args["file_path"], str(args.get("content", "")))
            extra = (
                output if error else {"type": "create", "filePath": args["file_path"], "content": args.get("content")}
            )
        else:
            output, error, extra = f"No such tool available: {name}", True, f"Error: No such tool available: {name}"
        result = {"tool_use_id": block.get("id"), "type": "tool_result", "content": output, "is_error": error}
        self.line("user", message={"role": "user", "content": [result]}, parent_tool_use_id=None,
                  tool_use_result=extra)  # fmt: skip
        return result

    def shell(self, command: str) -> str:
        try:
            done = subprocess.run(
                ["bash", "-c", command],
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=COMMAND_TIMEOUT_S,
            )
            return done.stdout.decode("utf-8", "replace")[:OUTPUT_MAX_CHARS].rstrip("\n")
        except (OSError, subprocess.TimeoutExpired) as exc:
            return str(exc)

    def write(self, name: str, content: str) -> tuple[str, bool]:
        path = os.path.normpath(os.path.join(self.cwd, name))
        if not path.startswith(self.cwd + os.sep):
            return f"Claude requested permissions to write to {path}, but you haven't granted it yet.", True
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(content)
        return f"File created successfully at: {path}", False


def main(argv: list[str] | None = None) -> None:
    options = parse_args(sys.argv[1:] if argv is None else argv)
    task = "" if sys.stdin.isatty() else sys.stdin.buffer.read().decode("utf-8", "replace")
    if not task.strip():
        fatal("Input must be provided either through stdin or as a prompt argument when using --print")
    Session(options.get("--model") or "claude-sonnet-4-5", task).run()


if __name__ == "__main__":
    main()
