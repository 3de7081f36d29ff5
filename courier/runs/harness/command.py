"""The `command` harness (docs/harnesses.md): the profile's own program, its output lines as the transcript.

Each line the program writes (stdout and stderr) is a diagnostic, except a JSON object
`{"type": "wb.result", "message": "<text>"}`, which sets the run's final message (the last
one wins). Success is exit 0. No provider, no model, no credential; it cannot be continued.
"""

from __future__ import annotations

import os
from typing import Any

from courier.runs.harness.interface import EventParser, Harness, Launch
from courier.runs.harness.lines import decode_line, network_refused
from protocol import limits

RESULT_TYPE = "wb.result"


def result_message(event: Any) -> str | None:
    """The message of a `wb.result` object, else None."""
    if isinstance(event, dict) and event.get("type") == RESULT_TYPE and isinstance(event.get("message"), str):
        message: str = event["message"]
        return message
    return None


class CommandLines(EventParser):
    def feed(self, line: bytes) -> bytes:
        self.lines += 1
        if not line or line.isspace():
            return line
        text, event, _ = decode_line(line)
        message = result_message(event)
        if message is not None:
            self.events += 1
            self.last_message = message
        else:
            self.diagnose(text)
        return line

    def event(self, event: dict[str, Any], line: bytes) -> bytes:  # feed handles every line itself
        return line

    def failure(self, exit_code: int | None) -> str | None:
        return None if exit_code == 0 else f"command exited with code {exit_code}"


class Command(Harness):
    """The profile's `command`, run in the worktree with the task on stdin and the allowlisted environment."""

    name = "command"

    def argv(self, launch: Launch) -> list[str]:
        if not launch.command or not os.path.isabs(launch.command[0]):
            raise ValueError("the profile's command must start with an absolute program path")
        return list(launch.command)

    def parser(self) -> CommandLines:
        return CommandLines()

    def actions_of(self, event: dict[str, Any]) -> list[str]:
        return []  # not used: line_actions reads every line itself

    def line_actions(self, line: bytes | None) -> tuple[dict[str, Any] | None, list[str] | None]:
        """Every output line is a `diagnostic:` action, except the `wb.result` lines."""
        if line is None:
            return None, [f"diagnostic: output line over {limits.EVENT_LINE_MAX_BYTES} bytes"]
        if not line or line.isspace():
            return None, []
        text, event, _ = decode_line(line)
        refused = network_refused(event)
        if refused is not None:
            return None, [refused]
        return None, [] if result_message(event) is not None else [f"diagnostic: {text}"]
