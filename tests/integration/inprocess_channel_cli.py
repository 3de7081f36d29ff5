"""`python -m tests.integration.inprocess_channel_cli ARGS…`: wb's CLI with every machine reached in-process.

The `inprocess-channel` tier of tests/ssh_tiers.py. The CLI suite runs `wb` as a subprocess, so
the in-process channel (courier/channels/inprocess.py, a receiver in the calling process) can
only carry it from inside that subprocess: this launcher installs it through
`courier.channels.registry.overridden`, the tests' hook, and then runs the CLI as `wb` would
(cold: the courier rebuilds channels from their kind and has no in-process one). Nothing in
the product selects this channel; only a test that starts this module gets it.

Each machine's target is the exec target of the `exec-env` tier (`env -i -C HOME K=V … `): its
K=V words are the machine's environment, which the receiver runs under for each call (WB_HOME,
WB_CONFIG, WB_PROJECTS_ROOT, PATH, HOME) and its home is the working directory, as in its
sshd session. `wb_path` is not run: there is no command on this channel.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

from courier.channels.base import Outcome
from courier.channels.inprocess import InProcessChannel
from courier.config import AnyTarget

_MACHINE = threading.Lock()  # os.environ and the working directory are the process's: one call at a time


class MachineChannel(InProcessChannel):
    """The in-process receiver under one machine's whole environment (not only its WB_HOME)."""

    def __init__(self, machine: str, target: AnyTarget) -> None:
        argv = list(getattr(target, "argv", []))
        self.environment = dict(word.split("=", 1) for word in argv if "=" in word)
        super().__init__(machine, target, Path(self.environment["WB_HOME"]))
        self.cwd = argv[argv.index("-C") + 1] if "-C" in argv else None

    def _answer(self, tail: list[str], stdin: bytes) -> Outcome:
        with _MACHINE:
            saved, cwd = dict(os.environ), os.getcwd()
            os.environ.clear()
            os.environ.update(self.environment)
            if self.cwd is not None:
                os.chdir(self.cwd)
            try:
                return super()._answer(tail, stdin)
            finally:
                os.chdir(cwd)
                os.environ.clear()
                os.environ.update(saved)


def main() -> int:
    from courier.channels.registry import overridden
    from courier.cli import run

    with overridden(MachineChannel):
        return run(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
