"""What one operation module declares: the shape every entry of the registry (courier/ops/__init__.py) has.

Plain data and loaders only: the receiver imports every operation module when it starts,
so nothing here (or at the top of an operation module) may import the CLI, the MCP SDK,
the configuration, the transport or a handler's module.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from courier.runs.context import Handler
from protocol.operations import Operation

if TYPE_CHECKING:
    from courier.config import Config
    from protocol.models import RemoteRequest, RemoteResponse, Result

T = TypeVar("T")


class Required:
    """The default of an MCP argument the caller must pass."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED = Required()


@dataclass(frozen=True)
class Arg:
    """One argument of an MCP tool, as data: courier/mcp_server.py builds the pydantic model (and its
    JSON Schema) from these, so the CLI and the receiver never pay for building it."""

    name: str
    type: Any  # str, int, bool or `str | None`
    description: str
    default: object = REQUIRED


class Reach(Protocol):
    """The ways to reach machines a tool handler uses, bound to the configuration loaded for the call.

    Blocking: a handler calls them inside `ToolCall.blocking`. courier/mcp_server.py provides them
    (route, starting, fleet, watch), so no operation module imports a transport or a sender.
    """

    config: Config

    def ask(self, machine: str, request: RemoteRequest) -> RemoteResponse:
        """`route.ask`: the reply, an in-band failure raised as its error class."""

    def start(self, machine: str, request: RemoteRequest, run_id: str) -> Result:
        """`starting.send_starting`: a request that starts a run (continue)."""

    def dispatch(self, to: str | None, machine: str, request: RemoteRequest, bound_s: float) -> Result:
        """`starting.send_dispatch`: a dispatch, placed by `to: auto[:LABEL]` when asked."""

    def fleet(self, timeout_s: float, stalled_only: bool) -> dict[str, Any]:
        """`fleet.gather_all`'s document: this machine and every configured one."""

    def watch(self, machines: list[str], cursor: str | None, bound_s: float) -> dict[str, Any]:
        """`watch.watch_once`'s document: the transitions after `cursor`."""


class ToolCall(Protocol):
    """One MCP tool call as a handler sees it (courier/mcp_server.py's `Call`)."""

    async def reach(self) -> Reach:
        """The configuration loaded (once per call, in the tools' pool) and the ways to reach machines."""

    async def blocking(self, work: Callable[[], T]) -> T:
        """Run `work` in the tools' own threads; a cancelled call returns at once."""

    async def progress(self, done: float, total: float | None, message: str) -> None:
        """A progress notification to the client."""


ToolHandler = Callable[[ToolCall, Any], Awaitable[dict[str, Any]]]  # (call, validated arguments) -> document


@dataclass(frozen=True)
class McpTool:
    """The operation's MCP tool, as data (the SDK objects are built in courier/mcp_server.py)."""

    description: str
    output: str  # the `wb schema` document the tool returns
    read_only: bool = True
    arguments: tuple[Arg, ...] = ()  # in the order the input schema lists them
    handler: ToolHandler | None = None  # imports what it uses inside, so the module stays light


@dataclass(frozen=True)
class Op:
    wire: Operation  # what the request carries and what the reply holds (both sides validate with it)
    handler: Callable[[], Handler]  # a loader: the handler's module is imported on first use
    printed: str | None = None  # the `wb schema` document `wb agent NAME --json` prints
    printed_all: str | None = None  # ... and with --all, when the command takes it
    mcp: McpTool | None = None

    @property
    def name(self) -> str:
        return self.wire.name


def ref_arg() -> Arg:
    return Arg("ref", str, 'The run: "agt-<32 hex>" on this machine, or "MACHINE:agt-<32 hex>".')


def to_arg(description: str = "Ask this configured machine (as --to); default: this machine.") -> Arg:
    return Arg("to", str | None, description, None)
