"""The channel seam (docs/architecture.md, "Channels"): argv tail, stdin bytes and bounds in; an Outcome out.

A channel is one way of reaching a machine: SSH (`ssh.py`), any local command such as
`docker exec -i box` (`exec.py`), the warm courier's socket (`courier.py`) or, in tests,
the receiver in this process (`inprocess.py`). It only carries bytes: it starts
`<argv tail>` over there, writes stdin, closes it, reads stdout and stderr within their
caps and reports how the command ended. Everything that is the same for every channel
(validating the request, the call's time bound, classifying the exit, finding, decoding
and checking the reply) is `courier.call.caller`'s, once.

`courier.channels.registry.CHANNELS` maps a target's kind (`ssh:` or `exec:` in wb.yaml)
to the channel class that serves it; `channel_for` there is the only place a caller obtains one.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from courier.channels.exits import stderr_excerpt
from courier.errors import RemoteWbMissing, TransportError
from courier.text import sanitize
from protocol import limits


@dataclass
class Outcome:
    """What one remote command produced, within the byte caps."""

    stdout: bytes
    stderr: bytes
    exit_status: int | None
    exit_signal: str | None
    overflow: str | None = None  # "stdout" or "stderr" when that stream passed its cap


@dataclass(frozen=True)
class Bounds:
    """The caps of one call's output (docs/protocol.md, bounds); time is bounded by the caller."""

    stdout_max: int = limits.REPLY_STDOUT_MAX_BYTES
    stderr_max: int = limits.REPLY_STDERR_MAX_BYTES


DEFAULT_BOUNDS = Bounds()


class Channel(ABC):
    """One configured machine's way in: runs `tail` there with `stdin`, returns its Outcome.

    Failures to reach the machine at all are TransportErrors naming it; the command's own
    exit (even 127) is an Outcome for the caller to classify.
    """

    kind: str = ""  # the wb.yaml key of the target: "ssh", "exec"
    target_model: ClassVar[type[Any]]  # the config model of that key (the courier rebuilds targets with it)

    def __init__(self, machine: str, target: Any) -> None:
        self.machine = machine
        self.target = target

    @abstractmethod
    async def run(self, tail: list[str], stdin: bytes, bounds: Bounds = DEFAULT_BOUNDS) -> Outcome:
        """Run `tail` on the machine, feed it `stdin` then EOF, and read both outputs within `bounds`."""

    @property
    def where(self) -> str:
        """How the machine is reached, for messages: `host:port`, `exec "docker"`."""
        return self.machine

    def setting(self, key: str) -> str:
        """The wb.yaml key a remedy names: `session_move.targets.<machine>.<kind>.<key>`."""
        return f"session_move.targets.{self.machine}.{self.target.channel}.{key}"

    async def run_warm(
        self,
        state: WarmState,
        tail: list[str],
        stdin: bytes,
        bounds: Bounds,
        *,
        operation: str,
        max_sessions: int,
        serve_dispatch: bool = True,
    ) -> Outcome:
        """The same run inside the courier, which keeps `state` between calls (pools, serve processes).

        A channel with nothing to keep runs as it would cold. `serve_dispatch`: dispatch and continue may
        take a serve session (`courier.dispatch_over_serve`, docs/courier.md).
        """
        return await self.run(tail, stdin, bounds)

    def machines_row(self) -> dict[str, Any]:
        """The fields of this machine's `wb agent machines` row that say how it is reached (docs/cli.md)."""
        return {"channel": self.kind, "wb_path": self.target.wb_path}

    def resolved_address(self) -> tuple[str, int] | None:
        """(user, port) a connection uses, as the channel's own config resolves them; None when it has none."""
        return None

    def classify_exit(self, outcome: Outcome) -> None:
        """Raise the TransportError an exit without a usable reply means; return when the reply is to be read.

        The default is for a channel whose remote command is wb itself (ssh): 127 is wb missing,
        126 not executable, a signal or any other non-zero status a crash, quoting stderr's end.
        """
        wb = self.target.wb_path or "wb"
        if outcome.exit_status == 127:
            raise RemoteWbMissing(
                f"wb is not installed on {self.machine} (or not on the PATH of a non-interactive shell); "
                f"set {self.setting('wb_path')}"
            )
        if outcome.exit_status == 126:
            raise TransportError(
                f"{self.machine}: {wb} is not executable there (exit 126); "
                f"fix its permissions or set {self.setting('wb_path')}",
                cause="wb not executable",
            )
        if outcome.exit_signal is not None:
            raise TransportError(
                f"{self.machine}: the remote {wb} was killed by signal {sanitize(outcome.exit_signal)[:32]}: "
                f"{stderr_excerpt(outcome.stderr)}",
                cause="remote crashed",
            )
        if outcome.exit_status != 0:
            raise TransportError(
                f"{self.machine}: the remote {wb} exited with status {outcome.exit_status}: "
                f"{stderr_excerpt(outcome.stderr)}",
                cause="remote crashed",
            )

    def spec(self) -> dict[str, Any]:
        """Enough to make the same channel in another process (the courier): JSON-able."""
        return {"kind": self.kind, "machine": self.machine, "target": self.target.model_dump(mode="json")}

    def restore(self, spec: dict[str, Any]) -> None:
        """Take back what `spec` added beyond the target (the courier's side); nothing by default."""
        del spec


class WarmPart(Protocol):
    """What one channel kind keeps in the courier: `wb courier status` rows, closed at the end."""

    def describe(self) -> list[dict[str, Any]]: ...

    async def close(self) -> None: ...


class WarmState:
    """The courier's state between calls, one part per channel kind (the ssh pool, the exec serve processes)."""

    def __init__(self) -> None:
        self.parts: dict[str, WarmPart] = {}

    def part(self, kind: str, make: Callable[[], WarmPart]) -> WarmPart:
        found = self.parts.get(kind)
        if found is None:
            found = self.parts[kind] = make()
        return found

    def describe(self) -> list[dict[str, Any]]:
        rows = [row for part in self.parts.values() for row in part.describe()]
        return sorted(rows, key=lambda row: str(row.get("machine")))

    async def close(self) -> None:
        for part in self.parts.values():
            with contextlib.suppress(Exception):
                await part.close()
