"""Stage marks for the dispatch-latency benchmark (docs/benchmarks.md#dispatch-latency): nothing when off.

`mark(name)` appends one line, `<name> <pid> <CLOCK_MONOTONIC ns>`, to the file that
`WB_STAGE_TRACE` names, in one O_APPEND write, so the marks of every process of one run
(the CLI, the courier's child, a receiver, the owner) land in one file in the order they
happened; CLOCK_MONOTONIC is one clock for every process of a machine. Without the variable
a mark is one comparison. The variable is read once, at import; a courier's child, which
takes its caller's environment after the courier imported this, reads it again
(`from_environment`). Imports nothing the interpreter has not loaded already: the thin
client, the receiver and the CLI's start import it (tests/integration/test_*_is_light.py).
The owner inherits the variable (docs/runs.md#the-owner); the worker never gets it, its
environment being an allowlist (docs/runs.md#environment-and-credentials).
"""

from __future__ import annotations

import os
import time

ENV = "WB_STAGE_TRACE"

_path: str | None = os.environ.get(ENV) or None


def from_environment() -> None:
    """Read the variable again: this process took another environment (a courier's child)."""
    global _path
    _path = os.environ.get(ENV) or None


def mark(name: str) -> None:
    """Append `name`, this process and the monotonic time to the trace, when there is one; never raises."""
    if _path is None:
        return
    line = f"{name} {os.getpid()} {time.clock_gettime_ns(time.CLOCK_MONOTONIC)}\n".encode()
    try:
        fd = os.open(_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return  # a trace is for a benchmark: it never makes wb fail
    try:
        os.write(fd, line)
    except OSError:
        pass
    finally:
        os.close(fd)
