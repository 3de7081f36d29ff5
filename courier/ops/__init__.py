"""The operation registry: one line per operation module; everything that lists operations reads it.

The wire table that both sides validate with (protocol/operations.py), the handlers of
`perform` (courier/executor/perform.py), the MCP tools (courier/mcp_server.py), the documents
`wb agent NAME --json` prints (docs/schema/, and the tests' schema map) all come from here.
protocol/ names no courier module, so this registry hands it the wire entries when it is
first imported; courier/executor/perform.py and courier/client/transport.py, the two ways into an
operation, import it. Adding an operation is one module in this package, one line below
and its tests (docs/architecture.md, "Where a change goes").
"""

from __future__ import annotations

from courier.ops import await_, continue_, diff, dispatch, list_, logs, prune, status, stop, version, watch
from courier.ops.op import Op
from protocol.operations import install

# In the wire table's order: refusals name the operations in it, capabilities list in it.
REGISTRY: dict[str, Op] = {
    module.OP.name: module.OP
    for module in (dispatch, status, await_, list_, logs, stop, version, diff, continue_, prune, watch)
}

install(op.wire for op in REGISTRY.values())
