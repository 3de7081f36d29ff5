"""The owner launcher (docs/runs.md#the-owner): a process that has imported what an owner needs and starts
each owner as a copy of itself, for a dispatcher that runs other threads and so cannot be copied.

A serve session answers each request on a thread of its own, and a Ray worker runs Ray's threads:
copying such a process could copy a lock another thread holds. So it keeps one launcher,
`wb --wb-internal-owner-launcher`, started as a new interpreter (nothing of the dispatcher's is
copied), with the dispatcher's environment; the launcher runs one thread only, imports the owner
and every harness module once, then, for each run directory it reads on stdin (NUL-terminated),
starts that run's owner with `process.fork_detached` and answers `ok` or why not. It ends when
its stdin closes: with the process that started it. Where the launcher is gone or cannot be
started, the owner is started as a new interpreter, as before.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from protocol import limits
from protocol.entry import LAUNCHER_ARGUMENT

_OK = b"ok"
_END = b"\0"


class LauncherGone(OSError):
    """The launcher cannot start this owner (it ended, or never started): start it another way."""


class Launcher:
    """This process's launcher, started when first needed (or at once with `start`); one launch at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._child: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the launcher now, so its imports are done before the first dispatch needs it."""
        with self._lock:
            self._ensure()

    def _ensure(self) -> subprocess.Popen[bytes]:
        if self._child is None or self._child.poll() is not None:
            self._child = subprocess.Popen(
                [sys.executable, "-m", "courier.main", LAUNCHER_ARGUMENT],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                close_fds=True,
            )
        return self._child

    def launch(self, run_dir: Path) -> None:
        """Have the launcher start the owner of `run_dir`; LauncherGone when it cannot."""
        with self._lock:
            try:
                child = self._ensure()
                assert child.stdin is not None and child.stdout is not None
                child.stdin.write(os.fsencode(run_dir) + _END)
                child.stdin.flush()
                answer = _read_to_end(child.stdout.fileno())
            except OSError as exc:
                raise LauncherGone(f"the owner launcher is gone: {exc}") from None
        if answer != _OK:
            raise LauncherGone(answer.decode("utf-8", "replace") or "the owner launcher ended")


def _read_to_end(fd: int) -> bytes:
    answer = b""
    while not answer.endswith(_END):
        chunk = os.read(fd, 1)
        if not chunk:
            return answer
        answer += chunk
    return answer[:-1]


def serve_launches(argv: list[str]) -> int:
    """`wb --wb-internal-owner-launcher`: start an owner for each run directory on stdin, until it closes."""
    del argv
    from courier import deferred_models, no_plugins

    no_plugins.install()
    import courier.runs.owner  # noqa: F401 - what every owner copied from here has loaded already
    from courier.runs import process
    from courier.runs.harness import REGISTRY, harness_for

    for name in REGISTRY:
        harness_for(name)
    deferred_models.build_all()  # the models an owner meets, built once here rather than in each copy
    pending = b""
    while True:
        chunk = os.read(0, limits.READ_CHUNK_BYTES)
        if not chunk:
            return 0
        pending += chunk
        while _END in pending:
            path, _, pending = pending.partition(_END)
            owner_args = ["--run-dir", os.fsdecode(path)]
            try:
                title = f"wb owner --run-dir {owner_args[1]}"
                process.fork_detached(lambda: owner_here(owner_args), title=title)  # noqa: B023 - called at once
                answer = _OK
            except OSError as exc:
                answer = str(exc).encode("utf-8", "replace") or b"fork failed"
            os.write(1, answer + _END)


def owner_here(argv: list[str]) -> int:
    """The owner's entry in a copy of the process that starts it (courier/main.py's, without a new interpreter)."""
    from courier import no_plugins
    from courier.stage_trace import mark

    mark("main.owner")
    no_plugins.install()
    from courier.runs.owner import owner_main

    return owner_main(argv)


_launcher = Launcher()


def process_launcher() -> Launcher:
    """The one launcher of this process."""
    return _launcher
