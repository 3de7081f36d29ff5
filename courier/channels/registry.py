"""The channel registry: which channel serves a target's kind, and the one place a caller obtains a channel.

Adding a way of reaching machines is one channel module, one line in `CHANNELS` and its
config model (`courier.config`, `session_move.targets.NAME.<kind>`). The implementations
are imported when first used, so a command that reaches only exec machines never pays
for asyncssh's import.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from courier.channels.channel import Channel

if TYPE_CHECKING:
    from courier.config import AnyTarget, Config


def _ssh() -> type[Channel]:
    from courier.channels.ssh import SshChannel

    return SshChannel


def _exec() -> type[Channel]:
    from courier.channels.exec import ExecChannel

    return ExecChannel


CHANNELS: dict[str, Callable[[], type[Channel]]] = {
    "ssh": _ssh,
    "exec": _exec,
}


def direct_channel(machine: str, target: AnyTarget) -> Channel:
    """The channel a target's own kind names (no courier in between)."""
    return CHANNELS[target.channel]()(machine, target)


def from_spec(spec: dict[str, Any]) -> Channel:
    """The channel `Channel.spec()` described (the courier's side of `courier.channels.courier`)."""
    cls = CHANNELS[str(spec["kind"])]()
    channel = cls(str(spec["machine"]), cls.target_model.model_validate(spec["target"]))
    channel.restore(spec)
    return channel


Wrapper = Callable[["Config", Channel], Channel]
_wrapper: Wrapper | None = None
_override: Callable[[str, AnyTarget], Channel] | None = None


def channel_for(config: Config, machine: str) -> Channel:
    """The channel to a configured machine; an unknown or misconfigured machine is a usage error."""
    target = config.target(machine)
    channel = _override(machine, target) if _override is not None else direct_channel(machine, target)
    return _wrapper(config, channel) if _wrapper is not None else channel


def carry_through(wrapper: Wrapper | None) -> None:
    """From now on every channel is wrapped by `wrapper` (a command the courier runs: its socket)."""
    global _wrapper
    _wrapper = wrapper


@contextlib.contextmanager
def overridden(factory: Callable[[str, AnyTarget], Channel]) -> Iterator[None]:
    """Reach every machine with `factory(machine, target)` for the span (tests: the in-process channel)."""
    global _override
    previous, _override = _override, factory
    try:
        yield
    finally:
        _override = previous
