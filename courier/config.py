"""wb.yaml → providers, profiles and machines (docs/config.md).

A problem in one provider, profile or machine makes only that entry unusable: it is kept
as a `Problem` and reported by the commands that use it. Problems with the file itself
(permissions, YAML syntax, duplicate keys) refuse the whole file: those are read and
checked in courier/config_file.py, the one module that imports yaml.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from courier.config_file import Settings, read_settings
from courier.errors import UsageError
from courier.paths import config_path
from protocol import limits
from protocol.durations import default_duration
from protocol.models import ProviderApi
from protocol.refs import BadName, check_machine_name

# config_path lives in courier.paths and is re-exported here.

ALLOWLISTED_ENV = (
    "PATH", "HOME", "TMPDIR", "TMP", "TEMP", "LANG", "LC_ALL", "LC_CTYPE", "TZ",
    "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME", "XDG_DATA_HOME",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "NODE_EXTRA_CA_CERTS",
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY",
    "http_proxy", "https_proxy", "no_proxy", "all_proxy",
)  # fmt: skip

_PROVIDER_NAME = re.compile(r"[a-z0-9_-]{1,32}")
_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]{0,63}")
_IDENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/+-]{0,127}")
_SECRET_WORDS = ("token", "secret", "password")
_SECRET_PREFIXES = (
    "sk-", "sk_", "ghp_", "gho_", "github_pat_", "glpat-", "xoxb-", "xoxp-",
    "akia", "aiza", "hf_", "npm_", "pypi-", "eyj", "bearer",
)  # fmt: skip
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_PATH_SEGMENT = re.compile(r"[A-Za-z0-9._+-]+")
_NETWORK_HOST = re.compile(r"[A-Za-z0-9*][A-Za-z0-9.*-]{0,252}(:[0-9]{1,5})?")


def check_identifier(value: str, what: str) -> str:
    """Model and reasoning names: non-secret identifiers (docs/config.md)."""
    lowered = value.lower()
    if (
        not _IDENT.fullmatch(value)
        or any(ch in value for ch in "@=?#")
        or any(word in lowered for word in _SECRET_WORDS)
        or lowered.startswith(_SECRET_PREFIXES)
    ):
        raise ValueError(
            f"{what} must be a non-secret identifier (letters, digits and . _ : / + -, "
            "no @ = ? #, nothing that looks like a credential)"
        )
    return value


def check_base_url(url: str) -> str:
    if not url.isascii() or len(url.encode()) > limits.PROVIDER_ROUTING_MAX_CHARS:
        raise ValueError(f"base_url must be ASCII and at most {limits.PROVIDER_ROUTING_MAX_CHARS} bytes")
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise ValueError("base_url must not carry userinfo (put the credential in credential_env/credential_file)")
    if parts.query or parts.fragment or "?" in url or "#" in url:
        raise ValueError("base_url must not have a query or fragment")
    if not parts.hostname:
        raise ValueError("base_url needs a host")
    if parts.scheme == "https":
        return url
    if parts.scheme == "http" and _is_loopback_literal(parts.hostname, parts.netloc):
        return url
    raise ValueError("base_url must be https://, or http:// only for localhost, 127.0.0.0/8 or [::1]")


def _is_loopback_literal(hostname: str, netloc: str) -> bool:
    import ipaddress

    if hostname == "localhost":
        return True
    if hostname == "::1":
        return netloc.startswith("[::1]")
    try:
        address = ipaddress.IPv4Address(hostname)
    except ValueError:
        return False
    return address in ipaddress.IPv4Network("127.0.0.0/8")


def check_clean_absolute(path: str, what: str) -> str:
    if not path.startswith("/") or os.path.normpath(path) != path or "//" in path:
        raise ValueError(f"{what} must be an absolute, clean path")
    return path


class _Entry(BaseModel):
    # Schemas built on first validation: a command reads only the entries its wb.yaml has
    # (and the built-in providers), and many never validate a machine or a budget.
    model_config = ConfigDict(strict=True, extra="forbid", defer_build=True)


class Provider(_Entry):
    base_url: str
    credential_env: str | None = None
    credential_file: str | None = None
    wire_api: ProviderApi = "responses"
    request_max_retries: int | None = None
    stream_max_retries: int | None = None
    stream_idle_timeout_ms: int | None = None

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str) -> str:
        return check_base_url(value)

    @field_validator("credential_env")
    @classmethod
    def _env(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if not _ENV_NAME.fullmatch(value):
            raise ValueError("credential_env must match ^[A-Z_][A-Z0-9_]{0,63}$")
        if value in ALLOWLISTED_ENV or value.startswith(("LD_", "DYLD_", "CODEX_", "WB_")):
            raise ValueError(
                "credential_env must not be an allowlisted variable or start with LD_, DYLD_, CODEX_ or WB_"
            )
        return value

    @field_validator("credential_file")
    @classmethod
    def _file(cls, value: str | None) -> str | None:
        return None if value is None else check_clean_absolute(value, "credential_file")

    @field_validator("request_max_retries", "stream_max_retries", "stream_idle_timeout_ms")
    @classmethod
    def _non_negative(cls, value: int | None) -> int | None:
        if value is not None and not 0 <= value <= 1_000_000_000:
            raise ValueError("must be a whole number >= 0")
        return value

    @model_validator(mode="after")
    def _one_credential(self) -> Provider:
        if (self.credential_env is None) == (self.credential_file is None):
            raise ValueError("set exactly one of credential_env and credential_file")
        return self


class BudgetSetting(_Entry):
    """A profile's `budget` (docs/cli.md#budgets): either bound or both."""

    tokens: int | None = None
    cost_usd: float | int | None = None

    @field_validator("tokens")
    @classmethod
    def _tokens(cls, value: int | None) -> int | None:
        if value is not None and (isinstance(value, bool) or not 1 <= value <= 10**15):
            raise ValueError("budget.tokens must be a whole number of at least 1")
        return value

    @field_validator("cost_usd")
    @classmethod
    def _cost(cls, value: float | int | None) -> float | None:
        if value is None:
            return None
        if isinstance(value, bool) or not 0 < value <= limits.COST_USD_MAX:
            raise ValueError("budget.cost_usd must be a number of dollars above 0")
        return float(value)


