"""A bundled stand-in for `claude` (Claude Code 2.1.328) that `wb demo` can use when the real CLI is not on PATH.

It accepts the argv wb builds (docs/harnesses.md: `-p --output-format stream-json --verbose --model M
[--effort E] --setting-sources "" --strict-mcp-config` and the permission flags), reads the task
on stdin, and holds a real, if tiny, conversation with `POST $ANTHROPIC_BASE_URL/v1/messages`
(streamed Server-Sent Events, `x-api-key: $ANTHROPIC_API_KEY`), offering a `Bash` and a
`Write` tool. It runs the commands the model asks for in its working directory (`/bin/bash -c`,
no sandbox: it only ever talks to the demo's scripted server), writes files inside it
(outside only with bypassPermissions), and prints the stream-json lines Claude Code prints:
`system/init`, one `assistant` line per content block (each with its message's `message_start`
usage, as Claude Code prints it), `user` tool results, one `result` with summed usage.
Exit codes: 0 success, 1 error result or flag error.

The session is kept as Claude Code keeps it, `$CLAUDE_CONFIG_DIR/projects/<cwd, each character
other than a letter or digit made '-'>/<session>.jsonl` (~/.claude without the variable), one
line per message; `--resume=<session>` (or `--resume <session>`, `-r`) continues it in the
same working directory: the same session ID, the earlier messages first in each request, the
new ones appended. A session not there exits 1 before any output, as Claude Code does.

Run as `python -m courier.demo.standin_claude …` (a demo installs a `claude` wrapper).
Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from typing import Any, NoReturn

from courier.demo.standin_sessions import append_records, read_records

VERSION = "2.1.328"
MAX_ROUNDS = 8
COMMAND_TIMEOUT_S = 30.0
REQUEST_TIMEOUT_S = 30.0
OUTPUT_MAX_CHARS = 16 * 1024
# List prices per million tokens (input, output, cache read, cache write), for a cost estimate as Claude Code makes.
PRICES = (3.0, 15.0, 0.3, 3.75)
_VALUE_FLAGS = frozenset({"--output-format", "--model", "--effort", "--setting-sources", "--permission-mode",
                          "--permission-prompts", "--max-turns", "--resume", "-r"})  # fmt: skip
_LIST_FLAGS = frozenset({"--allowedTools", "--allowed-tools", "--disallowedTools", "--mcp-config", "--tools"})
_BOOLEAN_FLAGS = frozenset({"-p", "--print", "--verbose", "--strict-mcp-config"})
TOOLS = [
    {
        "name": "Bash",
        "description": "Run a shell command in the working directory.",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
    {
        "name": "Write",
        "description": "Write a file (absolute path).",
        "input_schema": {
            "type": "object",
            "properties": {"file_path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["file_path", "content"],
        },
    },
]


def emit(event: dict[str, Any]) -> None:
    data = memoryview(json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode() + b"\n")
    while data:
        data = data[os.write(1, data) :]


def flag_error(message: str) -> NoReturn:
    sys.stderr.write(f"Error: {message}\n")
    sys.exit(1)


@dataclass
class Totals:
    input_tokens: int = 0
    cache_read: int = 0
    cache_write: int = 0
    output_tokens: int = 0

    def add(self, usage: dict[str, Any]) -> None:
        self.input_tokens += int(usage.get("input_tokens") or 0)
        self.cache_read += int(usage.get("cache_read_input_tokens") or 0)
        self.cache_write += int(usage.get("cache_creation_input_tokens") or 0)

    def cost(self) -> float:
        counts = (self.input_tokens, self.output_tokens, self.cache_read, self.cache_write)
        return round(sum(count * price for count, price in zip(counts, PRICES, strict=True)) / 1_000_000, 6)


@dataclass
class Session:
    model: str
    mode: str
    cwd: str = field(default_factory=os.getcwd)
    session_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    totals: Totals = field(default_factory=Totals)
    turns: int = 0
    denials: list[dict[str, Any]] = field(default_factory=list)
    earlier: list[dict[str, Any]] = field(default_factory=list)  # a resumed session's messages
    start_usage: dict[str, Any] | None = None  # the current message's `message_start` usage

    def message_usage(self) -> dict[str, Any] | None:
        """The usage an `assistant` line reports: its message's `message_start` usage (none if the stream had none)."""
        return self.start_usage

    def session_file(self) -> str:
        config = os.environ.get("CLAUDE_CONFIG_DIR") or os.path.join(os.path.expanduser("~"), ".claude")
        return os.path.join(config, "projects", re.sub(r"[^A-Za-z0-9]", "-", self.cwd), f"{self.session_id}.jsonl")

    def resume(self, session_id: str) -> None:
        """Continue the session `session_id` of this working directory, or exit 1 as Claude Code does."""
        self.session_id = session_id
        records = read_records(self.session_file()) if re.fullmatch(r"[0-9A-Za-z-]+", session_id) else None
        if records is None:
            sys.stderr.write(f"No conversation found with session ID: {session_id}\n")
            sys.exit(1)
        self.earlier = [r["message"] for r in records if r.get("type") in ("user", "assistant") and "message" in r]

    def keep(self, message: dict[str, Any]) -> None:
        append_records(self.session_file(), [{"type": message["role"], "message": message, **self.common(),
                                              "sessionId": self.session_id, "cwd": self.cwd}])  # fmt: skip

    def common(self) -> dict[str, Any]:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
        return {
            "parent_tool_use_id": None,
            "session_id": self.session_id,
            "uuid": str(uuid.uuid4()),
            "timestamp": stamp,
        }

    def result(self, *, is_error: bool, text: str, reason: str) -> None:
        emit({
            "type": "result", "subtype": "success", "is_error": is_error, "duration_ms": 0, "num_turns": self.turns,
            "result": text, "stop_reason": None if is_error else "end_turn", "session_id": self.session_id,
            "total_cost_usd": 0 if is_error else self.totals.cost(),
            "usage": {"input_tokens": self.totals.input_tokens, "cache_creation_input_tokens": self.totals.cache_write,
                      "cache_read_input_tokens": self.totals.cache_read, "output_tokens": self.totals.output_tokens,
                      "output_tokens_details": {"thinking_tokens": 0}},
            "permission_denials": self.denials, "terminal_reason": reason, "uuid": str(uuid.uuid4()),
        })  # fmt: skip

    def fail(self, text: str) -> NoReturn:
        message = {"id": str(uuid.uuid4()), "type": "message", "role": "assistant", "model": "<synthetic>",
                   "content": [{"type": "text", "text": text}]}  # fmt: skip
        emit(
            {"type": "assistant", "message": message, **self.common(), "error": "unknown", "is_api_error_message": True}
        )
        self.result(is_error=True, text=text, reason="api_error")
        sys.exit(1)

    # -- the model

    def ask(self, messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str, str]:
        """(content blocks, stop_reason, message id) of one streamed response."""
        base = os.environ.get("ANTHROPIC_BASE_URL", "https://api.anthropic.com").rstrip("/")
        body = {
            "model": self.model, "max_tokens": 4096, "stream": True, "tools": TOOLS, "messages": messages,
            "system": f"You are a coding agent.\nWorking directory: {self.cwd}",
        }  # fmt: skip
        request = urllib.request.Request(
            f"{base}/v1/messages",
            data=json.dumps(body).encode(),
            headers={
                "content-type": "application/json",
                "anthropic-version": "2023-06-01",
                "x-api-key": os.environ.get("ANTHROPIC_API_KEY", ""),
                "user-agent": f"wb-standin-claude/{VERSION}",
            },
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
                return self._read_stream(response)
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")
            with contextlib.suppress(ValueError, KeyError, TypeError):
                detail = json.loads(detail)["error"]["message"]
            self.fail(f"API Error: {exc.code} {detail}")
        except (urllib.error.URLError, OSError) as exc:
            self.fail(f"API Error: Connection error ({exc})")

    def _read_stream(self, response: Any) -> tuple[list[dict[str, Any]], str, str]:
        blocks: dict[int, dict[str, Any]] = {}
        partial: dict[int, str] = {}
        stop_reason, message_id = "end_turn", str(uuid.uuid4())
        self.start_usage = None
        for raw in response:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            kind = event.get("type")
            if kind == "message_start":
                message_id = event["message"].get("id", message_id)
                self.start_usage = event["message"].get("usage")
                self.totals.add(event["message"].get("usage") or {})
            elif kind == "content_block_start":
                blocks[event["index"]] = dict(event["content_block"])
            elif kind == "content_block_delta":
                delta = event["delta"]
                if delta.get("type") == "text_delta":
                    blocks[event["index"]]["text"] = blocks[event["index"]].get("text", "") + delta["text"]
                elif delta.get("type") == "input_json_delta":
                    partial[event["index"]] = partial.get(event["index"], "") + delta["partial_json"]
            elif kind == "message_delta":
                stop_reason = event.get("delta", {}).get("stop_reason") or stop_reason
                self.totals.output_tokens += int((event.get("usage") or {}).get("output_tokens") or 0)
        for index, text in partial.items():
            blocks[index]["input"] = json.loads(text or "{}")
        return [blocks[i] for i in sorted(blocks)], stop_reason, message_id

    # -- the tools

    def run_tool(self, block: dict[str, Any]) -> dict[str, Any]:
        name, tool_input, ident = block.get("name"), block.get("input") or {}, block.get("id")
        if name == "Bash":
            try:
                done = subprocess.run(
                    ["/bin/bash", "-c", str(tool_input.get("command", ""))], cwd=self.cwd, capture_output=True,
                    text=True, timeout=COMMAND_TIMEOUT_S, stdin=subprocess.DEVNULL,
                )  # fmt: skip
                output = (done.stdout + done.stderr)[:OUTPUT_MAX_CHARS].rstrip("\n")
                return self.tool_result(ident, output or "(Bash completed with no output)", done.returncode != 0)
            except subprocess.TimeoutExpired:
                return self.tool_result(ident, "Command timed out", True)
        if name == "Write":
            path = os.path.normpath(os.path.join(self.cwd, str(tool_input.get("file_path", ""))))
            if not (self.mode == "bypassPermissions" or path.startswith(self.cwd + os.sep)):
                text = f"Claude requested permissions to write to {path}, but you haven't granted it yet."
                emit({"type": "system", "subtype": "permission_denied", "tool_name": "Write", "tool_use_id": ident,
                      "message": text, "uuid": str(uuid.uuid4()), "session_id": self.session_id})  # fmt: skip
                self.denials.append({"tool_name": "Write", "tool_use_id": ident, "tool_input": tool_input})
                return self.tool_result(ident, text, True)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(str(tool_input.get("content", "")))
            return self.tool_result(ident, f"File created successfully at: {path}", False)
        return self.tool_result(ident, f"No such tool available: {name}", True)

    def tool_result(self, ident: Any, content: str, is_error: bool) -> dict[str, Any]:
        block = {"tool_use_id": ident, "type": "tool_result", "content": content, "is_error": is_error}
        emit({"type": "user", "message": {"role": "user", "content": [block]}, **self.common()})
        return block

    # -- the turn

    def run(self, task: str) -> NoReturn:
        emit({
            "type": "system", "subtype": "init", "cwd": self.cwd, "session_id": self.session_id,
            "tools": [tool["name"] for tool in TOOLS], "mcp_servers": [], "model": self.model,
            "permissionMode": self.mode, "apiKeySource": "ANTHROPIC_API_KEY", "claude_code_version": VERSION,
            "uuid": str(uuid.uuid4()),
        })  # fmt: skip
        messages: list[dict[str, Any]] = [*self.earlier, {"role": "user", "content": task}]
        self.keep(messages[-1])
        final = ""
        for _ in range(MAX_ROUNDS):
            blocks, stop_reason, message_id = self.ask(messages)
            self.turns += 1
            for block in blocks:
                message: dict[str, Any] = {"id": message_id, "type": "message", "role": "assistant",
                                           "model": self.model, "content": [block], "stop_reason": None}  # fmt: skip
                usage = self.message_usage()
                if usage is not None:
                    message["usage"] = usage
                emit({"type": "assistant", "message": message, **self.common()})
            messages.append({"role": "assistant", "content": blocks})
            self.keep(messages[-1])
            final = "".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text") or final
            uses = [block for block in blocks if block.get("type") == "tool_use"]
            if stop_reason != "tool_use" or not uses:
                self.result(is_error=False, text=final, reason="completed")
                sys.exit(0)
            messages.append({"role": "user", "content": [self.run_tool(block) for block in uses]})
            self.keep(messages[-1])
        emit({"type": "result", "subtype": "error_max_turns", "is_error": True, "num_turns": self.turns,
              "session_id": self.session_id, "errors": [f"Reached maximum number of turns ({MAX_ROUNDS})"],
              "terminal_reason": "max_turns", "uuid": str(uuid.uuid4())})  # fmt: skip
        sys.exit(1)


def main(argv: list[str] | None = None) -> NoReturn:
    args = list(sys.argv[1:] if argv is None else argv)
    if args in (["--version"], ["-v"]):
        print(f"{VERSION} (Claude Code; wb demo stand-in)")
        sys.exit(0)
    options: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg.startswith("--") and "=" in arg and arg.split("=", 1)[0] in _VALUE_FLAGS:
            name, value = arg.split("=", 1)  # `--resume=<id>`, as the official SDK passes it
            options[name] = value
        elif arg in _BOOLEAN_FLAGS:
            options[arg] = True
        elif arg in _VALUE_FLAGS:
            if i >= len(args):
                flag_error(f"option '{arg} <value>' argument missing")
            options[arg], i = args[i], i + 1
        elif arg in _LIST_FLAGS:
            while i < len(args) and not args[i].startswith("-"):
                i += 1
        else:
            flag_error(f"unknown option '{arg}' (the stand-in reads the prompt from stdin only)")
    if options.get("--output-format") == "stream-json" and not options.get("--verbose"):
        flag_error("When using --print, --output-format=stream-json requires --verbose")
    mode = str(options.get("--permission-mode") or "default")
    if mode == "bypassPermissions" and os.geteuid() == 0:
        sys.stderr.write(
            "--dangerously-skip-permissions cannot be used with root/sudo privileges for security reasons\n"
        )
        sys.exit(1)
    task = sys.stdin.read()
    if not task.strip():
        flag_error("Input must be provided either through stdin or as a prompt argument when using --print")
    session = Session(model=str(options.get("--model") or "claude-sonnet-4-5"), mode=mode)
    resume = options.get("--resume") or options.get("-r")
    if resume:
        session.resume(str(resume))
    session.run(task)


if __name__ == "__main__":
    main()
