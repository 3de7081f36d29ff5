"""Pure pieces of the supervisor's loop: follow offsets, diff output parsing, stall text, the upgrade message."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from courier.client.asking import raise_failure, upgrade_message
from courier.errors import Finding, UsageError
from courier.render import silence, state_text
from courier.runs.follow import read_actions
from courier.runs.harness import harness_for
from courier.runs.patch import parse_diff_output
from protocol.models import RemoteResponse
from protocol.timestamps import rfc3339
from tests.tests_support import sample_record

CODEX = harness_for("codex")


def _line(event: dict[str, object]) -> bytes:
    return json.dumps(event).encode() + b"\n"


def _ran(command: str) -> bytes:
    return _line({"type": "item.completed", "item": {"type": "command_execution", "command": command}})


def test_follow_consumes_only_complete_lines_and_resumes_exactly(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(_ran("one") + _ran("two") + _ran("three")[:20])  # the third line is still being written
    actions, offset = read_actions(CODEX, str(path), 0, final=False)
    assert actions == ["ran: one", "ran: two"]
    assert offset == len(_ran("one") + _ran("two"))
    assert read_actions(CODEX, str(path), offset, final=False) == ([], offset)
    path.write_bytes(_ran("one") + _ran("two") + _ran("three") + _ran("four"))
    actions, end = read_actions(CODEX, str(path), offset, final=False)
    assert actions == ["ran: three", "ran: four"] and end == path.stat().st_size


def test_follow_holds_back_codexs_error_echo_until_the_next_event_decides(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    error = _line({"type": "error", "message": "boom"})
    path.write_bytes(_ran("one") + error)
    actions, offset = read_actions(CODEX, str(path), 0, final=False)
    assert actions == ["ran: one"] and offset == len(_ran("one"))  # the error is not consumed yet
    path.write_bytes(_ran("one") + error + _line({"type": "turn.failed", "error": {"message": "boom"}}))
    actions, _ = read_actions(CODEX, str(path), offset, final=False)
    assert actions == ["diagnostic: boom"]  # once, as `logs` shows it
    path.write_bytes(_ran("one") + error)
    assert read_actions(CODEX, str(path), offset, final=True)[0] == ["diagnostic: boom"]  # a terminal run releases it


def test_follow_reports_malformed_lines_as_diagnostics_and_skips_blank_ones(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\n" + b"not json\n" + _ran("x"))
    actions, offset = read_actions(CODEX, str(path), 0, final=False)
    assert actions == ["diagnostic: malformed event line: not json", "ran: x"]
    assert offset == path.stat().st_size


def test_follow_of_a_missing_transcript_is_empty(tmp_path: Path) -> None:
    assert read_actions(CODEX, str(tmp_path / "none"), 0, final=True) == ([], 0)


def test_parse_diff_output_pairs_status_and_counts() -> None:
    output = (
        b":000000 100644 0000000 0000000 A\0new.txt\0:100644 100644 aaa 0000000 M\0b.bin\0"
        b"2\t0\tnew.txt\0-\t-\tb.bin\0\0diff --git a/new.txt b/new.txt\n"
    )
    files, patch = parse_diff_output(output)
    assert [(f.path, f.status, f.insertions, f.deletions, f.binary) for f in files] == [
        ("new.txt", "added", 2, 0, False),
        ("b.bin", "modified", 0, 0, True),
    ]
    assert patch == b"diff --git a/new.txt b/new.txt\n"
    assert parse_diff_output(b"") == ([], b"")


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "0s"), (59.9, "59s"), (60, "1m"), (14 * 60 + 59, "14m"), (7200, "120m")]
)
def test_stall_durations_are_whole_minutes_from_one_minute_and_seconds_below(seconds: float, text: str) -> None:
    assert silence(seconds) == text


def test_a_stalled_running_result_reads_running_stalled() -> None:
    quiet_since = datetime.now(UTC) - timedelta(minutes=14, seconds=5)
    result = sample_record(
        last_output_at=rfc3339(quiet_since), stalled_since=rfc3339(quiet_since + timedelta(minutes=10))
    )
    assert state_text(result) == "running (stalled 14m)"
    assert state_text(sample_record(last_output_at=rfc3339(quiet_since))) == "running"


def test_the_upgrade_message_names_the_machine_the_version_and_the_operation() -> None:
    assert upgrade_message("gpu-box", "0.1.0", "diff") == (
        "machine gpu-box runs wb 0.1.0, which does not support diff; upgrade wb there"
    )
    assert upgrade_message("gpu-box", None, "prune") == (
        "machine gpu-box runs an older wb, which does not support prune; upgrade wb there"
    )


def test_an_unknown_operation_refusal_from_a_peer_becomes_the_upgrade_message_exit_2() -> None:
    refusal = RemoteResponse(
        schema_version=1,
        operation="diff",
        failure='unknown operation "diff": expected one of dispatch, status',
        failure_kind="request",
        wb_version="0.1.0",
    )
    expected = r"^machine box runs wb 0\.1\.0, which does not support diff; upgrade"
    with pytest.raises(UsageError, match=expected) as caught:
        raise_failure("box", refusal, "diff")
    assert caught.value.exit_code == 2
    other = RemoteResponse(schema_version=1, operation="diff", failure="unknown agent run x", failure_kind="not_found")
    with pytest.raises(Finding, match=r"^box: unknown agent run"):
        raise_failure("box", other, "diff")


def test_claude_resumes_its_session_with_the_equals_form(tmp_path: Path) -> None:
    """docs/cli.md, wb agent continue: `--resume=<session>` after the usual flags; an ID that is not one is refused."""
    from courier.runs.harness.claude import claude_argv
    from tests.unit.test_claude_harness import launch

    plain = claude_argv(launch(tmp_path))
    session = "8f2c1d7e-0b4a-4c1e-9d3f-6a5b4c3d2e1f"
    assert claude_argv(launch(tmp_path, resume_session=session)) == [*plain, f"--resume={session}"]
    with pytest.raises(ValueError, match="session ID"):
        claude_argv(launch(tmp_path, resume_session="--dangerously-skip-permissions"))


# -- `logs` and `logs --follow` print the same line for the same worker action (docs/cli.md) ----

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
_NOISE = [b"not json at all", b"", b'["a","json","array"]', b"[STARTUP] Recording metric", b'{"type":"unknown"}']


def _followed(harness_name: str, path: Path, lines: list[bytes]) -> list[str]:
    """What `logs --follow` prints for `lines` written one at a time while the run is live."""
    harness = harness_for(harness_name)
    path.write_bytes(b"")
    printed: list[str] = []
    offset = 0
    for line in lines:
        with path.open("ab") as handle:
            handle.write(line + b"\n")
        actions, offset = read_actions(harness, str(path), offset, final=False)
        printed += actions
    printed += read_actions(harness, str(path), offset, final=True)[0]
    return printed


def _transcripts() -> list[tuple[str, Path]]:
    found = []
    for harness_name, directory in (
        ("claude", "claude-code-2.1.328"),
        ("codex", "codex-0.169.0"),
        ("gemini", "gemini-cli-0.61.0"),
        ("command", "codex-0.169.0"),  # any output: every line but a wb.result is a diagnostic
    ):
        found += [(harness_name, path) for path in sorted((FIXTURES / directory).glob("*.jsonl"))]
    return found


def _name(value: object) -> str:
    return str(getattr(value, "name", value))


@pytest.mark.parametrize(("harness_name", "fixture"), _transcripts(), ids=_name)
def test_logs_and_logs_follow_print_the_same_lines(harness_name: str, fixture: Path, tmp_path: Path) -> None:
    lines = fixture.read_bytes().splitlines()
    # Noise between the events: malformed lines, blank lines, a known stderr line, a result line.
    lines = [*_NOISE, *lines[:2], *_NOISE, *lines[2:], b'{"type":"wb.result","message":"m"}']
    path = tmp_path / "events.jsonl"
    followed = _followed(harness_name, path, lines)
    shown = harness_for(harness_name).worker_actions(str(path), 10_000)
    assert followed == shown
    assert followed  # something to compare


def test_follow_prints_a_command_harness_line_as_logs_does(tmp_path: Path) -> None:
    lines = [b"plain output", b'{"type":"progress"}', b'{"type":"wb.result","message":"done"}']
    assert _followed("command", tmp_path / "events.jsonl", lines) == [
        "diagnostic: plain output",
        'diagnostic: {"type":"progress"}',
    ]


def test_follow_refuses_a_fifo_transcript_as_logs_does(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    os.mkfifo(path, 0o600)
    with pytest.raises(Finding, match=f"{path} is a FIFO; refusing to read it"):
        read_actions(CODEX, str(path), 0, final=True)