class PriceSetting(_Entry):
    """A profile's `price` (docs/config.md#price): dollars per million tokens, so a cost bound is checked after every
    model response from its tokens."""

    input_usd_per_mtok: float | int
    output_usd_per_mtok: float | int
    cached_input_usd_per_mtok: float | int | None = None

    @field_validator("input_usd_per_mtok", "output_usd_per_mtok", "cached_input_usd_per_mtok")
    @classmethod
    def _rate(cls, value: float | int | None) -> float | None:
        if value is None:
            return None
        if isinstance(value, bool) or not 0 <= value <= limits.PRICE_USD_PER_MTOK_MAX:
            raise ValueError(
                f"price rates must be numbers of dollars per million tokens, from 0 to {limits.PRICE_USD_PER_MTOK_MAX}"
            )
        return float(value)


class UsageLimitSetting(_Entry):
    """A profile's `on_usage_limit` (docs/cli.md#waiting-out-a-usage-limit); waiting is off unless `resume: true`."""

    resume: bool = False
    max_waits: int = limits.USAGE_WAITS_DEFAULT
    max_wait: str = default_duration(limits.USAGE_WAIT_MAX_DEFAULT_MS)
    prompt: str = limits.USAGE_WAIT_PROMPT_DEFAULT

    @field_validator("max_waits")
    @classmethod
    def _waits(cls, value: int) -> int:
        if isinstance(value, bool) or not 1 <= value <= limits.USAGE_WAITS_MAX:
            raise ValueError(f"on_usage_limit.max_waits must be a whole number from 1 to {limits.USAGE_WAITS_MAX}")
        return value

    @field_validator("max_wait")
    @classmethod
    def _max_wait(cls, value: str) -> str:
        milliseconds = _duration_ms(value)
        if not milliseconds:
            raise ValueError("on_usage_limit.max_wait must be a duration above 0, such as 6h")
        return value

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value: str) -> str:
        too_long = len(value.encode("utf-8", "replace")) > limits.USAGE_WAIT_PROMPT_MAX_BYTES
        if not value.strip() or "\x00" in value or too_long:
            raise ValueError(
                f"on_usage_limit.prompt must be non-empty text of at most {limits.USAGE_WAIT_PROMPT_MAX_TEXT}"
            )
        return value

    @property
    def max_wait_ms(self) -> int:
        milliseconds = _duration_ms(self.max_wait)
        assert milliseconds is not None
        return milliseconds


