"""The schema-1 documents (docs/protocol.md#the-request; docs/protocol.md#the-response; docs/cli.md#results), with
WB's exact JSON field names.

Decoding ignores unknown fields (a newer peer may add some) and reads JSON null as the
field's zero value, as a Go peer's `omitempty`-less fields arrive. Encoding omits empty
fields, except `results`, which a list reply always carries.
"""

from __future__ import annotations

import contextlib
import gc
import json
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, StringConstraints, field_validator, model_validator

from protocol import limits

TERMINAL_STATES = frozenset({"completed", "failed", "timeout", "abandoned"})
# The closed vocabulary (docs/runs.md#states-and-liveness): `queued` only on a Ray cluster (docs/ray.md).
STATES = ("queued", "running", "completed", "failed", "timeout", "abandoned")
WORKTREE_MODES = ("new", "existing")

_RFC3339 = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?(Z|[+-]\d\d:\d\d)"
_GO_ZERO_TIME = "0001-01-01T00:00:00Z"
_GO_EMPTY_STRINGS = ("machine", "worktree_dir", "branch", "base", "base_sha", "failure", "result", "log_path")


def is_terminal(state: str) -> bool:
    """This program's vocabulary decides; an unknown state from a peer is not terminal."""
    return state in TERMINAL_STATES


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector around bulk validation (list over thousands of records).

    The documents are acyclic, so reference counting frees them; with the collector on,
    its repeated full passes over the growing heap cost more than the validation itself.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


# Checked by pydantic-core's own regex engine: a list of 10,000 records pays no Python call per field.
_PLAIN_PATTERN = "^[^\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]*$"
Identifier = Annotated[str, StringConstraints(pattern=_PLAIN_PATTERN, max_length=256)]
PathText = Annotated[str, StringConstraints(pattern=_PLAIN_PATTERN, max_length=limits.PATH_TEXT_MAX_CHARS)]
RoutingText = Annotated[str, StringConstraints(pattern=_PLAIN_PATTERN, max_length=limits.PROVIDER_ROUTING_MAX_CHARS)]
Timestamp = Annotated[str, StringConstraints(pattern=f"^(?:{_RFC3339})$")]
# One optional feature a receiver supports (`diff`, `harness:claude`, …): short and plain.
Capability = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9:._-]*$", max_length=64)]


