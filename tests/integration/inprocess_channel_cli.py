"""`python -m tests.integration.inprocess_channel_cli ARGS…`: wb's CLI with every machine reached in-process.

The `inprocess-channel` tier of tests/ssh_tiers.py. The CLI suite runs `wb` as a subprocess, so
the in-process channel (tests/inprocess_channel.py, a receiver in the calling process) can
only carry it from inside that subprocess: this launcher installs it through
`courier.channels.registry.overridden`, the tests' hook, and then runs the CLI as `wb` would
(cold: the courier rebuilds channels from their kind and has no in-process one). Nothing in
the product selects this channel; only a test that starts this module gets it.

Each machine's target is the exec target of the `exec-env` tier (`env -i -C HOME K=V … `): its
K=V words are the machine's environment, which the receiver runs under for each call (WB_HOME,
WB_CONFIG, WB_PROJECTS_ROOT, PATH, HOME) and its home is the working directory, as in its
sshd session. `wb_path` is not run: there is no command on this channel.

The fleet suite's broken machines have an in-process form here too (`InProcessChannelFactory`):
- a machine that is gone (its home removed, `ExecEnvMachine.stop`) answers as the `env -C` of
  its argv does, exit 125 and env's complaint, as `docker exec` into a stopped container fails;
- a machine that never answers is one whose argv carries `WB_TEST_ANSWER_DELAY_S=N`: its
  receiver holds the answer N seconds (an asyncio sleep, so the call's bound ends it), as a
  peer whose wb reads the request and stalls.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from courier.channels.channel import DEFAULT_BOUNDS, Bounds, Outcome
from courier.config import AnyTarget
from tests.inprocess_channel import InProcessChannel
from tests.integration.exec_machines import ExecEnvFactory, ExecEnvMachine

_MACHINE = threading.Lock()  # os.environ and the working directory are the process's: one call at a time
ANSWER_DELAY = "WB_TEST_ANSWER_DELAY_S"  # an argv word of this tier only: the receiver holds its answer
SILENT_S = 3600  # longer than any call's bound in the suites
ENV_CANNOT_ENTER = 125  # what `env -C DIR` exits with when DIR cannot be entered (coreutils)


class MachineChannel(InProcessChannel):
    """The in-process receiver under one machine's whole environment (not only its WB_HOME)."""

    def __init__(self, machine: str, target: AnyTarget) -> None:
        argv = list(getattr(target, "argv", []))
        self.environment = dict(word.split("=", 1) for word in argv if "=" in word)
        self.answer_delay_s = float(self.environment.pop(ANSWER_DELAY, "0"))
        super().__init__(machine, target, Path(self.environment["WB_HOME"]))
        self.cwd = argv[argv.index("-C") + 1] if "-C" in argv else None

    async def run(self, tail: list[str], stdin: bytes, bounds: Bounds = DEFAULT_BOUNDS) -> Outcome:
        if self.answer_delay_s:
            await asyncio.sleep(self.answer_delay_s)  # cancelled by the call's bound, as a stalled peer is dropped
        return await super().run(tail, stdin, bounds)

    def _answer(self, tail: list[str], stdin: bytes) -> Outcome:
        if self.cwd is not None and not os.path.isdir(self.cwd):
            # The machine is gone: `env -C HOME` cannot enter its home, and says so (as over exec-env).
            message = f"env: cannot change directory to '{self.cwd}': No such file or directory\n"
            return Outcome(b"", message.encode(), ENV_CANNOT_ENTER, None)
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


@dataclass
class InProcessChannelFactory(ExecEnvFactory):
    """The exec-env machines, reached by `MachineChannel` (the `inprocess-channel` tier of tests/ssh_tiers.py)."""

    def silent_target(self, server: ExecEnvMachine) -> dict[str, Any]:
        """The target of a machine that takes the request and never answers."""
        return {"exec": {"argv": [*server.argv(), f"{ANSWER_DELAY}={SILENT_S}"]}}


def main() -> int:
    from courier.channels.registry import overridden
    from courier.cli import run

    with overridden(MachineChannel):
        return run(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
