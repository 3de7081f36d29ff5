"""The in-process channel (tests): the receiver answers in this process, no SSH, no child, no root.

`InProcessChannel(machine, target, home)` plays a machine whose WB_HOME is `home`: it runs
`courier.receiver.serve.answer` on the request bytes in a worker thread (with WB_HOME set to
`home` for the span) and hands the reply back as the Outcome a real receiver would have
produced (exit 0, one document on stdout). The caller above it is the same code as for
every other channel, so a test through it checks the caller's logic: validation, the reply
checks, the classification of what `respond` returns instead.

`respond`, when given, replaces the receiver: it receives (tail, stdin) and returns the
Outcome, for tests of exits, caps and hostile replies.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from pathlib import Path

from courier.channels.channel import DEFAULT_BOUNDS, Bounds, Channel, Outcome
from courier.channels.registry import direct_channel
from courier.config import AnyTarget
from courier.paths import HOME_ENV
from protocol.entry import REMOTE_ARGUMENT

Responder = Callable[[list[str], bytes], Outcome]
_ENVIRONMENT = threading.Lock()  # WB_HOME is process-wide: one in-process receiver at a time


class InProcessChannel(Channel):
    kind = "inprocess"

    def __init__(self, machine: str, target: AnyTarget, home: Path, respond: Responder | None = None) -> None:
        super().__init__(machine, target)
        self.home = home
        self.respond = respond
        self.calls: list[list[str]] = []

    @property
    def where(self) -> str:
        return f"in-process {self.home}"

    def classify_exit(self, outcome: Outcome) -> None:
        # The exit rules of the kind the target names: the tests stand in for that channel's bytes.
        direct_channel(self.machine, self.target).classify_exit(outcome)

    async def run(self, tail: list[str], stdin: bytes, bounds: Bounds = DEFAULT_BOUNDS) -> Outcome:
        self.calls.append(list(tail))
        outcome = await asyncio.to_thread(self._answer, tail, stdin)
        for name, cap in (("stdout", bounds.stdout_max), ("stderr", bounds.stderr_max)):
            if len(getattr(outcome, name)) > cap:
                return Outcome(outcome.stdout[:cap], outcome.stderr[:cap], None, None, overflow=name)
        return outcome

    def _answer(self, tail: list[str], stdin: bytes) -> Outcome:
        if self.respond is not None:
            return self.respond(tail, stdin)
        if tail[-1:] != [REMOTE_ARGUMENT]:
            return Outcome(b"", f"wb: no such option: {tail[-1:]}\n".encode(), 2, None)
        from courier.receiver.serve import _import_models, answer, internal_failure
        from protocol import limits

        _import_models()
        with _ENVIRONMENT:
            previous = os.environ.get(HOME_ENV)
            os.environ[HOME_ENV] = str(self.home)
            try:
                response = answer(stdin, len(stdin) > limits.REQUEST_MAX_BYTES, lambda: False)
                from courier.receiver.serve import _home_id

                response.home_id = _home_id()
                body = response.encode()
            except Exception as exc:  # as the receiver: one document, never a traceback
                body = internal_failure(exc)
            finally:
                if previous is None:
                    os.environ.pop(HOME_ENV, None)
                else:
                    os.environ[HOME_ENV] = previous
        return Outcome(stdout=body, stderr=b"", exit_status=0, exit_signal=None)
