"""What one operation module declares: the shape every entry of the registry (courier/ops/__init__.py) has.

Plain data and loaders only: the receiver imports every operation module when it starts,
so nothing here (or at the top of an operation module) may import the CLI, the MCP SDK,
the configuration, the transport or a handler's module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from courier.runs.context import Handler
from protocol.operations import Operation


@dataclass(frozen=True)
class McpTool:
    """The operation's MCP tool, as data (the SDK objects are built in courier/mcp_server.py)."""

    description: str
    output: str  # the `wb schema` document the tool returns
    read_only: bool = True


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
