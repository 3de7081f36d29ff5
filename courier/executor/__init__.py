"""Executors: where a machine's runs start. The default is this machine; `agents.executor.ray` is a Ray cluster.

On a machine whose wb.yaml names `agents.executor.ray`, every run operation is answered for
the whole cluster by `ray_head.py` (docs/ray.md). Only the `ray_*.py` modules import Ray (the
optional extra `wb[ray]`); this module decides, without Ray, whether they are needed, and
refuses (exit 2) naming the extra when Ray is not installed.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from courier.errors import UsageError

if TYPE_CHECKING:
    from courier.runs.context import Context, Handler

# What the head answers for the cluster (every run operation, watch included).
CLUSTER_OPERATIONS = frozenset(
    {"dispatch", "status", "await", "list", "logs", "stop", "continue", "diff", "prune", "version", "watch"}
)
EXTRA = "wb[ray]"


def cluster_handler(operation: str, context: Context) -> Handler | None:
    """The Ray head's handler of `operation` when this machine's wb.yaml names agents.executor.ray, else None.

    Reads wb.yaml only when it exists (the receiver's hot path), and then only its settings
    (`configured_settings`); the whole configuration is loaded, and kept in `context` for the
    handler, only on a Ray head.
    """
    if operation not in CLUSTER_OPERATIONS:
        return None
    if context.config is None:
        from courier.runs.context import configured_settings

        try:
            settings = configured_settings()  # the file's settings alone: no configuration models
        except UsageError:
            if operation == "version":  # `machines --check` still reaches a machine whose wb.yaml is broken
                return None
            raise
        if settings is None or settings.ray_address is None:
            return None
        from courier.config import load_config

        context.config = load_config()
    if context.config.ray_address is None:
        return None
    if importlib.util.find_spec("ray") is None:
        raise UsageError(
            f"{context.config.path}: agents.executor.ray needs the optional extra {EXTRA} "
            f"(Ray 2.60): install it with pip install '{EXTRA}' in wb's environment"
        )
    from courier.executor import ray_head

    return ray_head.HANDLERS[operation]