_RESOURCE_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,63}$"
# Ray node labels (`ray start --labels`): a key with an optional DNS prefix, and a selector value
# `v`, `!v`, `in(a, b)` or `!in(a, b)` of 1-63 [A-Za-z0-9_.-], alphanumeric at both ends.
_LABEL_PART = r"[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = rf"^(?:{_LABEL_PART}/)?{_LABEL_PART}$"
_LABEL_SELECTOR = rf"^!?(?:in\({_LABEL_PART}(?:, ?{_LABEL_PART})*\)|{_LABEL_PART})$"
# "KiB" … "TiB" are powers of 2**10, "KB" … "TB" powers of 10**3 (built so, not written out).
_MEMORY_UNITS = {"": 1}
for _power, _prefix in enumerate("KMGT", start=1):
    _MEMORY_UNITS[f"{_prefix}iB"] = 1 << (10 * _power)
    _MEMORY_UNITS[f"{_prefix}B"] = int(f"1{'000' * _power}")


class Resources(_Entry):
    """What a run needs of a Ray node (docs/ray.md#how-a-run-reaches-a-node); read only with agents.executor.ray."""

    cpus: float | int = 1
    gpus: float | int = 0
    memory: str | int | None = None  # bytes, or "4GiB", "512MiB", "2GB"
    custom: dict[str, float | int] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)  # Ray's label_selector: the node labels it must have

    @field_validator("cpus", "gpus")
    @classmethod
    def _amount(cls, value: float | int) -> float | int:
        if isinstance(value, bool) or value < 0 or value > limits.RESOURCE_AMOUNT_MAX:
            raise ValueError(f"must be a number from 0 to {limits.RESOURCE_AMOUNT_MAX}")
        return value

    @field_validator("memory")
    @classmethod
    def _memory(cls, value: str | int | None) -> str | int | None:
        memory_bytes(value)
        return value

    @field_validator("custom")
    @classmethod
    def _custom(cls, value: dict[str, float | int]) -> dict[str, float | int]:
        for name, amount in value.items():
            if not re.match(_RESOURCE_NAME, name) or name.startswith("wb-repo:"):
                raise ValueError(f"custom resource names are 1-64 of [A-Za-z0-9_.:/-] (not wb-repo:…): {name[:70]!r}")
            if isinstance(amount, bool) or not 0 < amount <= limits.RESOURCE_AMOUNT_MAX:
                raise ValueError(f"custom.{name} must be a number above 0, at most {limits.RESOURCE_AMOUNT_MAX}")
        return value

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        for key, selector in value.items():
            if not re.match(_LABEL_KEY, key) or key.startswith("ray.io/"):
                raise ValueError(f"label names are [PREFIX/]NAME of 1-63 [A-Za-z0-9_.-] (not ray.io/…): {key[:70]!r}")
            if not isinstance(selector, str) or not re.match(_LABEL_SELECTOR, selector):
                raise ValueError(f"labels.{key} must be VALUE, !VALUE, in(A, B) or !in(A, B): {str(selector)[:70]!r}")
        return value

    @property
    def memory_bytes(self) -> int:
        return memory_bytes(self.memory)


def memory_bytes(value: str | int | None) -> int:
    """`4GiB` → 4294967296; a bare integer is bytes; None is 0 (no memory asked for)."""
    if value is None:
        return 0
    if isinstance(value, bool):
        raise ValueError('memory must be bytes or a size such as "4GiB"')
    if isinstance(value, int):
        if value < 0:
            raise ValueError("memory must not be negative")
        return value
    match = re.fullmatch(r"(\d{1,15})\s*([KMGT]i?B)?", value.strip())
    if not match or (match.group(2) or "") not in _MEMORY_UNITS:
        raise ValueError(f'memory must be bytes or a size such as "4GiB" or "512MiB", not {value[:40]!r}')
    return int(match.group(1)) * _MEMORY_UNITS[match.group(2) or ""]


