"""`wb mcp`: the wb operations as Model Context Protocol tools on stdio. The only module importing `mcp`.

Each tool validates and builds its request with the CLI's own functions (courier/commands.py)
and answers with the documents of `wb schema`. A refusal is an MCP tool error whose text is
the `error` document: the message the CLI prints and its class (usage, finding, transport).
Blocking work runs in a bounded pool of worker threads of its own (so the SDK's stdio
threads are never starved); `await` polls the run's status in that pool and waits between
polls without holding a thread, reporting progress, so hundreds of waiting calls never hold
up another tool, and a cancelled call returns at once while the run goes on.
Nothing but the protocol reaches stdout: the SDK points fd 1 at stderr while serving, and
sys.stdout is stderr too.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import io
import json
import os
import re
import sys
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import anyio
import anyio.to_thread
from anyio.streams.memory import MemoryObjectSendStream
from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from courier import __version__, commands
from courier.config import Config, load_config
from courier.errors import Finding, UsageError, WbError
from courier.ops import REGISTRY
from courier.ops.base import McpTool
from courier.ops.continue_ import build_continue
from courier.ops.dispatch import build_dispatch
from courier.render import json_text
from courier.route import ask
from courier.schemas import DOCUMENTS, schema
from courier.starting import send_dispatch, send_starting
from protocol import limits
from protocol.documents import ErrorDocument, FleetDocument, FleetMachine, LogsDocument, error_class
from protocol.models import DiffResult, RemoteRequest, RemoteResponse, Result, collector_paused
from protocol.refs import format_reference

# How often a waiting `await` reports progress (docs/mcp.md: at least every 10 s).
AWAIT_PROGRESS_MS = 5_000
# How often a waiting `await` asks for the run's status: soon at first, then backing off.
AWAIT_POLL_FIRST_S = 0.2
AWAIT_POLL_MAX_S = 2.0


def progress_interval_ms() -> int:
    """AWAIT_PROGRESS_MS; a smaller interval can be set for tests."""
    override = os.environ.get("WB_MCP_PROGRESS_MS", "")
    if override.isdigit() and 0 < int(override) <= AWAIT_PROGRESS_MS:
        return int(override)
    return AWAIT_PROGRESS_MS


INSTRUCTIONS = (
    "wb runs one bounded coding task in one coding-agent harness inside an isolated git worktree, "
    "on this machine or on a configured SSH machine, and reports the facts of the run (state, exit code, "
    "final message, usage, changed files); it never judges the work. Typical loop: dispatch, then await "
    "(or status), then diff to see the change; continue to follow up; stop to end a run. A run is named "
    'by its reference: "agt-<32 hex>" here, "MACHINE:agt-<32 hex>" elsewhere.'
)

REF = Field(description='The run: "agt-<32 hex>" on this machine, or "MACHINE:agt-<32 hex>".')
TO = Field(default=None, description="Ask this configured machine (as --to); default: this machine.")


class Arguments(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class DispatchArgs(Arguments):
    task: str = Field(
        description=f"The task for the worker, at most {limits.TASK_MAX_TEXT}, not blank. Never printed back."
    )
    profile: str = Field(description="A profile from agents.profiles in wb.yaml.")
    new_worktree: str | None = Field(default=None, description="Create this worktree (exactly one of the two).")
    use_worktree: str | None = Field(default=None, description="Use this existing worktree (exactly one of the two).")
    repo: str | None = Field(
        default=None, description="OWNER/REPO; default: the origin of the server's working directory (new only)."
    )
    branch: str | None = Field(default=None, description="Branch for a new worktree (default wb/NAME).")
    base: str | None = Field(default=None, description="Commit to start from.")
    to: str | None = Field(
        default=None,
        description='Start it on this configured machine (as --to); "auto" or "auto:LABEL": on the configured '
        "machine (with that label) with the most free slots; default: this machine.",
    )
    timeout: str = Field(
        default=commands.TIMEOUT_DEFAULT,
        description=f"Bound on the run, a Go duration (30m, 2h); at most {limits.TIMEOUT_MAX_TEXT}.",
    )


class RefArgs(Arguments):
    ref: str = REF
    to: str | None = TO


class AwaitArgs(RefArgs):
    wait_timeout: str = Field(
        default=commands.default_duration(limits.MCP_AWAIT_DEFAULT_MS),
        description=(
            "Bound on the wait, a Go duration (default 45s, below the usual 60 s MCP request timeout); "
            "0 = no bound. Past it: the run's result as observed (terminal false); call await again."
        ),
    )


class ListArgs(Arguments):
    to: str | None = TO
    all: bool = Field(default=False, description="This machine and every configured machine (not with to).")
    stalled: bool = Field(default=False, description="Only running runs whose harness went silent (stalled).")
    machine_timeout: str = Field(default=commands.MACHINE_TIMEOUT_DEFAULT, description="Per-machine deadline with all.")


class LogsArgs(RefArgs):
    tail: int = Field(default=limits.LOGS_TAIL_DEFAULT, description="How many worker actions (at least 1).")
    raw: bool = Field(default=False, description="The whole transcript (JSON lines) instead of the actions.")


class DiffArgs(RefArgs):
    stat: bool = Field(default=False, description="Only the per-file counts, without the patch.")


class ContinueArgs(RefArgs):
    task: str = Field(description=f"The follow-up task, at most {limits.TASK_MAX_TEXT}, not blank.")
    profile: str | None = Field(default=None, description="Default: the profile of the run continued.")
    timeout: str = Field(
        default=commands.TIMEOUT_DEFAULT,
        description=f"Bound on the new run, a Go duration; at most {limits.TIMEOUT_MAX_TEXT}.",
    )


class WatchArgs(Arguments):
    to: str | None = TO
    all: bool = Field(default=False, description="This machine and every configured machine (not with to).")
    cursor: str | None = Field(default=None, description="The cursor of the previous watch call; none at first.")
    wait_timeout: str = Field(
        default=commands.default_duration(limits.MCP_AWAIT_DEFAULT_MS),
        description="Bound on the wait for an event, a Go duration (default 45s); it answers soon after the first.",
    )


class MachinesArgs(Arguments):
    check: bool = Field(default=False, description="Probe each machine with the version operation.")
    machine_timeout: str = Field(
        default=commands.MACHINE_TIMEOUT_DEFAULT, description="Per-machine deadline with check."
    )


Handler = Callable[["Call", Any], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    arguments: type[Arguments]
    output: str  # a `wb schema` name, or "machines" wrapped in an object
    handler: Handler
    read_only: bool = True


@functools.cache
def _blocking_pool() -> anyio.CapacityLimiter:
    """The tools' own threads: anyio's default pool stays free for the SDK's stdin and stdout."""
    return anyio.CapacityLimiter(limits.MCP_BLOCKING_THREADS)


