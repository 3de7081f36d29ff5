"""The CLI's way out: stdout rows, `warning:`/`error:` lines and the exit code of a WbError.

Shared by the typer commands (courier/cli.py) and the typer-free hot path (courier/hot.py), so
both write every byte and choose every exit code the same way. Imports no typer.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

from courier.errors import Interrupted, WbError
from courier.text import sanitize
from protocol import limits


def out(text: str) -> None:
    # EPIPE is handled here, before click's own handler turns it into exit 1.
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        broken_pipe()


def out_lines(lines: list[str]) -> None:
    """Write row by row, so a reader that stops early (`| head -1`) is noticed promptly."""
    try:
        for line in lines:
            sys.stdout.write(line)
        sys.stdout.flush()
    except BrokenPipeError:
        broken_pipe()


def warn(message: str) -> None:
    # Messages quote foreign text (a peer's warnings and failures): one sanitiser on the way out.
    sys.stderr.write(f"warning: {sanitize(message, keep_newlines=True)}\n")


def error(message: str) -> None:
    sys.stderr.write(f"error: {sanitize(message, keep_newlines=True)}\n")


def broken_pipe() -> NoReturn:
    # Point stdout at /dev/null so the interpreter's final flush cannot raise again.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os._exit(limits.EXIT_STDOUT_CLOSED)


def report(exc: WbError) -> int:
    """Print a command's WbError as docs/cli.md says and return its exit code."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        broken_pipe()
    if isinstance(exc, Interrupted):  # a hint, not an error: printed exactly, without the prefix
        # (docs/cli.md#conventions-shared-by-every-command)
        sys.stderr.write(f"{exc.message}\n")
    else:
        error(exc.message)
    return exc.exit_code
