"""wb.yaml as a file (docs/config.md): its checks, its YAML and the settings outside the entries.

The only module that imports yaml. Everything that goes wrong here refuses the whole file
(permissions, YAML syntax, duplicate keys, a section that is not a mapping, a bad path,
courier or executor setting). The entries (providers, profiles, machines) are
courier/config.py's: pydantic models, each problem kept with its entry, never a refusal.
So `read_settings` refuses exactly what `load_config` refuses, and the receiver, which needs
only `agents.home`, reads it here without the configuration models
(docs/benchmarks.md#wbyamls-settings-alone).
"""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from courier import config_cache
from courier.errors import UsageError
from courier.paths import HOME_ENV
from protocol import limits

if TYPE_CHECKING:
    from collections.abc import Callable

    import yaml

T = TypeVar("T")

# yaml is imported when a wb.yaml is parsed, not with this module: a machine without one, and a
# command that finds the parsed copy of an unchanged file (courier/config_cache.py), never pays for it.


@dataclass
class Settings:
    """What wb.yaml says outside its entries, and the entries' sections as read (mappings, unchecked)."""

    home: Path
    projects_root: Path
    courier_idle_ms: int = limits.COURIER_IDLE_DEFAULT_MS
    courier_max_sessions: int = limits.COURIER_MAX_SESSIONS_DEFAULT
    courier_dispatch_over_serve: bool = True
    executor: str | None = None  # agents.executor.<NAME>: where runs live (None: this machine; courier/executor/)
    ray_address: str | None = None  # agents.executor.ray.address (docs/ray.md)
    providers: dict[str, Any] = field(default_factory=dict)
    profiles: dict[str, Any] = field(default_factory=dict)
    targets: dict[str, Any] = field(default_factory=dict)
    # The top-level `sandbox:` section (docs/config.md#sandbox): every profile's default on this machine.
    sandbox_default: str = "auto"
    sandbox_writable: tuple[str, ...] = ()


# The keys wb reads outside the entries, by section (docs/config.md). Any other top-level section, and
# any other key of these sections, is ignored by every command and reported by `wb config check`;
# sandbox's and agents.executor's own keys are checked strictly where they are read.
KNOWN_KEYS: dict[str, tuple[str, ...]] = {
    "agents": ("home", "projects_root", "providers", "profiles", "executor"),
    "session_move": ("targets",),
    "courier": ("idle", "max_sessions_per_machine", "dispatch_over_serve"),
    "sandbox": ("default", "writable"),
}


def read_settings(path: Path) -> Settings:
    """The file at `path` checked and read (an absent file: the built-ins); every refusal is a UsageError."""
    return settings_of(read_document(path), path)


# What Path.exists() reads as "no file" (the built-ins apply), as before the parsed copy.
_ABSENT = (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP)


def read_document(path: Path, *, use_copy: bool = True) -> dict[str, Any]:
    """The file at `path` as YAML, its permissions and form checked ({} when absent); else UsageError.

    `use_copy`: read and keep the parsed copy of an unchanged file (courier/config_cache.py); `wb config check`
    parses the file itself and creates nothing."""
    try:
        info = path.stat()
    except OSError as exc:
        if exc.errno in _ABSENT:
            return {}
        raise UsageError(f"{path}: cannot read: {exc.strerror}") from None
    _check_file_permissions(path)
    kept = config_cache.read_copy(path, info) if use_copy else None
    if kept is not None:
        return kept
    import yaml

    try:
        with open(path, "rb") as handle:
            document: Any = yaml.load(handle, Loader=_unique_key_loader()) or {}
    except yaml.YAMLError as exc:
        raise UsageError(f"{path}: {_yaml_problem(exc)}") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror}") from None
    if not isinstance(document, dict):
        raise UsageError(f"{path}: the top level must be a mapping")
    if use_copy:
        config_cache.keep_copy(path, info, document)
    found: dict[str, Any] = document
    return found


