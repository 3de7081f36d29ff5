"""The bundled stand-in for `gemini` that `wb demo --harness gemini` uses when the real Gemini CLI is not on PATH.

It accepts the argv wb builds (docs/harnesses.md: `-o stream-json -m MODEL --approval-mode MODE`),
reads the task on stdin, and holds a real, if tiny, conversation with the Gemini API at
GOOGLE_GEMINI_BASE_URL (`POST {base}/v1beta/models/<model>:streamGenerateContent?alt=sse`,
the key from GEMINI_API_KEY in `x-goog-api-key`), offering `run_shell_command` and
`write_file`. It runs the commands the model asks for in the working directory (no sandbox:
it only ever talks to the demo's scripted server), writes files inside it, and prints the
stream-json events Gemini CLI 0.61.0 prints (`init`, the task echoed as a user `message`,
`tool_use`/`tool_result`, assistant `message` deltas, `result` with `stats`). After an HTTP
error it prints an error `result` and exits with the status truncated to a byte, as 0.61.0 does.

The session is kept where 0.61.0 keeps it, `$GEMINI_CLI_HOME/.gemini/tmp/<project>/chats/
session-<time>-<first 8 of the ID>.jsonl` (HOME without the variable; the project is named
after the working directory in `.gemini/projects.json`): a metadata line, then one line per
content. `--resume <session-id>` (`-r`) continues it: `init` repeats the ID, the earlier turn
goes first in the request's `contents`, the new contents are appended; `stats` count this
run only. A session not in the home exits 42 before any output, as 0.61.0 does.

Run as `python -m courier.demo.standin_gemini …` (the demo installs a `gemini` wrapper).
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

from courier.demo.standin_sessions import append_records, read_records

MAX_ROUNDS = 8
COMMAND_TIMEOUT_S = 30.0
REQUEST_TIMEOUT_S = 30.0
OUTPUT_MAX_CHARS = 16 * 1024
_TOOLS = [
    {
        "functionDeclarations": [
            {
                "name": "run_shell_command",
                "description": "Runs a shell command in the workspace and returns its output.",
                "parametersJsonSchema": {
                    "type": "object",
                    "properties": {"command": {"type": "string"}, "description": {"type": "string"}},
                    "required": ["command"],
                },
            },
            {
                "name": "write_file",
                "description": "Writes a file in the workspace.",
                "parametersJsonSchema": {
                    "type": "object",
                    "properties": {"file_path": {"type": "string"}, "content": {"type": "string"}},
                    "required": ["file_path", "content"],
                },
            },
        ]
    }
]


def emit(event: dict[str, Any]) -> None:
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    line = {"type": event.pop("type"), "timestamp": stamp, **event}
    sys.stdout.write(json.dumps(line, separators=(",", ":"), ensure_ascii=False) + "\n")
    sys.stdout.flush()


def fatal(message: str, code: int) -> NoReturn:
    sys.stderr.write(message + "\n")
    sys.exit(code)


def parse_args(argv: list[str]) -> tuple[str, str | None]:
    """The model and the session to resume; the other flags wb passes are accepted, anything else is refused."""
    model, resume = "gemini-2.5-pro", None
    args = iter(argv)
    for arg in args:
        if arg in ("-r", "--resume"):
            resume = next(args, "") or fatal("Not enough arguments following: resume", 1)
        elif arg in ("-m", "--model"):
            model = next(args, "") or fatal("Not enough arguments following: model", 1)
        elif arg in ("-o", "--output-format"):
            if next(args, "") != "stream-json":
                fatal("the stand-in only implements -o stream-json", 1)
        elif arg == "--approval-mode":
            next(args, "")
        else:
            fatal(f"Unknown argument: {arg.lstrip('-')}", 1)
    return model, resume


class Chats:
    """This project's sessions in the CLI's home: a new one, or the one `--resume` names."""

    def __init__(self, cwd: str, resume: str | None) -> None:
        gemini_dir = os.path.join(os.environ.get("GEMINI_CLI_HOME") or os.path.expanduser("~"), ".gemini")
        self.dir = os.path.join(gemini_dir, "tmp", self._project(gemini_dir, cwd), "chats")
        self.earlier: list[dict[str, Any]] = []
        if resume is None:
            self.session_id = str(uuid.uuid4())
            stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H-%M")
            self.path = os.path.join(self.dir, f"session-{stamp}-{self.session_id[:8]}.jsonl")
            append_records(self.path, [{"sessionId": self.session_id, "startTime": stamp, "kind": "main"}])
            return
        for name in sorted(os.listdir(self.dir)) if os.path.isdir(self.dir) else []:
            records = read_records(os.path.join(self.dir, name)) if name.endswith(".jsonl") else None
            if records and records[0].get("sessionId") == resume:
                self.session_id, self.path = resume, os.path.join(self.dir, name)
                self.earlier = [r["content"] for r in records[1:] if isinstance(r.get("content"), dict)]
                return
        fatal(
            f'Error resuming session: Invalid session identifier "{resume}".\n  Searched for sessions in {self.dir}.',
            42,
        )

    @staticmethod
    def _project(gemini_dir: str, cwd: str) -> str:
        """The project's name in `projects.json`, registering the working directory on first use."""
        registry_path = os.path.join(gemini_dir, "projects.json")
        try:
            with open(registry_path, encoding="utf-8") as handle:
                registry = json.load(handle)
        except (OSError, ValueError):
            registry = {}
        projects = registry.get("projects") if isinstance(registry, dict) else None
        projects = projects if isinstance(projects, dict) else {}
        name = projects.get(cwd)
        if not isinstance(name, str):
            name = os.path.basename(cwd) or "root"
            os.makedirs(gemini_dir, mode=0o700, exist_ok=True)
            with open(registry_path, "w", encoding="utf-8") as handle:
                json.dump({"projects": {**projects, cwd: name}}, handle, indent=2)
        return name

    def keep(self, content: dict[str, Any]) -> None:
        append_records(self.path, [{"type": content.get("role"), "content": content}])


