"""The one interface every harness implements (docs/harnesses.md): how it starts, what its stream says, how it ends.

The owner, dispatch and the worker environment know only this module. A harness is found by
the profile's `harness` name through `courier.runs.harness.harness_for`; each lives in its
own module, imported only by the processes that run or summarise a run (never by the receiver
answering `status` or `list`).
"""

from __future__ import annotations

import os
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from courier.runs.harness.lines import action_lines, clean, decode_line, malformed_excerpt
from protocol import limits

if TYPE_CHECKING:
    from courier.config import Provider
    from protocol.models import Usage

DIAGNOSTICS_MAX = 50


@dataclass(frozen=True)
class MessageUsage:
    """One model response's usage as the harness's stream reported it (docs/cli.md#budgets), by the provider's ID."""

    message_id: str
    input_tokens: int  # cache reads and writes included
    output_tokens: int
    cached_input_tokens: int = 0


@dataclass(frozen=True)
class Launch:
    """Everything a harness needs to build its command line and environment. Never the task.

    `env_key` names the variable the harness reads its credential from (the provider's
    `credential_env`, or WB_AGENT_PROVIDER_CREDENTIAL for a `credential_file` provider);
    it is "" for a harness without a provider (`command`). `resume_session` is the session
    to continue (docs/cli.md, wb agent continue), else None.
    """

    worktree: str
    run_dir: Path
    home: Path
    model: str
    provider_name: str
    provider: Provider | None
    env_key: str
    reasoning: str | None = None
    network: bool = False
    confined: bool = False  # inside wb's sandbox (docs/security.md#confined-runs)
    permissions: str | None = None
    command: tuple[str, ...] | None = None
    resume_session: str | None = None

    @property
    def last_message_path(self) -> Path:
        from courier.runs.store import LAST_MESSAGE

        return self.run_dir / LAST_MESSAGE


# How each CLI words a provider's usage or rate-limit refusal in its failure (fixtures in tests/fixtures/*/limit-429*).
_USAGE_LIMIT = re.compile(
    r"\b429\b|too many requests|rate[ _-]?limit|usage limit|limit reached|resource[ _]?exhausted|quota",
    re.IGNORECASE,
)


def is_usage_limit(text: str) -> bool:
    """True when a harness's failure text is a usage or rate limit (docs/cli.md#waiting-out-a-usage-limit)."""
    return bool(_USAGE_LIMIT.search(text))


def plural_files(count: int) -> str:
    return "changed 1 file" if count == 1 else f"changed {count} files"


class EventParser(ABC):
    """What one harness's output stream said, built one line at a time, in bounded memory.

    Every line the harness writes (stdout and stderr share one pipe) goes to `feed`, with or
    without its newline, in order; lines are numbered from 1, counting blank lines and those
    reported through `skipped_oversize_line`. The facts below are what the run's Result takes;
    `failure` applies the harness's terminal rule.
    """

    # True when the stream reports each model response's usage (Claude Code's `assistant` lines).
    reports_message_usage: ClassVar[bool] = False

    def __init__(self) -> None:
        self.session_id: str | None = None
        self.usage: Usage | None = None
        self.tool_calls = 0
        self.last_message: str | None = None
        self.lines = 0
        self.events = 0
        # A usage or rate limit the harness reported as its failure (docs/cli.md#waiting-out-a-usage-limit), and when
        # it resets.
        self.usage_limit: str | None = None
        self.limit_reset_at: float | None = None  # epoch seconds
        self._diagnostics: list[str] = []
        self._diagnostics_dropped = 0
        self._message_usage: list[MessageUsage] = []  # reported since the last take_message_usage

    @property
    def diagnostics(self) -> list[str]:
        """Harness diagnostics in arrival order; the last entry counts any that were dropped."""
        if not self._diagnostics_dropped:
            return list(self._diagnostics)
        return [*self._diagnostics, f"… and {self._diagnostics_dropped} more harness diagnostic(s)"]

    def diagnose(self, text: str) -> bool:
        """Record one diagnostic; False when the bound made it only a count."""
        if len(self._diagnostics) >= DIAGNOSTICS_MAX - 1:
            self._diagnostics_dropped += 1
            return False
        self._diagnostics.append(clean(text))
        return True

    def message_usage(self, usage: MessageUsage) -> None:
        self._message_usage.append(usage)

    def take_message_usage(self) -> list[MessageUsage]:
        """The per-response usage the stream reported since the last call (the owner's meter takes it per line)."""
        taken, self._message_usage = self._message_usage, []
        return taken

    def skipped_oversize_line(self, size: int) -> None:
        """Record that the owner skipped a line of `size` bytes (over the 8 MiB line bound)."""
        self.lines += 1
        self.diagnose(
            f"skipped event line {self.lines}: {size} bytes is over the {limits.EVENT_LINE_MAX_BYTES}-byte line limit"
        )

    def feed(self, line: bytes) -> bytes:
        """Parse one line; return the bytes to store for it (a harness may mask the task it echoes)."""
        self.lines += 1
        if not line or line.isspace():
            return line
        text, event, ok = decode_line(line)
        if not ok:
            self.malformed(text)
            return line
        self.events += 1
        return self.event(event, line)

    def malformed(self, text: str) -> None:
        self.diagnose(f"malformed event line {self.lines}: {malformed_excerpt(text)}")

    @abstractmethod
    def event(self, event: dict[str, Any], line: bytes) -> bytes:
        """Take one well-formed JSON object; return the bytes to store for it."""

    @abstractmethod
    def failure(self, exit_code: int | None) -> str | None:
        """The harness's terminal rule (after stop and timeout, which the owner decides): None is success."""