@dataclass
class Call:
    """One tool call: its request context (for progress) and the configuration, loaded per call."""

    ctx: ServerRequestContext[Any, Any]

    async def blocking(self, work: Callable[[], Any]) -> Any:
        # A cancelled call returns at once; the thread ends its bounded step on its own.
        return await anyio.to_thread.run_sync(work, abandon_on_cancel=True, limiter=_blocking_pool())

    async def config(self) -> Config:
        return await self.blocking(load_config)  # type: ignore[no-any-return]


# -- handlers ------------------------------------------------------------------------------


async def _dispatch(call: Call, args: DispatchArgs) -> dict[str, Any]:
    machine, request = build_dispatch(
        new_worktree=args.new_worktree,
        use_worktree=args.use_worktree,
        profile=args.profile,
        task=args.task,
        task_file=None,
        repo=args.repo,
        branch=args.branch,
        base=args.base,
        to=args.to,
        timeout=args.timeout,
    )
    config = await call.config()
    bound_s = limits.PLACEMENT_TIMEOUT_DEFAULT_MS / limits.MS_PER_SECOND  # to: auto asks the candidates this long
    result: Result = await call.blocking(lambda: send_dispatch(config, args.to, machine, request, bound_s))
    return result.to_wire()


async def _status(call: Call, args: RefArgs) -> dict[str, Any]:
    machine, run_id = commands.target(args.ref, args.to)
    config = await call.config()
    request = commands.request("status", agent_id=run_id)
    result: Result = await call.blocking(lambda: ask(config, machine, request).result_of())
    return result.to_wire()