class Profile(_Entry):
    """One profile. `harness: command` names its own `command` and has no provider or model (docs/harnesses.md)."""

    harness: str
    provider: str | None = None
    model: str | None = None
    reasoning: str | None = None
    # true: the machine's network; [HOST[:PORT], …]: those hosts through wb's proxy (docs/security.md#confined-runs)
    network: bool | list[str] = False
    sandbox: Literal["auto", "required", "off"] | None = None  # wins over wb.yaml's sandbox.default
    sandbox_writable: list[str] | None = None  # wins over wb.yaml's sandbox.writable
    permissions: Literal["bypass"] | None = None  # claude only: --permission-mode bypassPermissions
    command: list[str] | None = None  # command only: ["/abs/path", "arg", …]
    # docs/cli.md#stalled-runs: Go durations; `0` (YAML integer or string) means never.
    stall_after: str | int | None = None
    stop_when_stalled: str | int | None = None
    budget: BudgetSetting | None = None  # docs/cli.md#budgets
    price: PriceSetting | None = None  # docs/config.md#price
    on_usage_limit: UsageLimitSetting | None = None  # docs/cli.md#waiting-out-a-usage-limit
    resources: Resources | None = None  # docs/ray.md#how-a-run-reaches-a-node: read only on a Ray head

    @field_validator("model", "reasoning")
    @classmethod
    def _ident(cls, value: str | None) -> str | None:
        return None if value is None else check_identifier(value, "model and reasoning")

    @field_validator("network", mode="before")
    @classmethod
    def _network(cls, value: Any) -> Any:
        if isinstance(value, bool) or value is None:
            return bool(value)
        if not isinstance(value, list) or not value or not all(isinstance(item, str) for item in value):
            raise ValueError("network must be true, false or a list of HOST or HOST:PORT")
        for item in value:
            if not _NETWORK_HOST.fullmatch(item):
                raise ValueError(f"network: {item[:80]!r} must be HOST or HOST:PORT (a host name, no scheme or path)")
        return value

    @field_validator("sandbox", mode="before")
    @classmethod
    def _sandbox_mode(cls, value: Any) -> Any:
        return "off" if value is False else value  # YAML reads a bare `off` as false

    @field_validator("sandbox_writable")
    @classmethod
    def _writable(cls, value: list[str] | None) -> list[str] | None:
        from courier.config_file import check_writable_paths

        return None if value is None else list(check_writable_paths(value, "sandbox_writable"))

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return value
        if not 1 <= len(value) <= limits.COMMAND_ARGS_MAX:
            raise ValueError(
                f"command must list 1 to {limits.COMMAND_ARGS_MAX} strings: the program, then its arguments"
            )
        check_clean_absolute(value[0], "command's first item (the program)")
        for item in value:
            if "\x00" in item or len(item.encode("utf-8", "replace")) > limits.COMMAND_ARG_MAX_BYTES:
                raise ValueError(f"command items must be at most {limits.COMMAND_ARG_MAX_BYTES} bytes, without NUL")
        return value

    @model_validator(mode="after")
    def _fits_harness(self) -> Profile:
        if self.harness == "command":
            if self.command is None:
                raise ValueError('harness command needs command: ["/absolute/program", "arg", ...]')
            extra = [key for key in ("provider", "model", "reasoning", "permissions") if getattr(self, key) is not None]
            if extra:
                raise ValueError(f"harness command takes no {', '.join(extra)} (the command is the whole harness)")
            return self
        missing = [key for key in ("provider", "model") if getattr(self, key) is None]
        if missing:
            raise ValueError(f"harness {self.harness} needs {' and '.join(missing)}")
        if self.command is not None:
            raise ValueError("command is only for harness: command")
        if self.permissions is not None and self.harness != "claude":
            raise ValueError("permissions is only for harness: claude")
        return self

    @field_validator("stall_after", "stop_when_stalled")
    @classmethod
    def _duration(cls, value: str | int | None) -> str | int | None:
        _duration_ms(value)
        return value

    @property
    def stall_after_ms(self) -> int | None:
        return _duration_ms(self.stall_after)

    @property
    def stop_when_stalled_ms(self) -> int | None:
        return _duration_ms(self.stop_when_stalled)


def _duration_ms(value: str | int | None) -> int | None:
    from protocol.durations import BadDuration, parse_duration_ms

    if value is None:
        return None
    if isinstance(value, bool) or (isinstance(value, int) and value != 0):
        raise ValueError('must be a duration such as "10m" or "90s" (a bare number other than 0 has no unit)')
    if isinstance(value, int):
        return 0
    try:
        milliseconds = parse_duration_ms(value)
    except BadDuration as exc:
        raise ValueError(f"must be a duration such as 10m: {exc}") from None
    if milliseconds < 0:
        raise ValueError("must not be negative")
    return milliseconds