def settings_of(document: dict[str, Any], path: Path, problems: list[UsageError] | None = None) -> Settings:
    """The settings of a read document. Each refusal is raised, or with `problems` kept there while the
    rest is still read with its defaults (`wb config check` names every problem in one pass)."""

    def kept(read: Callable[[], T], default: T) -> T:
        if problems is None:
            return read()
        try:
            return read()
        except UsageError as exc:
            problems.append(exc)
            return default

    agents = kept(lambda: _section(document, "agents", path), _empty())
    session_move = kept(lambda: _section(document, "session_move", path), _empty())
    home = kept(lambda: _path_setting(agents, "home", HOME_ENV, Path.home() / ".wb", path), Path.home() / ".wb")
    projects = Path.home() / "projects"
    settings = Settings(
        home=home,
        projects_root=kept(
            lambda: _path_setting(agents, "projects_root", "WB_PROJECTS_ROOT", projects, path), projects
        ),
        providers=kept(lambda: _section(agents, "providers", path, "agents."), _empty()),
        profiles=kept(lambda: _section(agents, "profiles", path, "agents."), _empty()),
        targets=kept(lambda: _section(session_move, "targets", path, "session_move."), _empty()),
    )
    courier = kept(lambda: _section(document, "courier", path), _empty())
    settings.courier_idle_ms, settings.courier_max_sessions = kept(
        lambda: _courier_settings(courier, path), (settings.courier_idle_ms, settings.courier_max_sessions)
    )
    over_serve = kept(lambda: _flag(courier, "dispatch_over_serve", path, "courier.", True), True)
    settings.courier_dispatch_over_serve = over_serve
    executor = kept(lambda: _section(agents, "executor", path, "agents."), _empty())
    settings.ray_address = kept(lambda: _executor(executor, path), None)
    settings.executor = "ray" if settings.ray_address is not None else None
    sandbox = kept(lambda: _section(document, "sandbox", path), _empty())
    settings.sandbox_default, settings.sandbox_writable = kept(
        lambda: _sandbox(sandbox, path), (settings.sandbox_default, settings.sandbox_writable)
    )
    return settings


def _empty() -> dict[str, Any]:
    return {}


SANDBOX_MODES = ("auto", "required", "off")


def check_writable_paths(value: Any, where: str) -> tuple[str, ...]:
    """Absolute, clean paths (`sandbox.writable`, a profile's `sandbox_writable`); else ValueError with the rule."""
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError(f"{where}: must be a list of absolute paths")
    for item in value:
        if not item.startswith("/") or os.path.normpath(item) != item or "\x00" in item or item == "/":
            raise ValueError(f"{where}: {item[:80]!r} must be an absolute, clean path other than /")
    return tuple(value)


def _sandbox(section: dict[str, Any], path: Path) -> tuple[str, tuple[str, ...]]:
    """`sandbox.default` (auto | required | off) and `sandbox.writable` (docs/config.md#sandbox)."""
    unknown = sorted(set(section) - {"default", "writable"})
    if unknown:
        raise UsageError(f"{path}: sandbox.{unknown[0]}: unknown key (the keys are default and writable)")
    default = section.get("default", "auto")
    if default is False:  # YAML reads a bare `off` as false
        default = "off"
    if default not in SANDBOX_MODES:
        raise UsageError(f"{path}: sandbox.default: must be auto, required or off")
    try:
        writable = check_writable_paths(section.get("writable") or [], "sandbox.writable")
    except ValueError as exc:
        raise UsageError(f"{path}: {exc}") from None
    return str(default), writable


_loader_class: type | None = None


def _unique_key_loader() -> type[yaml.SafeLoader]:
    """SafeLoader that refuses duplicate mapping keys instead of keeping the last one (built on first use)."""
    global _loader_class
    if _loader_class is None:
        import yaml

        class _UniqueKeyLoader(yaml.SafeLoader):
            pass

        _UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
        _loader_class = _UniqueKeyLoader
    return _loader_class


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    import yaml

    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    loader.flatten_mapping(node)
    return dict(loader.construct_pairs(node, deep=deep))