class WireModel(BaseModel):
    """Strict JSON types, unknown fields ignored, null read as absent."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=False, defer_build=True)

    @model_validator(mode="before")
    @classmethod
    def _null_is_absent(cls, data: Any) -> Any:
        if isinstance(data, dict) and None in data.values():
            return {key: value for key, value in data.items() if value is not None}
        return data

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


# The provider APIs a harness may speak: the one list, read by wb.yaml's providers
# (courier/config.py) and the harness registry. "" is the routing of a harness without a
# provider (`command`), whose Resolved also has provider and model "" (schema 1 keeps every field).
ProviderApi = Literal["responses", "chat", "anthropic", "gemini"]
WireApi = Literal[ProviderApi, ""]


class Routing(WireModel):
    base_url: RoutingText
    credential_env: RoutingText | None = None
    credential_file: RoutingText | None = None
    wire_api: WireApi


class Resolved(WireModel):
    profile: Identifier
    harness: Identifier
    provider: Identifier
    model: Identifier
    reasoning: Identifier | None = None
    routing: Routing


class Usage(WireModel):
    input_tokens: int = Field(default=0, ge=0)
    cached_input_tokens: int | None = Field(default=None, ge=0)
    cache_write_input_tokens: int | None = Field(default=None, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    reasoning_output_tokens: int | None = Field(default=None, ge=0)
    cost_usd: float | None = Field(default=None, ge=0, allow_inf_nan=False)  # only when the harness reports it


class ChangeSummary(WireModel):
    files_changed: int = Field(default=0, ge=0)
    files: list[str] | None = Field(default=None, max_length=limits.CHANGED_FILES_MAX)
    insertions: int | None = Field(default=None, ge=0)
    deletions: int | None = Field(default=None, ge=0)
    new_files: int | None = Field(default=None, ge=0)  # untracked, non-ignored new files (docs/runs.md#summaries)
    commits: int | None = Field(default=None, ge=0)
    files_truncated: bool | None = None
    preexisting_changes: int | None = Field(default=None, ge=0)


class Budget(WireModel):
    """The bounds in force on one run (docs/cli.md#budgets): tokens are input + output as `usage` counts them."""

    tokens: int | None = Field(default=None, ge=1)
    cost_usd: float | None = Field(default=None, gt=0, allow_inf_nan=False)


class Wait(WireModel):
    """One wait for a usage limit to reset (docs/cli.md#waiting-out-a-usage-limit); `reason` says whose limit."""

    started_at: Timestamp
    until: Timestamp
    reason: Annotated[str, StringConstraints(pattern=_PLAIN_PATTERN, max_length=512)]


class Price(WireModel):
    """A profile's `price` as the run record keeps it (docs/config.md#price): dollars per million tokens."""

    input_usd_per_mtok: float = Field(ge=0, le=limits.PRICE_USD_PER_MTOK_MAX, allow_inf_nan=False)
    output_usd_per_mtok: float = Field(ge=0, le=limits.PRICE_USD_PER_MTOK_MAX, allow_inf_nan=False)
    cached_input_usd_per_mtok: float | None = Field(
        default=None, ge=0, le=limits.PRICE_USD_PER_MTOK_MAX, allow_inf_nan=False
    )

    def cost_usd(self, input_tokens: int, cached_input_tokens: int, output_tokens: int) -> float:
        """The dollars these tokens cost: cache reads at the cached rate (the input rate when none is given)."""
        cached = min(cached_input_tokens, input_tokens)
        cached_rate = self.cached_input_usd_per_mtok
        cached_rate = self.input_usd_per_mtok if cached_rate is None else cached_rate
        dollars = (input_tokens - cached) * self.input_usd_per_mtok + cached * cached_rate
        return (dollars + output_tokens * self.output_usd_per_mtok) / limits.TOKENS_PER_MTOK


class UsageLimitPolicy(WireModel):
    """A profile's `on_usage_limit` as the run record keeps it (docs/cli.md#waiting-out-a-usage-limit)."""

    max_waits: int = Field(default=limits.USAGE_WAITS_DEFAULT, ge=1, le=limits.USAGE_WAITS_MAX)
    max_wait_ms: int = Field(default=limits.USAGE_WAIT_MAX_DEFAULT_MS, ge=1)
    prompt: Annotated[str, StringConstraints(min_length=1, max_length=limits.USAGE_WAIT_PROMPT_MAX_BYTES)] = (
        limits.USAGE_WAIT_PROMPT_DEFAULT
    )


class NodeFacts(WireModel):
    """One node of a Ray cluster, as `version` on its head reports it (docs/ray.md#machines---check)."""

    node: Identifier
    alive: bool = True
    cpus_free: float = 0
    cpus_total: float = 0
    gpus_free: float = 0
    gpus_total: float = 0


class Sandbox(WireModel):
    """How the worker ran (docs/security.md#confined-runs): `bwrap` and its network, or `none` and why not."""

    kind: Literal["bwrap", "none"]
    network: Literal["provider", "all"] | list[Annotated[str, Field(max_length=260)]] | None = Field(
        default=None, max_length=limits.NETWORK_HOSTS_MAX
    )
    reason: str | None = Field(default=None, max_length=limits.RESULT_FAILURE_MAX_CHARS)


class Result(WireModel):
    """What status, await, list and dispatch report about one run. Never the task."""

    agent_id: str
    machine: str | None = None
    state: Identifier
    terminal: bool = False
    profile: Identifier
    resolved: Resolved
    repository: Identifier
    worktree_mode: Literal["new", "existing"]
    worktree: str
    worktree_dir: PathText | None = None
    branch: Identifier | None = None
    base: Identifier | None = None
    base_sha: Identifier | None = None
    started_at: Timestamp
    finished_at: Timestamp | None = None
    duration_ms: int | None = Field(default=None, ge=0)
    owner_pid: int | None = Field(default=None, ge=0)
    worker_pid: int | None = Field(default=None, ge=0)
    owner_alive: bool = False
    worker_alive: bool = False
    exit_code: int | None = None
    failure: str | None = Field(default=None, max_length=limits.RESULT_FAILURE_MAX_CHARS)
    result: str | None = Field(default=None, max_length=2 * limits.FINAL_MESSAGE_MAX_BYTES)
    tool_calls: int | None = Field(default=None, ge=0)
    usage: Usage | None = None
    budget: Budget | None = None  # docs/cli.md#budgets
    sandbox: Sandbox | None = None  # docs/security.md#confined-runs: set by the owner as the worker starts
    # docs/cli.md#waiting-out-a-usage-limit
    waits: list[Wait] | None = Field(default=None, max_length=limits.USAGE_WAITS_MAX)
    max_waits: int | None = Field(default=None, ge=1)  # on_usage_limit's bound, for the `waiting:` line
    changes: ChangeSummary | None = None
    parent_id: str | None = None
    session_id: Identifier | None = None
    last_output_at: Timestamp | None = None
    stalled_since: Timestamp | None = None
    harness_diagnostics: list[str] | None = Field(default=None, max_length=limits.HARNESS_DIAGNOSTICS_MAX)
    log_path: PathText | None = None
    node: Identifier | None = None  # docs/ray.md: the Ray node that runs it
    queued_for: Identifier | None = None  # docs/ray.md: while queued, what it waits for ("cpus=2, gpus=1")

    @field_validator("agent_id")
    @classmethod
    def _run_id(cls, value: str) -> str:
        from protocol.refs import check_run_id

        return check_run_id(value)

    @field_validator("parent_id")
    @classmethod
    def _parent_id(cls, value: str | None) -> str | None:
        from protocol.refs import check_run_id

        return None if value is None else check_run_id(value)

    @field_validator("machine")
    @classmethod
    def _machine(cls, value: str | None) -> str | None:
        from protocol.refs import check_machine_name

        return None if value is None else check_machine_name(value)

    @field_validator("worktree")
    @classmethod
    def _worktree(cls, value: str) -> str:
        from protocol.refs import check_worktree_name

        return check_worktree_name(value)

    @model_validator(mode="before")
    @classmethod
    def _go_zero_values(cls, data: Any) -> Any:
        # A Go peer writes an unset time as its zero value and empty strings as "".
        if not isinstance(data, dict):
            return data
        zero = [key for key in _GO_EMPTY_STRINGS if data.get(key) == ""]
        if data.get("finished_at") == _GO_ZERO_TIME:
            zero.append("finished_at")
        return {key: value for key, value in data.items() if key not in zero} if zero else data

    @model_validator(mode="after")
    def _derive_terminal(self) -> Result:
        self.terminal = is_terminal(self.state)
        return self


class StopResult(WireModel):
    """The stop reply's own three-field `result` (docs/protocol.md#the-response); `machine` is stamped by the caller."""

    agent_id: str
    machine: str | None = None
    worker_pid: int = Field(default=0, ge=0)
    state: Annotated[str, StringConstraints(pattern=_PLAIN_PATTERN, max_length=64)]

    @field_validator("agent_id")
    @classmethod
    def _run_id(cls, value: str) -> str:
        from protocol.refs import check_run_id

        return check_run_id(value)


class DiffFile(WireModel):
    """One file of a diff (docs/cli.md, wb agent diff); a path is git's, so output sanitises it."""

    path: Annotated[str, StringConstraints(max_length=limits.PATH_TEXT_MAX_CHARS)]
    status: Identifier
    insertions: int = Field(default=0, ge=0)
    deletions: int = Field(default=0, ge=0)
    binary: bool = False


class DiffResult(WireModel):
    """The diff reply's `result` and `wb agent diff --json` (docs/cli.md, wb agent diff)."""

    agent_id: str
    machine: str | None = None
    base_sha: Identifier
    head_sha: Identifier
    files: list[DiffFile] = Field(default_factory=list)
    patch: str | None = None

    @field_validator("agent_id")
    @classmethod
    def _run_id(cls, value: str) -> str:
        from protocol.refs import check_run_id

        return check_run_id(value)


class PrunedRun(WireModel):
    agent_id: str
    state: Identifier
    finished_at: Timestamp

    @field_validator("agent_id")
    @classmethod
    def _run_id(cls, value: str) -> str:
        from protocol.refs import check_run_id

        return check_run_id(value)


class PrunedWorktree(WireModel):
    """A worktree `prune --worktrees` removed (or, dry, would remove), with its `wb/<name>` branch."""

    path: PathText
    branch: Identifier | None = None  # absent when the run's branch was not wb/<name> (kept)
    # git refused: the worktree is still there
    error: str | None = Field(default=None, max_length=limits.RUN_FAILURE_MESSAGE_MAX_BYTES)


class PruneResult(WireModel):
    """The prune reply's `result` (docs/cli.md, wb agent prune): what was (or, dry, would be) removed."""

    dry_run: bool = False
    removed: list[PrunedRun] = Field(default_factory=list)
    # Fields an older peer does not send (docs/cli.md, wb agent prune): records kept because their run is live,
    # and with `worktrees` the worktrees removed.
    kept_live: int | None = Field(default=None, ge=0)
    worktrees: list[PrunedWorktree] | None = None


class PlacementFacts(WireModel):
    """A `version` reply's answer to `placement: true` (docs/cli.md#placement-across-a-fleet)."""

    running: int = Field(ge=0)  # runs not terminal on this machine
    has_repository: bool | None = None  # the request's `repository` has its canonical clone here (None: not asked)


class ListWarning(WireModel):
    agent_id: str
    error: str


class RemoteRequest(WireModel):
    """One operation asked of a machine. An absent field equals its zero value."""

    schema_version: int
    operation: str = ""
    mode: str = ""
    worktree: str = ""
    profile: str = ""
    task: str = ""
    repository: str = ""
    branch: str = ""
    base: str = ""
    timeout_ms: int = 0
    agent_id: str = ""
    wait_timeout_ms: int = 0
    raw: bool = False
    tail: int = 0
    # Added later (docs/protocol.md#optional-features): fields an older peer ignores.
    stat: bool = False
    follow: bool = False
    follow_from: int = 0
    new_agent_id: str = ""
    older_than_ms: int = 0
    dry_run: bool = False
    # docs/cli.md, wb agent prune: prune also removes worktrees; sent only to a peer listing `prune-worktrees`.
    worktrees: bool = False
    # Part three (docs/cli.md#budgets): sent only to a peer whose `capabilities` list `budget`.
    max_tokens: int = 0
    max_cost_usd: float = 0.0
    # docs/cli.md#placement-across-a-fleet: sent only to a peer whose `capabilities` list `placement`.
    max_running: int = 0  # dispatch: refuse in-band when this machine already runs this many (0: no bound)
    placement: bool = False  # version: also answer `placement` (running runs; `repository`'s clone present)
    # docs/protocol.md, watch: the cursor of the previous watch reply ("" on the first call).
    watch_cursor: str = ""

    @classmethod
    def of(cls, operation: str, **fields: Any) -> RemoteRequest:
        """The one way a request is built: this wb's schema version, the operation, its fields."""
        return cls(schema_version=limits.SCHEMA_VERSION, operation=operation, **fields)

    def encode(self) -> bytes:
        body = self.model_dump(exclude_defaults=True)
        body["schema_version"] = self.schema_version
        body["operation"] = self.operation
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


class RemoteResponse(WireModel):
    """One reply document. `result` is decoded per operation (see `result_of`)."""

    schema_version: int
    operation: str = ""
    result: dict[str, Any] | None = None
    results: list[dict[str, Any]] | None = None
    logs: str = ""
    failure: str = ""
    failure_kind: str | None = None
    wb_version: str | None = None
    now: Timestamp | None = None
    warnings: list[ListWarning] | None = None
    home_id: str | None = None
    next_offset: int | None = None
    # A follow reply: when each action's line reached the machine's wb (RFC 3339), one per line of `logs`,
    # null where it is not known (docs/protocol.md). An older peer sends none.
    action_times: list[Timestamp | None] | None = Field(default=None, max_length=limits.FOLLOW_ACTIONS_PER_REPLY_MAX)
    watch_cursor: str | None = None  # docs/protocol.md, watch: echo it in the next watch request
    capabilities: list[Capability] | None = Field(default=None, max_length=limits.CAPABILITIES_MAX)
    placement: PlacementFacts | None = None  # version with `placement: true` (docs/cli.md#placement-across-a-fleet)
    executor: Literal["ray"] | None = None  # version on a Ray head (docs/ray.md#machines---check)
    nodes: list[NodeFacts] | None = None  # bounded with the whole reply (docs/protocol.md#bounds)
    # version: whether bubblewrap can confine a worker there, `bwrap 0.8.0` or `none: <why>`
    # (docs/cli.md, wb machines); an older peer sends none.
    sandbox: str | None = None
    # Results already validated (made on this machine, or checked once by the caller's decoder),
    # kept typed so nobody validates them again.
    _typed_result: Result | StopResult | None = PrivateAttr(default=None)
    _typed_results: list[Result] | None = PrivateAttr(default=None)
    # Never on the wire: `logs --raw` asked in-process hands over the open transcript
    # (descriptor, size, path) instead of a copy of it, so this machine prints it whole.
    _transcript: tuple[int, int, str] | None = PrivateAttr(default=None)

    def attach_transcript(self, opened: tuple[int, int, str]) -> None:
        self._transcript = opened

    def take_transcript(self) -> tuple[int, int, str] | None:
        """The handed-over transcript, once; its descriptor is then the taker's to close."""
        opened, self._transcript = self._transcript, None
        return opened

    def set_result(self, result: Result | StopResult) -> None:
        self._typed_result = result
        self.result = None

    def set_results(self, results: list[Result]) -> None:
        self._typed_results = results
        self.results = None

    def clear_results(self) -> None:
        self.result = self.results = None
        self._typed_result = self._typed_results = None

    def has_result(self) -> bool:
        """Whether it carries a `result`, typed or not (a logs reply does only when it follows)."""
        return self._typed_result is not None or self.result is not None

    def encode(self) -> bytes:
        body: dict[str, Any] = {"schema_version": self.schema_version, "operation": self.operation}
        if self._typed_result is not None:
            body["result"] = self._typed_result.to_wire()
        elif self.result is not None:
            body["result"] = self.result
        if self.operation in ("list", "watch"):
            if self._typed_results is not None:
                with collector_paused():
                    body["results"] = [result.to_wire() for result in self._typed_results]
            else:
                body["results"] = self.results or []
        for key in ("logs", "failure", "failure_kind", "wb_version", "now", "watch_cursor", "capabilities"):
            value = getattr(self, key)
            if value:
                body[key] = value
        if self.warnings:
            body["warnings"] = [w.to_wire() for w in self.warnings]
        if self.next_offset is not None:
            body["next_offset"] = self.next_offset
        if self.action_times is not None:
            body["action_times"] = self.action_times
        if self.capabilities is not None:
            body["capabilities"] = self.capabilities
        if self.placement is not None:
            body["placement"] = self.placement.to_wire()
        if self.executor is not None:
            body["executor"] = self.executor
        if self.nodes is not None:
            body["nodes"] = [node.to_wire() for node in self.nodes]
        if self.sandbox is not None:
            body["sandbox"] = self.sandbox
        # home_id is on every reply, null when the receiver could not use its home.
        body["home_id"] = self.home_id
        try:
            return json.dumps(body, ensure_ascii=False, indent=None, separators=(",", ":")).encode() + b"\n"
        except UnicodeEncodeError:
            # A diff's patch of a non-UTF-8 file carries its bytes as lone surrogates
            # (surrogateescape); ASCII-escaped JSON carries them as \udcXX, which decodes back.
            return json.dumps(body, ensure_ascii=True, indent=None, separators=(",", ":")).encode() + b"\n"

    def result_of(self) -> Result:
        if isinstance(self._typed_result, Result):
            return self._typed_result
        return Result.model_validate(self.result or {})

    def stop_result_of(self) -> StopResult:
        if isinstance(self._typed_result, StopResult):
            return self._typed_result
        return StopResult.model_validate(self.result or {})

    def results_of(self) -> list[Result]:
        if self._typed_results is not None:
            return list(self._typed_results)
        with collector_paused():
            return [Result.model_validate(item) for item in (self.results or [])]