def _check_wb_path(value: str | None) -> str | None:
    if value is None:
        return value
    check_clean_absolute(value, "wb_path")
    if not all(_PATH_SEGMENT.fullmatch(seg) for seg in value.split("/")[1:]):
        raise ValueError("wb_path segments may use only letters, digits and . _ + -")
    return value


_LABEL = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")
AUTO = "auto"  # `--to auto[:LABEL]` (docs/cli.md#placement-across-a-fleet): never a machine's name


class Placement(_Entry):
    """What `--to auto` reads of a machine: `slots` and `labels` on the target itself, beside its
    `ssh:` or `exec:` block (docs/config.md#targets)."""

    slots: int | None = None  # how many runs `--to auto` places there at once; None: unlimited
    labels: list[str] = []

    @field_validator("slots")
    @classmethod
    def _slots(cls, value: int | None) -> int | None:
        if value is not None and not 1 <= value <= limits.SLOTS_MAX:
            raise ValueError(f"slots must be a whole number from 1 to {limits.SLOTS_MAX} (leave it out for unlimited)")
        return value

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: list[str]) -> list[str]:
        for label in value:
            if not _LABEL.fullmatch(label):
                raise ValueError(
                    f'label "{label[:40]}" must be 1-32 lowercase letters, digits, "_" or "-", '
                    "starting with a letter or digit"
                )
        return value


PLACEMENT_KEYS = ("slots", "labels")


class _Placed(_Entry):
    """A machine's channel block, with the placement read from beside it (never from inside it)."""

    slots: int | None = None
    labels: list[str] = []


class Target(_Placed):
    """`session_move.targets.NAME.ssh`: a machine reached over SSH (docs/cli.md, machines)."""

    channel: ClassVar[str] = "ssh"
    host: str
    user: str | None = None
    port: int | None = None
    wb_path: str | None = None

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        if not _HOST.fullmatch(value):
            raise ValueError("host must match ^[A-Za-z0-9][A-Za-z0-9._-]*$ (a name or alias, no options)")
        return value

    @field_validator("user")
    @classmethod
    def _user(cls, value: str | None) -> str | None:
        if value is not None and not _USER.fullmatch(value):
            raise ValueError("user must match ^[A-Za-z_][A-Za-z0-9_-]*$")
        return value

    @field_validator("port")
    @classmethod
    def _port(cls, value: int | None) -> int | None:
        if value is not None and not 1 <= value <= 65535:
            raise ValueError("port must be between 1 and 65535")
        return value

    @field_validator("wb_path")
    @classmethod
    def _wb_path(cls, value: str | None) -> str | None:
        return _check_wb_path(value)