async def _await(call: Call, args: AwaitArgs) -> dict[str, Any]:
    """Poll the run's status until it is terminal or the bound passes; past it, the run as observed.

    Each poll is one quick status call in the pool; between polls the call holds no thread.
    Progress goes out from a task of its own, so a slow poll never delays it.
    """
    machine, run_id = commands.target(args.ref, args.to)
    bound_ms = commands.wait_bound_ms(args.wait_timeout)
    ref = format_reference(machine, run_id)
    config = await call.config()
    request = commands.request("status", agent_id=run_id)
    began = time.monotonic()
    deadline = began + bound_ms / 1000 if bound_ms else None
    observed = ["running"]

    async def report_progress() -> None:
        while True:
            await anyio.sleep(progress_interval_ms() / 1000)
            waited = time.monotonic() - began
            await call.ctx.session.report_progress(
                round(waited, 1),
                bound_ms / 1000 if bound_ms else None,
                f"{ref} is {observed[0]}; waited {int(waited)}s",
            )

    async def poll() -> Result:
        pause = AWAIT_POLL_FIRST_S
        while True:
            with commands.naming(f"the run is not affected; await it again with: wb agent await {ref}"):
                result: Result = await call.blocking(lambda: ask(config, machine, request).result_of())
            observed[0] = result.state
            now = time.monotonic()
            if result.terminal or (deadline is not None and now >= deadline):
                return result
            await anyio.sleep(pause if deadline is None else min(pause, deadline - now))
            pause = min(pause * 2, AWAIT_POLL_MAX_S)

    failure: Exception | None = None
    async with anyio.create_task_group() as group:
        group.start_soon(report_progress)
        try:
            result = await poll()
        except Exception as exc:  # raised below as itself, not wrapped in the task group's ExceptionGroup
            failure = exc
        group.cancel_scope.cancel()
    if failure is not None:
        raise failure
    return result.to_wire()


async def _list(call: Call, args: ListArgs) -> dict[str, Any]:
    commands.check_list_scope(args.to, args.all)
    config = await call.config()
    if args.all:
        from courier.fleet import gather_all

        timeout_s = commands.machine_timeout_s(args.machine_timeout)
        answer = await call.blocking(lambda: gather_all(config, timeout_s, stalled_only=args.stalled))
        return answer.document().to_json()  # type: ignore[no-any-return]
    machine, _ = commands.target(None, args.to)
    return await call.blocking(lambda: _list_one(config, machine, args.stalled))  # type: ignore[no-any-return]


def _list_one(config: Config, machine: str, stalled_only: bool) -> dict[str, Any]:
    """One machine's runs in the fleet document's shape: its single row says whether it answered fully."""
    from courier.render import sort_results

    began = time.monotonic()
    with collector_paused():
        response = ask(config, machine, commands.request("list"))
        results = sort_results(response.results_of())
    warnings = response.warnings or []
    runs = len(results)
    if stalled_only:
        from courier.render import is_stalled

        results = [result for result in results if is_stalled(result)]
    row = FleetMachine(
        machine=machine,
        ok=not warnings,
        runs=runs,
        error="; ".join(f"{format_reference(machine, w.agent_id)}: {w.error}" for w in warnings) or None,
        elapsed_ms=int((time.monotonic() - began) * 1000),
    )
    return FleetDocument(results=results, machines=[row]).to_json()


async def _logs(call: Call, args: LogsArgs) -> dict[str, Any]:
    commands.check_tail(args.tail)
    machine, run_id = commands.target(args.ref, args.to)
    config = await call.config()
    request = commands.request("logs", agent_id=run_id, tail=args.tail, raw=args.raw)
    logs: str = await call.blocking(lambda: _logs_text(config, machine, request))
    return LogsDocument(agent_id=run_id, machine=machine or None, logs=logs).to_json()