class Session:
    def __init__(self, model: str, task: str, resume: str | None = None) -> None:
        self.model = model
        self.task = task
        self.cwd = os.getcwd()
        self.calls = 0
        self.tokens = {"prompt": 0, "cached": 0, "candidates": 0, "thoughts": 0}
        self.resume = resume

    def stats(self) -> dict[str, Any]:
        prompt, cached, out = self.tokens["prompt"], self.tokens["cached"], self.tokens["candidates"]
        model = {
            "total_tokens": prompt + out + self.tokens["thoughts"],
            "input_tokens": prompt,
            "output_tokens": out,
            "cached": cached,
            "input": max(0, prompt - cached),
        }
        return {**model, "duration_ms": 0, "tool_calls": self.calls, "models": {self.model: dict(model)}}

    def fail(self, message: str, code: int) -> NoReturn:
        emit({"type": "result", "status": "error", "error": {"type": "unknown", "message": message},
              "stats": self.stats()})  # fmt: skip
        sys.exit(code)

    def run(self) -> NoReturn:
        base = os.environ.get("GOOGLE_GEMINI_BASE_URL", "").rstrip("/")
        key = os.environ.get("GEMINI_API_KEY", "")
        if not key:
            fatal("When using Gemini API, you must specify the GEMINI_API_KEY environment variable.", 41)
        if not base:
            fatal("the stand-in needs GOOGLE_GEMINI_BASE_URL (it only talks to the demo's scripted server)", 1)
        chats = Chats(self.cwd, self.resume)
        emit({"type": "init", "session_id": chats.session_id, "model": self.model})
        emit({"type": "message", "role": "user", "content": self.task})
        context = f"<session_context>\n- **Workspace Directories:**\n  - {self.cwd}\n</session_context>"
        # A resumed session already holds the context: the follow-up is the task alone.
        prompt = [{"text": self.task}] if chats.earlier else [{"text": context}, {"text": self.task}]
        contents: list[dict[str, Any]] = [*chats.earlier, {"role": "user", "parts": prompt}]
        chats.keep(contents[-1])
        url = f"{base}/v1beta/models/{self.model}:streamGenerateContent?alt=sse"
        for _ in range(MAX_ROUNDS):
            parts = self.respond(url, key, contents)
            contents.append({"role": "model", "parts": parts})
            chats.keep(contents[-1])
            calls = [p["functionCall"] for p in parts if isinstance(p.get("functionCall"), dict)]
            if not calls:
                emit({"type": "result", "status": "success", "stats": self.stats()})
                sys.exit(0)
            contents.append({"role": "user", "parts": [self.call(c) for c in calls]})
            chats.keep(contents[-1])
        self.fail(f"the model was still calling tools after {MAX_ROUNDS} rounds", 53)

    def respond(self, url: str, key: str, contents: list[dict[str, Any]]) -> list[dict[str, Any]]:
        body = {"contents": contents, "tools": _TOOLS, "generationConfig": {"temperature": 1}}
        headers = {"content-type": "application/json", "x-goog-api-key": key}
        request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
        parts: list[dict[str, Any]] = []
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as reply:
                for raw in reply:
                    line = raw.decode("utf-8", "replace").strip()
                    if line.startswith("data:"):
                        parts += self.chunk(json.loads(line[5:].strip()))
        except urllib.error.HTTPError as exc:
            text = exc.read().decode("utf-8", "replace")
            self.fail(f"[API Error: {text}]", exc.code & 0xFF)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            self.fail(f"[API Error: {exc}]", 1)
        return parts

    def chunk(self, chunk: Any) -> list[dict[str, Any]]:
        """The parts of one streamed chunk; text is printed as a delta as it arrives."""
        if not isinstance(chunk, dict):
            return []
        usage = chunk.get("usageMetadata")
        if isinstance(usage, dict):
            for name, field in (
                ("prompt", "promptTokenCount"),
                ("cached", "cachedContentTokenCount"),
                ("candidates", "candidatesTokenCount"),
                ("thoughts", "thoughtsTokenCount"),
            ):
                self.tokens[name] += int(usage.get(field) or 0)
        candidates = chunk.get("candidates") or [{}]
        content = candidates[0].get("content") if isinstance(candidates[0], dict) else None
        parts = content.get("parts") if isinstance(content, dict) else None
        found = [p for p in parts if isinstance(p, dict)] if isinstance(parts, list) else []
        for part in found:
            if isinstance(part.get("text"), str) and not part.get("thought"):
                emit({"type": "message", "role": "assistant", "content": part["text"], "delta": True})
        return found

    def call(self, call: dict[str, Any]) -> dict[str, Any]:
        name = str(call.get("name"))
        args = call.get("args") if isinstance(call.get("args"), dict) else {}
        assert isinstance(args, dict)
        tool_id = f"{name}__{name}_{int(time.time() * 1000)}_{self.calls}"
        self.calls += 1
        emit({"type": "tool_use", "tool_name": name, "tool_id": tool_id, "parameters": args})
        if name == "run_shell_command" and isinstance(args.get("command"), str):
            output, error = self.shell(args["command"]), None
        elif name == "write_file" and isinstance(args.get("file_path"), str):
            output, error = "", self.write(args["file_path"], str(args.get("content", "")))
        else:
            output, error = "", f'Tool "{name}" not found.'
        if error is None:
            result: dict[str, Any] = {"type": "tool_result", "tool_id": tool_id, "status": "success"}
            if output:
                result["output"] = output
            emit(result)
            response = {"output": output or "Success."}
        else:
            emit({"type": "tool_result", "tool_id": tool_id, "status": "error", "output": error,
                  "error": {"type": "tool_error", "message": error}})  # fmt: skip
            response = {"error": error}
        return {"functionResponse": {"id": tool_id, "name": name, "response": response}}

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

    def write(self, name: str, content: str) -> str | None:
        path = os.path.normpath(os.path.join(self.cwd, name))
        if not path.startswith(self.cwd + os.sep):
            return f'Path not in workspace: Attempted path "{path}" resolves outside the workspace {self.cwd}'
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(content)
        return None


def main(argv: list[str] | None = None) -> None:
    model, resume = parse_args(sys.argv[1:] if argv is None else argv)
    task = "" if sys.stdin.isatty() else sys.stdin.buffer.read().decode("utf-8", "replace")
    if not task.strip():
        fatal("No input provided via stdin.", 42)
    Session(model, task, resume).run()


if __name__ == "__main__":
    main()
