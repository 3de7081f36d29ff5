"""`wb mcp`: the wb operations as Model Context Protocol tools on stdio. The only module importing `mcp`.

Each tool is an operation's: its module in courier/ops/ holds the tool's description, its
arguments (as data; the pydantic models are built here) and its handler, which builds the
request with the CLI's own functions and answers with the documents of `wb schema`; this
module hands the handler a `Call` (courier/ops/op.py `ToolCall`) with the ways to reach
machines, so no operation module imports a transport. `machines` is the one tool here.
A refusal is an MCP tool error whose text is the `error` document: the message the CLI prints
and its class (usage, finding, transport).
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
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

import anyio
import anyio.to_thread
from anyio.streams.memory import MemoryObjectSendStream
from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from courier import __version__
from courier.errors import Interrupted, UsageError, WbError

# What `initialize` needs is imported above: the SDK and the server's name and version. The
# tools (courier/ops/, their arguments and output schemas) are built on the first `tools/list`,
# the configuration, the transports and the senders loaded on the first call that uses them
# (docs/benchmarks.md#mcp-start-up).
if TYPE_CHECKING:
    from courier.client.client import Client
    from courier.ops.op import Arg, ToolCall, ToolHandler

T = TypeVar("T")

INSTRUCTIONS = (
    "wb runs one bounded coding task in one coding-agent harness inside an isolated git worktree, "
    "on this machine or on a configured SSH machine, and reports the facts of the run (state, exit code, "
    "final message, usage, changed files); it never judges the work. Typical loop: dispatch, then await "
    "(or status), then diff to see the change; continue to follow up; stop to end a run. A run is named "
    'by its reference: "agt-<32 hex>" here, "MACHINE:agt-<32 hex>" elsewhere.'
)


class Arguments(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    arguments: type[Arguments]
    output: str  # a `wb schema` name, or "machines" wrapped in an object
    handler: ToolHandler
    read_only: bool = True


@functools.cache
def _blocking_pool() -> anyio.CapacityLimiter:
    """The tools' own threads: anyio's default pool stays free for the SDK's stdin and stdout."""
    from protocol import limits

    return anyio.CapacityLimiter(limits.MCP_BLOCKING_THREADS)


@dataclass
class Call:
    """One tool call (courier/ops/op.py `ToolCall`): its request context (for progress), its configuration."""

    ctx: ServerRequestContext[Any, Any]

    async def blocking(self, work: Callable[[], T]) -> T:
        # A cancelled call returns at once; the thread ends its bounded step on its own.
        return await anyio.to_thread.run_sync(work, abandon_on_cancel=True, limiter=_blocking_pool())

    async def client(self) -> Client:
        from courier.client.client import Client
        from courier.config import load_config

        return Client(await self.blocking(load_config))  # loaded per call: an edit of wb.yaml applies at once

    async def progress(self, done: float, total: float | None, message: str) -> None:
        await self.ctx.session.report_progress(done, total, message)


# -- the tools -------------------------------------------------------------------------------


def _machines_arguments() -> tuple[Arg, ...]:
    from courier.ops.op import Arg
    from protocol import limits
    from protocol.durations import default_duration

    return (
        Arg("check", bool, "Probe each machine with the version operation.", False),
        Arg(
            "machine_timeout",
            str,
            "Per-machine deadline with check.",
            default_duration(limits.MACHINE_TIMEOUT_DEFAULT_MS),
        ),
    )


async def _machines(call: ToolCall, args: Any) -> dict[str, Any]:
    """Not one operation: every configured machine (with check, asked `version`)."""
    from courier.commands import machine_timeout_s

    timeout_s = machine_timeout_s(args.machine_timeout)
    client = await call.client()
    rows = await call.blocking(lambda: client.probe_machines(check=args.check, machine_timeout_s=timeout_s))
    config = client.config
    # The file named, so a client that passed no environment sees which wb.yaml it got (docs/mcp.md).
    return {"machines": [row.document().to_json() for row in rows], "config": str(config.path)}


MACHINES_DESCRIPTION = (
    "The configured machines (host, user, port, wb_path) and, with check, whether each answers (wb and schema "
    "versions, round trip, clock offset); config names the wb.yaml they were read from."
)


def arguments_model(name: str, arguments: tuple[Arg, ...]) -> type[Arguments]:
    """The pydantic model (strict, no extra field) of a tool's arguments as its module lists them."""
    from courier.ops.op import REQUIRED

    fields: dict[str, Any] = {}
    for arg in arguments:
        default = ... if arg.default is REQUIRED else arg.default
        fields[arg.name] = (arg.type, Field(default=default, description=arg.description))
    return create_model(f"{name.title()}Args", __base__=Arguments, **fields)


@functools.cache
def available_tools() -> list[Tool]:
    """The operations with an MCP tool, in the registry's order, then `machines` (built once, on first use)."""
    from courier.ops import REGISTRY

    tools = []
    for op in REGISTRY.values():
        tool = op.mcp
        if tool is None:
            continue
        assert tool.handler is not None, f"the MCP tool {op.name} has no handler (courier/ops/{op.name}.py)"
        model = arguments_model(op.name, tool.arguments)
        tools.append(Tool(op.name, tool.description, model, tool.output, tool.handler, tool.read_only))
    machines = arguments_model("machines", _machines_arguments())
    tools.append(Tool("machines", MACHINES_DESCRIPTION, machines, "machines", _machines))
    return tools


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
    from courier.schemas import schema

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
    from courier.schemas import DOCUMENTS

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
    from courier.render import json_text
    from protocol.documents import ErrorDocument, error_class

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
    from courier.render import json_text

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


def main() -> int:
    """`wb mcp` without the CLI's argument layer (courier/main.py routes it here): the exit code."""
    try:
        serve()
    except KeyboardInterrupt:
        return Interrupted.exit_code
    except WbError as exc:
        sys.stderr.write(f"error: {exc.message}\n")
        return exc.exit_code
    except Exception as exc:  # as the CLI reports one: never a traceback
        sys.stderr.write(f"error: internal: {type(exc).__name__}: {exc}\n")
        return 1
    return 0