def _logs_text(config: Config, machine: str, request: RemoteRequest) -> str:
    response = ask(config, machine, request)
    transcript = response.take_transcript()  # this machine's raw transcript, handed over in-process
    if transcript is None:
        return response.logs
    from courier.runs.service import raw_text

    return raw_text(request.agent_id, transcript)  # bounded as a reply's copy is


async def _stop(call: Call, args: RefArgs) -> dict[str, Any]:
    machine, run_id = commands.target(args.ref, args.to)
    config = await call.config()
    request = commands.request("stop", agent_id=run_id)
    ref = format_reference(machine, run_id)
    with commands.naming(f"the stop may have reached the run; check it with: wb agent status {ref}"):
        response: RemoteResponse = await call.blocking(lambda: ask(config, machine, request))
    return response.stop_result_of().to_wire()  # `machine` is stamped for a remote run


async def _diff(call: Call, args: DiffArgs) -> dict[str, Any]:
    from courier.supervise import fetch_diff

    machine, run_id = commands.target(args.ref, args.to)
    config = await call.config()
    diff: DiffResult = await call.blocking(lambda: fetch_diff(config, machine, run_id, stat=args.stat))
    if diff.patch is not None:
        try:
            diff.patch.encode("utf-8")
        except UnicodeEncodeError:  # a byte git wrote that is not UTF-8 travels as a lone surrogate
            ref = format_reference(machine, run_id)
            raise Finding(
                f"the patch of {ref} has bytes that are not UTF-8, which JSON cannot carry; "
                f"pass stat, or read it with: wb agent diff {ref}"
            ) from None
    return diff.to_wire()


async def _continue(call: Call, args: ContinueArgs) -> dict[str, Any]:
    machine, request, new_id = build_continue(
        reference=args.ref, task=args.task, task_file=None, profile=args.profile, timeout=args.timeout, to=args.to
    )
    config = await call.config()
    result: Result = await call.blocking(lambda: send_starting(config, machine, request, new_id))
    return result.to_wire()


async def _machines(call: Call, args: MachinesArgs) -> dict[str, Any]:
    from courier.fleet import probe_machines

    timeout_s = commands.machine_timeout_s(args.machine_timeout)
    config = await call.config()
    rows = await call.blocking(lambda: probe_machines(config, check=args.check, machine_timeout_s=timeout_s))
    # The file named, so a client that passed no environment sees which wb.yaml it got (docs/mcp.md).
    return {"machines": [row.document().to_json() for row in rows], "config": str(config.path)}


async def _watch(call: Call, args: WatchArgs) -> dict[str, Any]:
    from courier.watch import watch_once

    commands.check_list_scope(args.to, args.all)
    bound_ms = commands.wait_bound_ms(args.wait_timeout) or limits.MCP_AWAIT_DEFAULT_MS
    config = await call.config()
    machine, _ = commands.target(None, args.to)
    machines = ["", *sorted(config.targets)] if args.all else [machine]
    document = await call.blocking(lambda: watch_once(config, machines, args.cursor, bound_ms / 1000, lambda _: None))
    return document.to_json()  # type: ignore[no-any-return]


# Each tool's arguments and handler, in the order tools/list names them; an operation's tool
# takes its description, output document and read-only hint from the operation's module.
_CODE: dict[str, tuple[type[Arguments], Handler]] = {
    "dispatch": (DispatchArgs, _dispatch),
    "status": (RefArgs, _status),
    "await": (AwaitArgs, _await),
    "list": (ListArgs, _list),
    "logs": (LogsArgs, _logs),
    "diff": (DiffArgs, _diff),
    "stop": (RefArgs, _stop),
    "continue": (ContinueArgs, _continue),
    "watch": (WatchArgs, _watch),
    "machines": (MachinesArgs, _machines),
}

