"""What one operation module declares: the shape every entry of the registry (courier/ops/__init__.py) has.

Plain data and loaders only: the receiver imports every operation module when it starts,
so nothing here (or at the top of an operation module) may import the CLI, the MCP SDK,
the configuration, the transport or a handler's module. A handler is named as data,
`"module:function"`, and imported when its operation is first asked for.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from courier.runs.context import Handler
from protocol.operations import Operation

if TYPE_CHECKING:
    from courier.config import Config
    from protocol.models import RemoteRequest, RemoteResponse, Result

# How an executor whose runs live on several nodes answers an operation (docs/architecture.md#executor):
# - "forward": the node that holds the run answers (a run no node holds yet: the op's `before_start`);
# - "fan_out": every node answers and the replies merge (by the reply's kind);
# - "place": the cluster places a new run;
# - "head": the head answers with the operation's own handler, which looks at runs through the executor.
Cluster = Literal["forward", "fan_out", "place", "head"]

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


class ToolClient(Protocol):
    """The client (courier/client/client.py) as a tool handler uses it, bound to the configuration loaded
    for the call. Blocking: a handler calls it inside `ToolCall.blocking`; no operation module imports
    a transport or a sender."""

    config: Config

    def ask(self, machine: str, request: RemoteRequest, *, timeout_s: float | None = None) -> RemoteResponse:
        """The reply to one request, an in-band failure raised as its error class."""

    def start(self, machine: str, starting: RemoteRequest, run_id: str) -> Result:
        """A request that starts a run (continue)."""

    def dispatch(
        self, to: str | None, machine: str, starting: RemoteRequest, machine_timeout_s: float, wait_for_slot_ms: int = 0
    ) -> Result:
        """A dispatch, placed by `to: auto[:LABEL]` when asked."""

    def await_(
        self,
        machine: str,
        run_id: str,
        wait_timeout_ms: int,
        *,
        started_at: float | None = None,
    ) -> Result:
        """The run once terminal, or as last observed when the bound passes."""

    def fleet_document(self, machine_timeout_s: float, *, stalled_only: bool = False) -> dict[str, Any]:
        """`list --all`'s document: this machine and every configured one."""

    def watch_once(self, machines: list[str], cursor: str | None, bound_s: float) -> dict[str, Any]:
        """One watch call's document: the transitions after `cursor`."""

    def probe_machines(self, *, check: bool, machine_timeout_s: float) -> list[Any]:
        """Every configured machine's row; with `check`, each asked `version` (the `machines` tool)."""


class ToolCall(Protocol):
    """One MCP tool call as a handler sees it (courier/mcp_server.py's `Call`)."""

    async def client(self) -> ToolClient:
        """The client, with the configuration loaded for this call (in the tools' pool)."""

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


class NotOnANode(Protocol):
    """A run an executor knows that no node holds now: queued, ended before it started, or its node gone."""

    @property
    def phase(self) -> Literal["queued", "ended", "lost"]: ...

    @property
    def result(self) -> Result:
        """What the executor knows of it."""

    @property
    def node(self) -> str:
        """"lost": the node it was on."""

    def cancel(self) -> bool:
        """Stop it before it starts: True when it never will, False when it has just started on a node."""


# A forward operation's answer for a run no node holds: True when it answered, False to ask the
# run's node once one holds it (a queued run that started meanwhile).
BeforeStart = Callable[["RemoteRequest", "RemoteResponse", NotOnANode], bool]


def load(target: str) -> Any:
    """The object a `"module:name"` string names (a handler, a class): imported on first use."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Op:
    wire: Operation  # what the request carries and what the reply holds (both sides validate with it)
    handler: str  # "module:function" of its Handler on this machine, imported when first asked for
    cluster: Cluster  # how an executor over several nodes answers it
    before_start: BeforeStart | None = None  # forward: the answer for a run no node holds
    # Never over a long-lived serve session: it depends on the environment a new login gets now
    # (PATH: the harnesses a run may start, those `version` lists; docs/courier.md).
    fresh_environment: bool = False
    printed: str | None = None  # the `wb schema` document `wb agent NAME --json` prints
    printed_all: str | None = None  # ... and with --all, when the command takes it
    mcp: McpTool | None = None

    @property
    def name(self) -> str:
        return self.wire.name

    def handle(self) -> Handler:
        """Its handler on this machine (its module imported now, once)."""
        handler: Handler = load(self.handler)
        return handler


def ref_arg() -> Arg:
    return Arg("ref", str, 'The run: "agt-<32 hex>" on this machine, or "MACHINE:agt-<32 hex>".')


def to_arg(description: str = "Ask this configured machine (as --to); default: this machine.") -> Arg:
    return Arg("to", str | None, description, None)
