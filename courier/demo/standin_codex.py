"""The bundled stand-in for `codex` that `wb demo` uses when the real Codex CLI is not on PATH.

It accepts the argv wb builds for `codex exec` (docs/codex-notes.md#the-argv: `exec --json … -C DIR … -m MODEL
-c key=value … -o FILE [resume THREAD] -`), reads the task on stdin, and holds a real,
if tiny, conversation with the provider the `-c` overrides name: `POST <base_url>/responses`
(streamed Server-Sent Events, bearer credential from the provider's `env_key` variable),
offering a `shell_command` function and a custom `apply_patch` tool. It runs the commands
the model asks for in the -C directory (`/bin/bash -lc …`, no sandbox: it only ever talks
to the demo's scripted model server), applies `*** Add File` patches there, and prints the
same JSONL event stream Codex 0.169.0 prints (compact JSON, `item_N` ids, cumulative usage
on `turn.completed`). `-o FILE` is written only when the turn completed. Exit codes: 0
completed, 1 failed turn or startup error, 2 usage.

Without `--ephemeral` the thread is kept as Codex keeps it, a rollout
`$CODEX_HOME/sessions/YYYY/MM/DD/rollout-<time>-<thread>.jsonl` (CODEX_HOME defaults to
~/.codex), and `resume <thread>` continues it as `codex exec resume` does: `thread.started`
repeats the thread ID, the earlier turns go first in each request's `input`, the usage stays
thread-cumulative and the new turn is appended to the same rollout. A thread with no rollout
there exits 1 before any event.

Run as `python -m courier.demo.standin_codex exec …` (the demo installs a `codex` wrapper).
Standard library only.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from typing import Any, NoReturn

from courier.demo.standin_sessions import append_records, find_session_file, read_records

MAX_ROUNDS = 8
COMMAND_TIMEOUT_S = 30.0
REQUEST_TIMEOUT_S = 30.0
OUTPUT_MAX_CHARS = 16 * 1024
_VALUE_FLAGS = {"-C": "cd", "--cd": "cd", "-m": "model", "--model": "model", "-s": "sandbox",
                "--sandbox": "sandbox", "-c": "config", "--config": "config", "-o": "output",
                "--output-last-message": "output"}  # fmt: skip
_SHELL_TOOL = {
    "type": "function",
    "name": "shell_command",
    "description": "Runs a shell command in the workspace and returns its output.",
    "strict": False,
    "parameters": {
        "type": "object",
        "properties": {"command": {"type": "string", "description": "The command to run."}},
        "required": ["command"],
        "additionalProperties": False,
    },
}
_PATCH_TOOL = {"type": "custom", "name": "apply_patch", "description": "Adds files with a patch."}


def emit(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event, separators=(",", ":"), ensure_ascii=False) + "\n")
    sys.stdout.flush()


def usage_error(message: str) -> NoReturn:
    sys.stderr.write(f"error: {message}\n\nUsage: codex exec [OPTIONS] [PROMPT]\n")
    sys.exit(2)


def startup_error(message: str) -> NoReturn:
    sys.stderr.write(message + "\n")
    sys.exit(1)


@dataclass
class Options:
    cd: str | None = None
    model: str = "gpt-5.5"
    output: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    resume: str | None = None  # `resume THREAD`: the thread to continue
    ephemeral: bool = False


def parse_args(argv: list[str]) -> Options:
    if not argv or argv[0] not in ("exec", "e"):
        usage_error("the stand-in only implements `codex exec`")
    options = Options()
    args = iter(argv[1:])
    for arg in args:
        name, inline = arg.split("=", 1) if arg.startswith("--") and "=" in arg else (arg, None)
        if name in _VALUE_FLAGS:
            value = inline if inline is not None else next(args, None)
            if value is None:
                usage_error(f"a value is required for '{name} <VALUE>' but none was supplied")
            key = _VALUE_FLAGS[name]
            if key == "config":
                apply_override(options.config, value)
            elif key == "cd":
                options.cd = value
            elif key == "model":
                options.model = value
            elif key == "output":
                options.output = value
        elif arg == "resume" and options.resume is None:
            # `codex exec [OPTIONS] resume <SESSION_ID> [PROMPT]`: the exec options may come on either side.
            session = next(args, None)
            if session is None or session.startswith("-"):
                usage_error("the stand-in resumes a thread by its ID: `resume <SESSION_ID> -`")
            options.resume = session
        elif arg == "--ephemeral":
            options.ephemeral = True
        elif arg == "-" or arg.startswith("--"):
            continue  # `-` (prompt on stdin) and boolean flags (--json, …)
        else:
            usage_error(f"unexpected argument '{arg}' found (the stand-in reads the prompt from stdin)")
    return options


def apply_override(config: dict[str, Any], override: str) -> None:
    if "=" not in override:
        startup_error(f"Error: Invalid override (missing '='): {override}")
    key, text = override.split("=", 1)
    try:
        value: Any = tomllib.loads(f"_x_ = {text}")["_x_"]
    except tomllib.TOMLDecodeError:
        value = text.strip().strip("\"'")
    table = config
    parts = key.strip().split(".")
    for part in parts[:-1]:
        table = table.setdefault(part, {})
        if not isinstance(table, dict):
            startup_error(f"Error loading config.toml: invalid override {key}")
    table[parts[-1]] = value


class Rollout:
    """The thread's rollout file in CODEX_HOME: its earlier conversation items and usage, and what this turn adds."""

    def __init__(self, options: Options) -> None:
        home = os.environ.get("CODEX_HOME") or os.path.join(os.path.expanduser("~"), ".codex")
        self.sessions = os.path.join(home, "sessions")
        self.keep = not options.ephemeral
        self.items: list[dict[str, Any]] = []
        self.usage: dict[str, int] = {}
        if options.resume is None:
            self.thread_id = str(uuid.uuid4())
            stamp = time.gmtime()
            day = time.strftime("%Y/%m/%d", stamp)
            name = f"rollout-{time.strftime('%Y-%m-%dT%H-%M-%S', stamp)}-{self.thread_id}.jsonl"
            self.path = os.path.join(self.sessions, day, name)
            self.add({"type": "session_meta", "payload": {"id": self.thread_id, "cwd": os.getcwd()}})
            return
        self.thread_id = options.resume
        found = find_session_file(self.sessions, f"-{options.resume}.jsonl")
        records = read_records(found) if found is not None else None
        if found is None or records is None:
            startup_error(f"Error: thread/resume failed: no rollout found for thread id {options.resume}")
        self.path = found
        for record in records:
            payload = record.get("payload")
            if not isinstance(payload, dict):
                continue
            if record.get("type") == "response_item":
                self.items.append(payload)
            elif record.get("type") == "event_msg" and payload.get("type") == "token_count":
                total = payload.get("total_token_usage")
                if isinstance(total, dict):
                    self.usage = {key: int(value) for key, value in total.items() if isinstance(value, int)}

    def add(self, *records: dict[str, Any]) -> None:
        if self.keep:
            append_records(self.path, records)

    def add_items(self, items: list[dict[str, Any]], usage: dict[str, int]) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        records = [{"timestamp": stamp, "type": "response_item", "payload": item} for item in items]
        self.add(*records, {"timestamp": stamp, "type": "event_msg",
                            "payload": {"type": "token_count", "total_token_usage": dict(usage)}})  # fmt: skip