class ExecTarget(_Placed):
    """`session_move.targets.NAME.exec`: a machine reached by running a local command (docs/cli.md#exec-targets).

    wb runs `argv + [wb_path, "--wb-internal-agent-remote"]` as its own child, no shell:
    each element is one argument and nothing from a request is ever in it.
    """

    channel: ClassVar[str] = "exec"
    argv: list[str]
    wb_path: str | None = None

    @field_validator("argv")
    @classmethod
    def _argv(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("must be a non-empty list of strings (the command that reaches the machine)")
        if not value[0]:
            raise ValueError("argv[0] must name a command")
        if any("\0" in item for item in value):
            raise ValueError("arguments must not contain NUL")
        return value

    @field_validator("wb_path")
    @classmethod
    def _wb_path(cls, value: str | None) -> str | None:
        return _check_wb_path(value)


AnyTarget = Target | ExecTarget
# The config model of each channel, by its wb.yaml key (the keys of courier/channels/registry.py's
# CHANNELS; tests/unit/test_channel_names.py checks they agree). A new channel adds its model here and above.
TARGET_MODELS: dict[str, type[Target] | type[ExecTarget]] = {model.channel: model for model in (Target, ExecTarget)}


BUILTIN_PROVIDERS: dict[str, dict[str, Any]] = {
    "deepseek": {"base_url": "https://api.deepseek.com", "credential_env": "DEEPSEEK_API_KEY", "wire_api": "responses"},
    "openrouter": {
        "base_url": "https://openrouter.ai/api/v1",
        "credential_env": "OPENROUTER_API_KEY",
        "wire_api": "responses",
    },
    "anthropic": {
        "base_url": "https://api.anthropic.com",
        "credential_env": "ANTHROPIC_API_KEY",
        "wire_api": "anthropic",
    },
    "gemini": {
        "base_url": "https://generativelanguage.googleapis.com",
        "credential_env": "GEMINI_API_KEY",
        "wire_api": "gemini",
    },
}


@dataclass(frozen=True)
class Problem:
    """Why one entry of the file cannot be used."""

    message: str
    channel: str | None = None  # a machine's: the kind its block named (`wb machines` shows it)


@dataclass
class Config:
    path: Path
    home: Path
    projects_root: Path
    providers: dict[str, Provider | Problem] = field(default_factory=dict)
    profiles: dict[str, Profile | Problem] = field(default_factory=dict)
    targets: dict[str, AnyTarget | Problem] = field(default_factory=dict)
    courier_idle_ms: int = limits.COURIER_IDLE_DEFAULT_MS
    courier_max_sessions: int = limits.COURIER_MAX_SESSIONS_DEFAULT
    courier_dispatch_over_serve: bool = True  # courier.dispatch_over_serve (docs/courier.md, "Environment")
    executor: str | None = None  # agents.executor.<NAME> (courier/executor/); None: runs live on this machine
    ray_address: str | None = None  # agents.executor.ray.address: runs go to that Ray cluster (docs/ray.md)
    sandbox_default: str = "auto"  # the top-level `sandbox:` section (docs/config.md#sandbox)
    sandbox_writable: tuple[str, ...] = ()

    def target(self, machine: str) -> AnyTarget:
        entry = self.targets.get(machine)
        if entry is None:
            names = ", ".join(sorted(self.targets)) or "none"
            raise UsageError(
                f'unknown machine "{machine}": configured machines: {names} '
                f"(add it under session_move.targets in {self.path})"
            )
        if isinstance(entry, Problem):
            raise UsageError(entry.message)
        return entry

    def profile(self, name: str) -> Profile:
        entry = self.profiles.get(name)
        if entry is None:
            names = ", ".join(sorted(self.profiles)) or "none"
            raise UsageError(
                f'unknown profile "{name}": configured profiles: {names} (add it under agents.profiles in {self.path})'
            )
        if isinstance(entry, Problem):
            raise UsageError(entry.message)
        return entry

    def provider(self, name: str) -> Provider:
        entry = self.providers.get(name)
        if entry is None:
            names = ", ".join(sorted(self.providers))
            raise UsageError(
                f'unknown provider "{name}": known providers: {names} (add it under agents.providers in {self.path})'
            )
        if isinstance(entry, Problem):
            raise UsageError(entry.message)
        return entry


def load_config(path: Path | None = None) -> Config:
    """The configuration of `path` (default: WB_CONFIG, else the XDG location); an absent
    default file means the built-ins, but a file WB_CONFIG names must exist (docs/config.md#where-the-file-is)."""
    if path is None:
        path = config_path()
        if os.environ.get("WB_CONFIG") and not path.exists():
            raise UsageError(f"WB_CONFIG names {path}, which does not exist; create it or unset WB_CONFIG")
    return config_of(read_settings(path), path)


def config_of(settings: Settings, path: Path) -> Config:
    """The configuration of a file's settings: each entry validated, a problem kept with its entry."""
    return Config(
        path=path,
        home=settings.home,
        projects_root=settings.projects_root,
        providers=_providers(settings.providers, path),
        profiles=_entries(settings.profiles, path, "agents.profiles", Profile),
        targets=_targets(settings.targets, path),
        courier_idle_ms=settings.courier_idle_ms,
        courier_max_sessions=settings.courier_max_sessions,
        courier_dispatch_over_serve=settings.courier_dispatch_over_serve,
        executor=settings.executor,
        ray_address=settings.ray_address,
        sandbox_default=settings.sandbox_default,
        sandbox_writable=settings.sandbox_writable,
    )


def _problem(path: Path, where: str, exc: ValidationError | ValueError | BadName) -> Problem:
    if isinstance(exc, ValidationError):
        details = []
        for item in exc.errors(include_url=False, include_input=False):
            loc = ".".join(str(p) for p in item["loc"])
            message = str(item["msg"]).removeprefix("Value error, ")
            if item["type"] == "string_type":
                message = "must be a YAML string (quote it)"
            elif item["type"] == "int_type":
                message = "must be a whole number (not quoted)"
            elif item["type"] == "extra_forbidden":
                message = "unknown key"
            elif item["type"] == "list_type":
                message = "must be a list of strings"
            details.append(f"{where}{'.' + loc if loc else ''}: {message}")
        return Problem(f"{path}: " + "; ".join(details))
    return Problem(f"{path}: {where}: {exc}")


def _entries(section: dict[str, Any], path: Path, where: str, model: type[Profile]) -> dict[str, Profile | Problem]:
    out: dict[str, Profile | Problem] = {}
    for name, body in section.items():
        key = f"{where}.{name}"
        if not isinstance(body, dict):
            out[str(name)] = Problem(f"{path}: {key}: must be a mapping")
            continue
        try:
            out[str(name)] = model.model_validate(body)
        except ValidationError as exc:
            out[str(name)] = _problem(path, key, exc)
    return out


def _providers(section: dict[str, Any], path: Path) -> dict[str, Provider | Problem]:
    out: dict[str, Provider | Problem] = {}
    merged: dict[str, dict[str, Any] | None] = {name: dict(body) for name, body in BUILTIN_PROVIDERS.items()}
    for name, body in section.items():
        key = f"agents.providers.{name}"
        if not isinstance(name, str) or not _PROVIDER_NAME.fullmatch(name):
            out[str(name)] = Problem(f"{path}: {key}: provider names must match ^[a-z0-9_-]{{1,32}}$")
            continue
        if not isinstance(body, dict):
            out[name] = Problem(f"{path}: {key}: must be a mapping")
            continue
        base = dict(merged.get(name) or {})
        # The credential source is one fact: naming either kind replaces the built-in's.
        if "credential_env" in body or "credential_file" in body:
            base.pop("credential_env", None)
            base.pop("credential_file", None)
        base.update(body)
        merged[name] = base
    for name, body in merged.items():
        if name in out or body is None:
            continue
        try:
            out[name] = Provider.model_validate(body)
        except ValidationError as exc:
            out[name] = _problem(path, f"agents.providers.{name}", exc)
    return out


def _targets(section: dict[str, Any], path: Path) -> dict[str, AnyTarget | Problem]:
    out: dict[str, AnyTarget | Problem] = {}
    for name, body in section.items():
        key = f"session_move.targets.{name}"
        kinds = [kind for kind in TARGET_MODELS if kind in body] if isinstance(body, dict) else ["ssh"]
        if body is None or not kinds:
            # no ssh or exec block: not a machine (it may serve another WB transport), skipped silently
            # (docs/cli.md#machine-selection)
            continue
        try:
            check_machine_name(str(name))
        except BadName as exc:
            out[str(name)] = Problem(f"{path}: {key}: {exc}")
            continue
        if str(name) == AUTO:
            out[str(name)] = Problem(
                f'{path}: {key}: "{AUTO}" is reserved for --to auto (placement across the fleet); rename the machine'
            )
            continue
        if len(kinds) > 1:
            both = " and ".join(kinds)
            out[str(name)] = Problem(f"{path}: {key}: has both {both}; a machine is reached one way: keep one")
            continue
        kind = kinds[0]
        block = body.get(kind) if isinstance(body, dict) else None
        model = TARGET_MODELS[kind]
        if not isinstance(block, dict):
            needs = "at least " + next(name for name, spec in model.model_fields.items() if spec.is_required())
            out[str(name)] = Problem(f"{path}: {key}.{kind}: must be a mapping with {needs}", kind)
            continue
        misplaced = [field for field in PLACEMENT_KEYS if field in block]
        if misplaced:
            # Beside the block, as docs/config.md#targets says: inside it they are an error, never ignored.
            wrong = [f"{key}.{kind}.{field}: {field} belongs on the target ({key}.{field})" for field in misplaced]
            out[str(name)] = Problem(f"{path}: " + "; ".join(wrong), kind)
            continue
        try:
            target = model.model_validate(block)
        except ValidationError as exc:
            out[str(name)] = Problem(_problem(path, f"{key}.{kind}", exc).message, kind)
            continue
        try:
            placement = Placement.model_validate({field: body[field] for field in PLACEMENT_KEYS if field in body})
        except ValidationError as exc:
            out[str(name)] = Problem(_problem(path, key, exc).message, kind)
            continue
        out[str(name)] = target.model_copy(update={"slots": placement.slots, "labels": placement.labels})
    return out
