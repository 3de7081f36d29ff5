"""What an operation's handler may use besides its request: the caller's configuration and a gone-check.

Below every handler module and the handler registry (`courier/executor/perform.py`), so that the
registry can import its handlers and the handlers need nothing from it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from courier.paths import HOME_ENV, default_home
from courier.runs.store import Store

if TYPE_CHECKING:  # the receiver does not import the configuration unless it dispatches
    from courier.config import Config
    from courier.config_file import Settings
    from protocol.models import RemoteRequest, RemoteResponse, Result


def never_gone() -> bool:
    return False


class Runs(Protocol):
    """How a handler that waits on runs looks at them: this machine's store (courier/runs/views.py), or
    what an executor over several nodes sees (courier/executor/)."""

    await_poll_s: float  # how often `await` looks again
    watch_poll_s: float  # how often `watch` looks again

    def status(self, agent_id: str) -> Result:
        """The run's Result now."""

    def scan(self) -> dict[str, tuple[Result, float]]:
        """Every readable run: its Result now and its start (Unix time)."""

    def describe(self, response: RemoteResponse) -> None:
        """What `version` adds about where runs live (nothing for this machine's store)."""


@dataclass
class Context:
    """The caller's already-loaded configuration (the CLI; None on the receiver) and a gone-check.

    `in_process` is true when the asker is this very process (the local transport): nothing
    crosses a wire, so the bounds that exist for the wire (diff's 2 MiB patch) do not apply.
    `runs` is set by an executor whose runs live elsewhere (a Ray head); None: this machine's store.
    `fresh_login`: the process has the environment a new login gets now (not a serve session's).
    """

    client_gone: Callable[[], bool] = never_gone
    config: Config | None = None
    in_process: bool = False
    runs: Runs | None = None
    # False in a long-lived serve session, whose environment is the one its login had: a run whose harness
    # is not on that PATH is refused as needing a new login (docs/courier.md, "Environment").
    fresh_login: bool = True


Handler = Callable[["RemoteRequest", "RemoteResponse", Context], None]


# wb.yaml's settings as last read: (path, inode, size, mtime, ctime, the environment they fall back on) -> what it said.
_settings: dict[tuple[str, int, int, int, int, tuple[str | None, ...]], Settings] = {}


def _environment() -> tuple[str | None, ...]:
    """What the settings fall back on where the file names nothing: WB_HOME, WB_PROJECTS_ROOT, HOME."""
    return tuple(os.environ.get(name) for name in (HOME_ENV, "WB_PROJECTS_ROOT", "HOME"))


def configured_settings() -> Settings | None:
    """wb.yaml's settings outside its entries (courier/config_file.py), or None when there is no wb.yaml.

    Read with the same refusals as `load_config`, but without the configuration models
    (their import and builds were most of the 46 ms a wb.yaml added to the receiver,
    docs/benchmarks.md#wbyamls-settings-alone). Read once for as long as the file stays
    the same: a receiver asks two or three times (the executor, the operation's store, the
    reply's home_id), a serve session at every request. Any write, replacement or chmod of
    the file changes its inode, mtime or ctime, and it is read again (as does a change of the
    environment the settings fall back on).
    """
    from courier.config_file import read_settings
    from courier.paths import config_path

    path = config_path()
    if not path.exists():
        return None
    try:
        info = path.stat()
    except OSError:
        return read_settings(path)  # its own message for a file that cannot be read
    key = (str(path), info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns, _environment())
    if key not in _settings:
        _settings.clear()
        _settings[key] = read_settings(path)
    return _settings[key]


# The configuration built from the settings last read (configured_settings keeps them per file version).
_configs: dict[int, tuple[Settings, Config]] = {}


def configured_config() -> Config:
    """`load_config()`, built once per version of wb.yaml in this process: a serve session's dispatches
    read the file again only when it changed (docs/benchmarks.md#dispatch-latency)."""
    from courier.config import config_of, load_config
    from courier.paths import config_path

    settings = configured_settings()
    if settings is None:
        return load_config()  # no file: the built-ins, or WB_CONFIG's refusal
    kept = _configs.get(id(settings))
    if kept is None or kept[0] is not settings:
        _configs.clear()
        kept = _configs[id(settings)] = (settings, config_of(settings, config_path()))
    return kept[1]


def configured_home() -> Path:
    """agents.home as `load_config().home` resolves it: WB_HOME or ~/.wb without a wb.yaml (no yaml at all)."""
    settings = configured_settings()
    return settings.home if settings is not None else default_home()


def store_for(context: Context) -> Store:
    """The run store a handler reads: the caller's configured home, else the one wb.yaml names."""
    # Only dispatch needs the whole configuration (and the harness facts).
    return Store(context.config.home if context.config else configured_home()).ensure()
