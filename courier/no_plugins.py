"""Define wb's pydantic models without pydantic's plugin machinery (the CLI, the courier, the receiver).

Creating the first model asks `pydantic.plugin._loader.get_plugins()`, whose module imports
importlib.metadata (≈ 15 ms of a cold command: email, zipfile, csv, …) and scans every
installed distribution's entry points. wb has no pydantic plugin and each of those is its own
process, so it installs a loader that finds none: what pydantic does with
PYDANTIC_DISABLE_PLUGINS=__all__, without the import. A value the user set that names
particular plugins is left to pydantic.
"""

from __future__ import annotations

import os
import sys
import types

_PLUGINS_ENV = "PYDANTIC_DISABLE_PLUGINS"
_LOADER = "pydantic.plugin._loader"


def _no_plugins() -> tuple[()]:
    return ()


def install() -> None:
    if os.environ.get(_PLUGINS_ENV) in (None, "__all__", "1", "true") and _LOADER not in sys.modules:
        loader = types.ModuleType(_LOADER)
        loader.get_plugins = _no_plugins  # type: ignore[attr-defined]
        sys.modules[_LOADER] = loader
