"""Build, once, the model schemas a cold process defers to first use (protocol/models.py, courier/config.py).

A process that others are copied from (the courier, an owner launcher) builds them all before its
first copy, so no copy builds one: each owner would otherwise build those it meets on a run's way
(the sandbox's, the change summary's, a provider's), about 1.6 ms of CPU each
(docs/benchmarks.md#dispatch-latency).
"""

from __future__ import annotations

import contextlib


def build_all() -> None:
    """Build every model class loaded now whose schema is still deferred."""
    from pydantic import BaseModel

    pending = list(BaseModel.__subclasses__())
    while pending:
        model = pending.pop()
        pending.extend(model.__subclasses__())
        if not model.__pydantic_complete__ or type(model.__pydantic_validator__).__name__ == "MockValSer":
            with contextlib.suppress(Exception):  # one that cannot build now builds on first use, as cold
                model.model_rebuild(force=True)