def _check_file_permissions(path: Path) -> None:
    uid = os.getuid()
    for item in (path, path.parent):
        info = item.stat()
        if info.st_uid != uid:
            raise UsageError(f"{item}: refused: not owned by you (uid {uid}); chown it or use another file")
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise UsageError(f"{item}: refused: writable by group or others; run chmod go-w {item}")


def _executor(section: dict[str, Any], path: Path) -> str | None:
    """`agents.executor.ray.address` (default `auto`), or None when runs start on this machine (docs/ray.md)."""
    unknown = sorted(set(section) - {"ray"})
    if unknown:
        raise UsageError(f"{path}: agents.executor.{unknown[0]}: unknown executor (the one executor is ray)")
    if "ray" not in section:
        return None
    ray = section["ray"] if section["ray"] is not None else {}
    if not isinstance(ray, dict):
        raise UsageError(f"{path}: agents.executor.ray: must be a mapping (address: auto or HOST:PORT)")
    extra = sorted(set(ray) - {"address"})
    if extra:
        raise UsageError(f"{path}: agents.executor.ray.{extra[0]}: unknown key (the one key is address)")
    address = ray.get("address", "auto")
    if not isinstance(address, str) or not re.fullmatch(r"auto|[A-Za-z0-9][A-Za-z0-9.-]{0,252}:[0-9]{1,5}", address):
        raise UsageError(f'{path}: agents.executor.ray.address: must be "auto" or HOST:PORT')
    return address


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's several-line report as one line: where (1-based line and column), then what."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
    context = getattr(exc, "context", None)
    if context:
        problem = f"{problem} ({' '.join(str(context).split())})"
    if mark is None:
        return f"invalid YAML: {problem}"
    return f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: {problem}"


def _courier_settings(section: dict[str, Any], path: Path) -> tuple[int, int]:
    """`courier.idle` (a duration > 0) and `courier.max_sessions_per_machine` (docs/courier.md)."""
    idle_ms = limits.COURIER_IDLE_DEFAULT_MS
    idle = section.get("idle")
    if idle is not None:
        from protocol.durations import BadDuration, parse_duration_ms

        try:
            idle_ms = parse_duration_ms(idle) if isinstance(idle, str) else -1
        except BadDuration as exc:
            raise UsageError(f"{path}: courier.idle: {exc}") from None
        if idle_ms <= 0:
            raise UsageError(f'{path}: courier.idle: must be a duration string above 0, such as "10m"')
    sessions = section.get("max_sessions_per_machine")
    if sessions is None:
        return idle_ms, limits.COURIER_MAX_SESSIONS_DEFAULT
    if isinstance(sessions, bool) or not isinstance(sessions, int):
        raise UsageError(f"{path}: courier.max_sessions_per_machine: must be an integer")
    if not 1 <= sessions <= limits.COURIER_MAX_SESSIONS_MAX:
        raise UsageError(
            f"{path}: courier.max_sessions_per_machine: must be from 1 to {limits.COURIER_MAX_SESSIONS_MAX}"
        )
    return idle_ms, sessions


def _flag(section: dict[str, Any], key: str, path: Path, prefix: str, default: bool) -> bool:
    """A true/false setting (absent: `default`)."""
    value = section.get(key, default)
    if not isinstance(value, bool):
        raise UsageError(f"{path}: {prefix}{key}: must be true or false")
    return value


def _section(parent: dict[str, Any], key: str, path: Path, prefix: str = "") -> dict[str, Any]:
    value = parent.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UsageError(f"{path}: {prefix}{key}: must be a mapping")
    return value


def _path_setting(agents: dict[str, Any], key: str, env: str, default: Path, path: Path) -> Path:
    value = agents.get(key)
    if value is not None:
        if not isinstance(value, str) or not value.strip():
            raise UsageError(f"{path}: agents.{key}: must be a path string")
        return Path(os.path.expanduser(value))
    from_env = os.environ.get(env)
    return Path(os.path.expanduser(from_env)) if from_env else default