class Turn:
    """One `codex exec` turn: the conversation with the model and the events it prints."""

    def __init__(self, options: Options, task: str, rollout: Rollout) -> None:
        self.options = options
        self.task = task
        self.cwd = os.getcwd()
        self.items = 0
        self.usage = {"input_tokens": 0, "cached_input_tokens": 0, "output_tokens": 0, "reasoning_output_tokens": 0}
        for key in self.usage:
            self.usage[key] += rollout.usage.get(key, 0)  # thread-cumulative, as Codex reports it
        self.rollout = rollout
        self.thread_id = rollout.thread_id
        provider_id = options.config.get("model_provider")
        providers = options.config.get("model_providers")
        provider = providers.get(provider_id) if isinstance(providers, dict) else None
        self.provider: dict[str, Any] = provider if isinstance(provider, dict) else {}

    def item_id(self) -> str:
        ident = f"item_{self.items}"
        self.items += 1
        return ident

    def fail(self, message: str) -> NoReturn:
        emit({"type": "error", "message": message})
        emit({"type": "turn.failed", "error": {"message": message}})
        sys.exit(1)

    def run(self) -> NoReturn:
        emit({"type": "thread.started", "thread_id": self.thread_id})
        emit({"type": "turn.started"})
        base_url = self.provider.get("base_url")
        env_key = self.provider.get("env_key")
        if not isinstance(base_url, str) or not base_url:
            self.fail("the stand-in needs a model provider with a base_url (-c model_providers.<id>.base_url=…)")
        credential = os.environ.get(env_key, "") if isinstance(env_key, str) else ""
        if isinstance(env_key, str) and not credential:
            self.fail(f"Missing environment variable: `{env_key}`.")
        prompt = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": self.task}]}
        conversation: list[dict[str, Any]] = [*self.rollout.items, prompt]  # a resumed thread's turns first
        self.rollout.add_items([prompt], self.usage)
        final = ""
        for _ in range(MAX_ROUNDS):
            outputs = self.respond(base_url.rstrip("/") + "/responses", credential, conversation)
            calls = 0
            added: list[dict[str, Any]] = []
            for item in outputs:
                kind = item.get("type")
                if kind == "reasoning":
                    self.reasoning(item)
                elif kind == "message":
                    final = self.message(item) or final
                    added.append(item)
                elif kind == "function_call":
                    added += [item, self.function_call(item)]
                    calls += 1
                elif kind == "custom_tool_call":
                    added += [item, self.custom_call(item)]
                    calls += 1
            conversation += added
            self.rollout.add_items(added, self.usage)
            if not calls:
                break
        else:
            self.fail(f"the model was still calling tools after {MAX_ROUNDS} rounds")
        usage = {**self.usage, "cache_write_input_tokens": 0}
        emit({"type": "turn.completed", "usage": usage})
        if self.options.output:
            with open(self.options.output, "w", encoding="utf-8") as handle:
                handle.write(final)
        sys.exit(0)

    # -- the model

    def respond(self, url: str, credential: str, conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """One streamed response: its output items; usage added to the running total."""
        body: dict[str, Any] = {
            "model": self.options.model,
            "instructions": "You are a coding agent working in a git worktree.",
            "input": conversation,
            "tools": [_SHELL_TOOL, _PATCH_TOOL],
            "tool_choice": "auto",
            "parallel_tool_calls": False,
            "stream": True,
            "store": False,
            "prompt_cache_key": self.thread_id,
        }
        effort = self.options.config.get("model_reasoning_effort")
        if isinstance(effort, str):
            body["reasoning"] = {"effort": effort}
        headers = {"content-type": "application/json", "accept": "text/event-stream"}
        if credential:
            headers["authorization"] = f"Bearer {credential}"
        request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
        items: list[dict[str, Any]] = []
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as reply:
                for raw in reply:
                    line = raw.decode("utf-8", "replace").rstrip("\r\n")
                    if not line.startswith("data:"):
                        continue
                    event = json.loads(line[5:].strip())
                    kind = event.get("type") if isinstance(event, dict) else None
                    if kind == "response.output_item.done" and isinstance(event.get("item"), dict):
                        items.append(event["item"])
                    elif kind == "response.completed":
                        self.add_usage(event.get("response", {}).get("usage"))
                        return items
                    elif kind == "response.failed":
                        error = event.get("response", {}).get("error") or {}
                        self.fail(f"stream disconnected before completion: {error.get('message', 'response failed')}")
        except urllib.error.HTTPError as exc:
            self.fail(f"unexpected status {exc.code} {exc.reason}, url: {url}")
        except (urllib.error.URLError, OSError, ValueError) as exc:
            self.fail(f"stream disconnected before completion: {exc}")
        self.fail("stream closed before response.completed")

    def add_usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        details_in = usage.get("input_tokens_details") or {}
        details_out = usage.get("output_tokens_details") or {}
        self.usage["input_tokens"] += int(usage.get("input_tokens") or 0)
        self.usage["cached_input_tokens"] += int(details_in.get("cached_tokens") or 0)
        self.usage["output_tokens"] += int(usage.get("output_tokens") or 0)
        self.usage["reasoning_output_tokens"] += int(details_out.get("reasoning_tokens") or 0)

    # -- items

    def reasoning(self, item: dict[str, Any]) -> None:
        parts = item.get("summary") or []
        text = "\n".join(str(part.get("text", "")) for part in parts if isinstance(part, dict))
        if text:
            emit({"type": "item.completed", "item": {"id": self.item_id(), "type": "reasoning", "text": text}})

    def message(self, item: dict[str, Any]) -> str:
        parts = item.get("content") or []
        text = "".join(str(part.get("text", "")) for part in parts if isinstance(part, dict))
        emit({"type": "item.completed", "item": {"id": self.item_id(), "type": "agent_message", "text": text}})
        return text

    def function_call(self, item: dict[str, Any]) -> dict[str, Any]:
        call_id = item.get("call_id")
        try:
            arguments = json.loads(item.get("arguments") or "{}")
        except ValueError:
            arguments = {}
        command = arguments.get("command") if isinstance(arguments, dict) else None
        if isinstance(command, list):
            command = shlex.join(str(part) for part in command)
        if item.get("name") not in ("shell_command", "shell", "exec_command") or not isinstance(command, str):
            return {"type": "function_call_output", "call_id": call_id, "output": "unsupported tool call"}
        output, code = self.shell(command)
        return {"type": "function_call_output", "call_id": call_id, "output": f"Exit code: {code}\nOutput:\n{output}"}

    def shell(self, command: str) -> tuple[str, int]:
        argv = ["/bin/bash", "-lc", command]
        ident = self.item_id()
        item: dict[str, Any] = {
            "id": ident, "type": "command_execution", "command": shlex.join(argv),
            "aggregated_output": "", "exit_code": None, "status": "in_progress",
        }  # fmt: skip
        emit({"type": "item.started", "item": item})
        try:
            done = subprocess.run(
                argv,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=COMMAND_TIMEOUT_S,
            )
            output, code = done.stdout.decode("utf-8", "replace")[:OUTPUT_MAX_CHARS], done.returncode
        except (OSError, subprocess.TimeoutExpired) as exc:
            output, code = f"{exc}\n", 1
        status = "completed" if code == 0 else "failed"
        emit({"type": "item.completed", "item": dict(item, aggregated_output=output, exit_code=code, status=status)})
        return output, code

    def custom_call(self, item: dict[str, Any]) -> dict[str, Any]:
        call_id = item.get("call_id")
        patch = item.get("input")
        if item.get("name") != "apply_patch" or not isinstance(patch, str):
            return {"type": "custom_tool_call_output", "call_id": call_id, "output": "unsupported tool call"}
        return {"type": "custom_tool_call_output", "call_id": call_id, "output": self.apply_patch(patch)}

    def apply_patch(self, patch: str) -> str:
        """`*** Add File` hunks only: enough for the scripted model."""
        files: dict[str, list[str]] = {}
        current: list[str] | None = None
        for line in patch.splitlines():
            if line.startswith("*** Add File: "):
                name = line.removeprefix("*** Add File: ").strip()
                path = os.path.normpath(os.path.join(self.cwd, name))
                if not path.startswith(self.cwd + os.sep):
                    return f"refusing to write outside the workspace: {name}"
                current = files.setdefault(path, [])
            elif line.startswith("*** "):
                if line.strip() not in ("*** Begin Patch", "*** End Patch"):
                    return f"the stand-in applies only '*** Add File' hunks: {line}"
                current = None
            elif current is not None and line.startswith("+"):
                current.append(line[1:])
        if not files:
            return "the patch adds no file"
        changes = [{"path": path, "kind": "update" if os.path.exists(path) else "add"} for path in files]
        item: dict[str, Any] = {
            "id": self.item_id(),
            "type": "file_change",
            "changes": changes,
            "status": "in_progress",
        }
        emit({"type": "item.started", "item": item})
        for path, lines in files.items():
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as handle:
                handle.write("".join(f"{line}\n" for line in lines))
        emit({"type": "item.completed", "item": dict(item, status="completed")})
        names = ", ".join(os.path.relpath(path, self.cwd) for path in files)
        return f"Success. Updated the following files:\nA {names}\n"


def main(argv: list[str] | None = None) -> None:
    options = parse_args(sys.argv[1:] if argv is None else argv)
    task = sys.stdin.buffer.read().decode("utf-8", "replace")
    if not task.strip():
        startup_error("No prompt provided via stdin.")
    if options.cd is not None:
        try:
            os.chdir(options.cd)
        except OSError as exc:
            startup_error(f"Error: failed to change to directory {options.cd}: {exc.strerror}")
    Turn(options, task, Rollout(options)).run()


if __name__ == "__main__":
    main()