class Harness(ABC):
    """One coding-agent CLI behind the interface docs/harnesses.md describes."""

    # Its facts (name, executable, wire_api values, resumable) are in the registry's HarnessSpec.
    name: ClassVar[str]

    @abstractmethod
    def argv(self, launch: Launch) -> list[str]:
        """The exact command line, task never in it (it goes on stdin). ValueError for what cannot run."""

    def environment(self, launch: Launch, env: dict[str, str]) -> dict[str, str]:
        """The allowlisted environment plus the credential, completed with this harness's own variables."""
        return env

    def prepare_home(self, launch: Launch) -> None:  # noqa: B027 - most harnesses need nothing there
        """Write whatever the harness needs in its private home before it starts."""

    @abstractmethod
    def parser(self) -> EventParser:
        """A fresh parser for one run's stream."""

    def final_message(self, launch: Launch, parser: EventParser, extra: int = 0) -> tuple[bytes, int] | None:
        """(first bytes, full size) of the final message before its 4096-byte bound, or None.

        At least the bound + 1 + `extra` bytes are returned when the message is that long.
        """
        from courier.runs.harness.message import message_bytes

        return message_bytes(parser.last_message)

    def line_actions(self, line: bytes | None) -> tuple[dict[str, Any] | None, list[str] | None]:
        """What one stored line of the transcript is: (event, None) for an event whose actions
        `actions_of` decides, (None, actions) for a line that stands for itself (blank: none).

        The one reading of a line: `logs` (backwards) and `logs --follow` (forwards) both take
        it from here, so they print the same line for the same worker action (docs/cli.md).
        """
        return action_lines(line)

    @abstractmethod
    def actions_of(self, event: dict[str, Any]) -> list[str]:
        """The worker actions (docs/runs.md#summaries) one well-formed event stands for, unsanitised, oldest first."""

    def echoed_by(self, event: dict[str, Any], following: dict[str, Any]) -> bool:
        """True when `following` (the next event) makes `event` stand for nothing: it only repeats
        what `event` said, or says that it did not happen; `logs` then shows it once, or not at all.

        Reading forward (`logs --follow`), an event that may be such an echo is held back until
        the next event arrives; `may_echo` names those.
        """
        return False

    def may_echo(self, event: dict[str, Any]) -> bool:
        return False

    def worker_actions(self, events_path: str | os.PathLike[str] | int, limit: int) -> list[str]:
        """The last `limit` worker actions of a stored transcript (a path, or a descriptor the store
        opened and checked), oldest first, each sanitised and bounded."""
        from courier.runs.harness.transcript import last_actions

        return last_actions(events_path, limit, self.actions_of, self.line_actions)