# Tools that are not one operation: machines asks every configured machine (with check, `version`).
_NOT_OPERATIONS: dict[str, McpTool] = {
    "machines": McpTool(
        "The configured machines (host, user, port, wb_path) and, with check, whether each answers (wb and schema "
        "versions, round trip, clock offset); config names the wb.yaml they were read from.",
        "machines",
    )
}


def _described(name: str) -> McpTool:
    op = REGISTRY.get(name)
    found = op.mcp if op is not None else _NOT_OPERATIONS.get(name)
    assert found is not None, f"the MCP tool {name} has no description (courier/ops/{name}.py)"
    return found


def _tools() -> list[Tool]:
    tools = []
    for name, (arguments, handler) in _CODE.items():
        described = _described(name)
        tools.append(Tool(name, described.description, arguments, described.output, handler, described.read_only))
    return tools


TOOLS: list[Tool] = _tools()


def available_tools() -> list[Tool]:
    return list(TOOLS)


# -- schemas -------------------------------------------------------------------------------


# What a wrapped tool result carries beside its document.
WRAPPER_FIELDS: dict[str, dict[str, Any]] = {
    "machines": {
        "config": {
            "type": "string",
            "description": "The wb.yaml this server read: WB_CONFIG, else the default path (which may not exist).",
        }
    }
}


def output_schema(name: str) -> dict[str, Any]:
    """A tool's output schema: the named document, an array wrapped in an object (MCP wants objects)."""
    body = dict(schema(name))
    body.pop("$id", None)
    if body.get("type") == "object":
        return body
    defs = body.pop("$defs", None)
    wrapped: dict[str, Any] = {
        "$schema": body.pop("$schema"),
        "type": "object",
        "properties": {name: body, **WRAPPER_FIELDS.get(name, {})},
        "required": [name, *WRAPPER_FIELDS.get(name, {})],
    }
    if defs:
        wrapped["$defs"] = defs
    return wrapped


def input_schema(arguments: type[Arguments]) -> dict[str, Any]:
    body = arguments.model_json_schema()
    body.pop("title", None)
    return body


def tool_definitions() -> list[types.Tool]:
    return [
        types.Tool(
            name=tool.name,
            description=tool.description,
            input_schema=input_schema(tool.arguments),
            output_schema=output_schema(tool.output) if tool.output in DOCUMENTS else None,
            annotations=types.ToolAnnotations(read_only_hint=tool.read_only, open_world_hint=False),
        )
        for tool in available_tools()
    ]


# -- the server ----------------------------------------------------------------------------


def _error(exc: WbError) -> types.CallToolResult:
    """A tool error whose one text block is the `error` document (message, class, exit_code).

    Not structured content: clients (the TypeScript SDK's among them) check structured content
    against the tool's output schema even on errors, and the error is not that document.
    """
    document = ErrorDocument(message=exc.message, error_class=error_class(exc.exit_code), exit_code=exc.exit_code)
    return types.CallToolResult(
        content=[types.TextContent(text=json_text(document.to_json(), indent=None))], is_error=True
    )


def _arguments_error(tool: Tool, exc: ValidationError) -> UsageError:
    parts = []
    for item in exc.errors(include_url=False, include_input=False):
        where = ".".join(str(part) for part in item["loc"]) or "arguments"
        parts.append(f"{where}: {item['msg']}")
    return UsageError(f"invalid arguments for {tool.name}: {'; '.join(parts[:5])}")


async def call_tool(ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams) -> types.CallToolResult:
    tools = {tool.name: tool for tool in available_tools()}
    tool = tools.get(params.name)
    try:
        if tool is None:
            raise UsageError(f'unknown tool "{params.name}"; the tools are: {", ".join(tools)}')
        try:
            args = tool.arguments.model_validate(params.arguments or {})
        except ValidationError as exc:
            raise _arguments_error(tool, exc) from None
        document = await tool.handler(Call(ctx), args)
    except WbError as exc:
        return _error(exc)
    except Exception as exc:  # never a traceback to the client: the CLI's internal error, as a finding
        return _error(WbError(f"internal: {type(exc).__name__}: {exc}"))
    return types.CallToolResult(
        content=[types.TextContent(text=json_text(document, indent=None))],
        structured_content=document,
    )


