"""Import a library's submodules without running its package `__init__` (docs/benchmarks.md#mcp-start-up).

The MCP SDK's top-level `mcp/__init__.py` and `mcp/server/__init__.py` only re-export names,
and to do so they import the SDK's client and its high-level server: about a fifth of
`wb mcp`'s start-up, none of which a stdio server uses. Registering each
package as a bare module with the package's search path lets `from mcp.server.lowlevel
import Server` load that submodule (and what it imports) alone. Only for packages whose
`__init__` does nothing but re-export; tested through `wb mcp` with the SDK's own client.
"""

from __future__ import annotations

import importlib.util
import sys
import types


def register_bare(*names: str) -> None:
    """Each of `names` (parents first) as an empty package module, unless it is imported already."""
    for name in names:
        if name in sys.modules:
            continue
        spec = importlib.util.find_spec(name)
        if spec is None or spec.submodule_search_locations is None:
            continue  # not installed, or not a package: the ordinary import reports it
        module = types.ModuleType(name)
        module.__spec__ = spec
        module.__path__ = list(spec.submodule_search_locations)
        module.__file__ = spec.origin
        module.__package__ = name
        sys.modules[name] = module