async def list_tools(
    ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    return types.ListToolsResult(tools=tool_definitions())


def build_server() -> Server[Any]:
    return Server(
        "wb",
        version=__version__,
        title="wb: dispatch coding tasks to agent harnesses",
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


# -- every line answered --------------------------------------------------------------------
#
# The SDK's stdio reader drops a line it cannot take as a JSON-RPC message (invalid JSON, a
# lone surrogate, a non-object, a request without a method) without a word, and a client
# waiting for that id hangs. The lines pass through `ScreenedLines` first: a message the SDK
# takes goes on to it unchanged, any other line is answered here (JSON-RPC 2.0, "Response object").


def screen(line: str) -> types.JSONRPCError | None:
    """None when the SDK takes the line as a message; else the error answering it."""
    try:
        types.jsonrpc_message_adapter.validate_json(line, by_name=False)
        return None
    except ValidationError:
        pass
    try:
        document = json.loads(line)  # unlike the SDK's parser, this one takes lone surrogates
    except (ValueError, RecursionError):
        return _rpc_error(None, types.PARSE_ERROR, "Parse error: the line is not one JSON value")
    request_id = document.get("id") if isinstance(document, dict) else None
    if isinstance(request_id, bool) or not isinstance(request_id, int | str):
        request_id = None
    if not isinstance(document, dict):
        reason = "a message must be a JSON object"
    elif any(_SURROGATE.search(text) for text in _strings(document)):
        reason = "the message contains a lone surrogate (a \\ud800-\\udfff escape), which is not Unicode text"
    else:
        reason = "not a JSON-RPC 2.0 request, notification or response"
    return _rpc_error(request_id, types.INVALID_REQUEST, f"Invalid Request: {reason}")


_SURROGATE = re.compile("[\ud800-\udfff]")


def _strings(value: Any) -> Iterator[str]:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _rpc_error(request_id: str | int | None, code: int, message: str) -> types.JSONRPCError:
    return types.JSONRPCError(jsonrpc="2.0", id=request_id, error=types.ErrorData(code=code, message=message))


class ScreenedLines:
    """stdin for the SDK's reader: it gets the lines it can take; the others are answered on the wire."""

    def __init__(self, lines: AsyncIterable[str]) -> None:
        self.lines = lines
        self.wire: MemoryObjectSendStream[SessionMessage] | None = None
        self.ready = anyio.Event()

    async def __aiter__(self) -> AsyncIterator[str]:
        async for line in self.lines:
            answer = screen(line)
            if answer is None:
                yield line
                continue
            # Sent before the next line is read, so an answer is on the wire before EOF ends the server.
            await self.ready.wait()
            assert self.wire is not None
            await self.wire.send(SessionMessage(answer))

    def connect(self, wire: MemoryObjectSendStream[SessionMessage]) -> None:
        self.wire = wire
        self.ready.set()


@contextlib.contextmanager
def _claimed_stdin() -> Iterator[anyio.AsyncFile[str]]:
    """The wire moved to a private descriptor and fd 0 pointed at /dev/null, as the SDK does when it reads.

    A process wb starts then never inherits (or reads) the client's pipe.
    """
    wire = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    try:
        # closefd=False: a reader thread may still block on it after the server ends.
        binary = os.fdopen(wire, "rb", closefd=False)
        yield anyio.wrap_file(io.TextIOWrapper(binary, encoding="utf-8", errors="replace"))
    finally:
        os.dup2(wire, 0)


async def _serve() -> None:
    server = build_server()
    with _claimed_stdin() as stdin:
        screened = ScreenedLines(stdin)
        async with stdio_server(stdin=cast("anyio.AsyncFile[str]", screened)) as (read_stream, write_stream):
            # The SDK has pointed fd 1 at stderr; Python-level writes follow it, never the wire.
            sys.stdout = sys.stderr
            screened.connect(write_stream)
            await server.run(read_stream, write_stream, server.create_initialization_options())


def serve() -> None:
    anyio.run(_serve)
