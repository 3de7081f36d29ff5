"""EventSummary, worker_actions and final_message against real Codex 0.169.0 transcripts (docs/runs.md#terminal-state;
docs/runs.md#summaries)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from courier.runs.harness.codex import EventSummary, final_message, worker_actions
from protocol.models import Usage

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "codex-0.169.0"


def summarize(name: str) -> EventSummary:
    summary = EventSummary()
    with open(FIXTURES / name, "rb") as handle:
        for line in handle:
            summary.feed(line)
    return summary


def line(event: dict[str, Any]) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode() + b"\n"


def completed(item_id: str, item_type: str, **fields: Any) -> bytes:
    return line({"type": "item.completed", "item": {"id": item_id, "type": item_type, **fields}})


def write_events(path: Path, *lines: bytes) -> Path:
    path.write_bytes(b"".join(lines))
    return path


def test_fixtures_are_the_captured_transcripts_unchanged() -> None:
    """Every transcript here is pinned by SHA256SUMS (see the fixtures' README), and every one is pinned."""
    import hashlib

    pinned = {}
    for entry in (FIXTURES / "SHA256SUMS").read_text().splitlines():
        digest, name = entry.split(maxsplit=1)
        pinned[name.lstrip("*")] = digest
    assert sorted(pinned) == sorted(path.name for path in FIXTURES.glob("*.jsonl"))
    for name, digest in pinned.items():
        assert hashlib.sha256((FIXTURES / name).read_bytes()).hexdigest() == digest, name


# --------------------------------------------------------------------------- EventSummary on real transcripts


def test_shell_transcript() -> None:
    summary = summarize("shell.jsonl")
    assert summary.turn_completed and not summary.turn_failed
    assert summary.thread_id == "01a226ce-ee35-7723-a578-b7ab309663df"
    assert summary.usage == Usage(
        input_tokens=3200, cached_input_tokens=1500, cache_write_input_tokens=0, output_tokens=55,
        reasoning_output_tokens=16,
    )  # fmt: skip
    assert summary.tool_calls == 1
    assert summary.last_agent_message == "The directory contains README.md."
    assert summary.diagnostics == []
    assert summary.failure_message is None


def test_patch_transcript_counts_the_file_change_once() -> None:
    summary = summarize("patch.jsonl")
    assert summary.tool_calls == 1  # item.started is not a call; item.completed is
    assert summary.last_agent_message == "Created hello.txt."
    assert summary.usage is not None and summary.usage.input_tokens == 4900


def test_failed_command_still_counts_and_the_turn_completes() -> None:
    summary = summarize("failcmd.jsonl")
    assert summary.tool_calls == 1
    assert summary.turn_completed and not summary.turn_failed
    assert summary.last_agent_message == "That file does not exist."


def test_multi_keeps_the_last_agent_message() -> None:
    summary = summarize("multi.jsonl")
    assert summary.last_agent_message == "Final answer: README.md only."
    assert summary.tool_calls == 1


def test_simple_and_web_have_no_tool_calls() -> None:
    simple, web = summarize("simple.jsonl"), summarize("web.jsonl")
    assert simple.tool_calls == 0 and web.tool_calls == 0
    assert simple.last_agent_message == "Hello from the mock model."
    assert web.last_agent_message == "Found it."
    assert web.usage == Usage(
        input_tokens=1000, cached_input_tokens=0, cache_write_input_tokens=0, output_tokens=10,
        reasoning_output_tokens=0,
    )  # fmt: skip


def test_retry_notices_are_diagnostics_and_the_failure_is_the_message() -> None:
    summary = summarize("failed_retry.jsonl")
    assert summary.turn_failed and not summary.turn_completed
    assert summary.failure_message == "stream disconnected before completion: mock upstream exploded"
    assert summary.diagnostics == [
        "Reconnecting... 1/2 (stream disconnected before completion: mock upstream exploded)",
        "Reconnecting... 2/2 (stream disconnected before completion: mock upstream exploded)",
    ]
    assert summary.usage is None and summary.last_agent_message is None


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("http400.jsonl", "The model `nope` does not exist"),
        (
            "http401.jsonl",
            "unexpected status 401 Unauthorized: Incorrect API key provided, "
            "url: http://127.0.0.1:18080/http401-27131/v1/responses",
        ),
    ],
)
def test_http_failures(name: str, message: str) -> None:
    summary = summarize(name)
    assert summary.turn_failed and summary.failure_message == message
    assert summary.diagnostics == []  # the `error` repeating the failure is not a separate diagnostic


def test_interrupted_transcript_has_no_terminal_event() -> None:
    summary = summarize("sigint.jsonl")
    assert not summary.turn_completed and not summary.turn_failed
    assert summary.usage is None and summary.tool_calls == 0


# --------------------------------------------------------------------------- tolerance and bounds


def test_malformed_lines_are_numbered_diagnostics_and_do_not_fail_a_completed_turn() -> None:
    summary = EventSummary()
    for raw in (FIXTURES / "simple.jsonl").read_bytes().splitlines(keepends=True)[:2]:
        summary.feed(raw)
    summary.feed(b"\n")
    summary.feed(b"not json at all \x1b[31m\n")
    summary.feed(b'["an","array"]\n')
    summary.feed(b"\xff\xfe\n")
    summary.feed(b"42\n")
    summary.feed(b"{" * 100_000 + b"\n")  # deep nesting must not crash the parser
    summary.feed(line({"type": "something.new", "whatever": [1, 2]}))
    summary.feed(line({"type": "item.completed", "item": {"id": "item_0", "type": "agent_message", "text": "ok"}}))
    summary.feed(line({"type": "turn.completed", "usage": {"input_tokens": 5, "output_tokens": 1, "extra": 9}}))
    assert summary.turn_completed and not summary.turn_failed
    assert summary.usage == Usage(input_tokens=5, output_tokens=1)
    assert summary.last_agent_message == "ok"
    diagnostics = summary.diagnostics
    assert diagnostics[0] == "malformed event line 4: not json at all  [31m"
    assert diagnostics[1] == 'malformed event line 5: ["an","array"]'
    assert diagnostics[2].startswith("malformed event line 6: ")
    assert diagnostics[3] == "malformed event line 7: 42"
    assert diagnostics[4] == "malformed event line 8: " + "{" * 120
    assert len(diagnostics) == 5


def test_codex_stdin_notice_is_neither_a_diagnostic_nor_a_worker_action(tmp_path: Path) -> None:
    """Real Codex's first stderr line (merged into the stream) stands for nothing (docs/codex-notes.md)."""
    notice = b"Reading additional input from stdin...\n"
    fixture = (FIXTURES / "simple.jsonl").read_bytes()
    summary = EventSummary()
    for raw in (notice + fixture).splitlines(keepends=True):
        summary.feed(raw)
    assert summary.turn_completed
    assert summary.diagnostics == []
    events = write_events(tmp_path / "events.jsonl", notice, fixture)
    plain = write_events(tmp_path / "plain.jsonl", fixture)
    assert worker_actions(events, 50) == worker_actions(plain, 50)
    assert not any("Reading additional input" in action for action in worker_actions(events, 50))
    # Any other text line is still a malformed line.
    other = EventSummary()
    other.feed(b"Reading additional input from stdin... and more\n")
    assert other.diagnostics[0].startswith("malformed event line 1: ")


def test_top_level_errors_without_a_failed_turn_and_item_errors_are_diagnostics() -> None:
    summary = EventSummary()
    summary.feed(line({"type": "error", "message": "Reconnecting... 1/2 (boom)"}))
    summary.feed(completed("item_0", "error", message="Model metadata for `m` not found."))
    summary.feed(line({"type": "turn.completed", "usage": {"input_tokens": 1, "output_tokens": 1}}))
    assert summary.diagnostics == ["Reconnecting... 1/2 (boom)", "Model metadata for `m` not found."]
    assert summary.turn_completed and not summary.turn_failed


def test_usage_is_the_last_turn_completed_and_never_estimated() -> None:
    summary = EventSummary()
    summary.feed(line({"type": "turn.completed", "usage": {"input_tokens": 100, "output_tokens": 10}}))
    usage = {"input_tokens": 300, "cached_input_tokens": 7, "output_tokens": 30}
    summary.feed(line({"type": "turn.completed", "usage": usage}))
    assert summary.usage == Usage(input_tokens=300, cached_input_tokens=7, output_tokens=30)
    assert summary.usage.reasoning_output_tokens is None
    summary.feed(line({"type": "turn.completed"}))
    assert summary.usage is None


def test_tool_calls_count_every_completed_call_whatever_its_status() -> None:
    summary = EventSummary()
    for index, (item_type, status) in enumerate(
        [("command_execution", "declined"), ("file_change", "failed"), ("mcp_tool_call", "completed"),
         ("reasoning", "completed"), ("web_search", "completed"), ("todo_list", "completed")]
    ):  # fmt: skip
        item = {"id": f"item_{index}", "type": item_type, "status": status}
        summary.feed(line({"type": "item.started", "item": item}))
        summary.feed(line({"type": "item.completed", "item": item}))
    assert summary.tool_calls == 3


def test_diagnostics_are_bounded_in_number_and_size() -> None:
    summary = EventSummary()
    summary.feed(line({"type": "error", "message": "é" * 500}))
    for index in range(200):
        summary.feed(line({"type": "error", "message": f"notice {index}"}))
    diagnostics = summary.diagnostics
    assert len(diagnostics) == 50
    assert all(len(text.encode()) <= 240 for text in diagnostics)
    assert diagnostics[0].endswith("…")
    assert diagnostics[-1] == "… and 152 more harness diagnostic(s)"


def test_skipped_oversize_line_is_a_numbered_diagnostic() -> None:
    summary = EventSummary()
    summary.feed(line({"type": "turn.started"}))
    summary.skipped_oversize_line(9 * 1024 * 1024)
    summary.feed(line({"type": "turn.completed", "usage": {"input_tokens": 1, "output_tokens": 1}}))
    assert summary.diagnostics == ["skipped event line 2: 9437184 bytes is over the 8388608-byte line limit"]
    assert summary.turn_completed


def test_failure_message_is_sanitised() -> None:
    summary = EventSummary()
    summary.feed(line({"type": "turn.failed", "error": {"message": "bad\x1b[31m\nthing"}}))
    assert summary.failure_message == "bad [31m thing"


def test_lone_surrogates_from_json_escapes_do_not_break_anything(tmp_path: Path) -> None:
    raw = b'{"type":"error","message":"bad \\ud800 surrogate"}\n'
    summary = EventSummary()
    summary.feed(raw)
    summary.feed(b'{"type":"turn.failed","error":{"message":"also \\udc80"}}\n')
    summary.feed(b'{"type":"item.completed","item":{"id":"item_0","type":"agent_message","text":"x \\ud800"}}\n')
    assert summary.diagnostics == ["bad ? surrogate"]
    assert summary.failure_message == "also ?"
    assert final_message(tmp_path / "absent", summary) == "x ?"
    assert worker_actions(write_events(tmp_path / "e.jsonl", raw), 8) == ["diagnostic: bad ? surrogate"]


# --------------------------------------------------------------------------- worker_actions


def test_worker_actions_of_real_transcripts() -> None:
    assert worker_actions(FIXTURES / "shell.jsonl", 8) == ["ran: /bin/bash -lc ls"]
    assert worker_actions(FIXTURES / "patch.jsonl", 8) == ["changed 1 file"]
    assert worker_actions(FIXTURES / "failcmd.jsonl", 8) == ["ran: /bin/bash -lc 'cat does-not-exist.txt'"]
    assert worker_actions(FIXTURES / "simple.jsonl", 8) == []
    assert worker_actions(FIXTURES / "failed_retry.jsonl", 8) == [
        "diagnostic: Reconnecting... 1/2 (stream disconnected before completion: mock upstream exploded)",
        "diagnostic: Reconnecting... 2/2 (stream disconnected before completion: mock upstream exploded)",
        "diagnostic: stream disconnected before completion: mock upstream exploded",
    ]
    assert worker_actions(FIXTURES / "http401.jsonl", 8) == [
        "diagnostic: unexpected status 401 Unauthorized: Incorrect API key provided, "
        "url: http://127.0.0.1:18080/http401-27131/v1/responses"
    ]


def test_worker_actions_formats(tmp_path: Path) -> None:
    changes = [{"path": f"/w/f{i}", "kind": "add"} for i in range(3)]
    path = write_events(
        tmp_path / "events.jsonl",
        line({"type": "thread.started", "thread_id": "t"}),
        line({"type": "item.completed", "item": {"id": "item_0", "type": "file_change", "changes": changes[:1]}}),
        line({"type": "item.completed", "item": {"id": "item_1", "type": "file_change", "changes": changes}}),
        completed("item_2", "mcp_tool_call", server="docs", tool="search"),
        b"garbage \x07 line\n",
        b"\n",
        line({"type": "error", "message": "Reconnecting... 1/2 (x)"}),
        completed("item_3", "command_execution", command="echo \x1b[31mhi\u202e"),
        line({"type": "turn.completed", "usage": {"input_tokens": 1, "output_tokens": 1}}),
    )  # fmt: skip
    assert worker_actions(path, 8) == [
        "changed 1 file",
        "changed 3 files",
        "called docs.search",
        "diagnostic: malformed event line: garbage   line",
        "diagnostic: Reconnecting... 1/2 (x)",
        "ran: echo  [31mhi ",
    ]
    assert worker_actions(path, 2) == ["diagnostic: Reconnecting... 1/2 (x)", "ran: echo  [31mhi "]
    assert worker_actions(path, 0) == []


def test_worker_actions_cut_at_240_bytes_with_an_ellipsis(tmp_path: Path) -> None:
    command = "echo " + "é" * 300
    path = write_events(
        tmp_path / "events.jsonl",
        line({"type": "item.completed", "item": {"id": "item_0", "type": "command_execution", "command": command}}),
    )
    (action,) = worker_actions(path, 8)
    assert action.startswith("ran: echo éé")
    assert action.endswith("…")
    assert len(action.encode()) <= 240
    assert len(action.encode()) >= 237  # cut on a character boundary, not earlier


def test_worker_actions_without_a_final_newline_and_empty_file(tmp_path: Path) -> None:
    item = {"id": "item_0", "type": "command_execution", "command": "ls"}
    path = write_events(tmp_path / "a.jsonl", line({"type": "item.completed", "item": item}).rstrip(b"\n"))
    assert worker_actions(path, 8) == ["ran: ls"]
    assert worker_actions(write_events(tmp_path / "b.jsonl"), 8) == []
    with pytest.raises(OSError):
        worker_actions(tmp_path / "missing.jsonl", 8)
    (tmp_path / "link.jsonl").symlink_to(path)
    with pytest.raises(OSError):
        worker_actions(tmp_path / "link.jsonl", 8)


def test_worker_actions_read_backwards_across_blocks_and_long_lines(tmp_path: Path) -> None:
    filler = line({"type": "item.completed", "item": {"id": "item_x", "type": "reasoning", "text": "r" * 3_000_000}})
    events = [filler]
    for index in range(40):
        item = {"id": f"item_{index}", "type": "command_execution", "command": f"cmd {index}"}
        events += [line({"type": "item.completed", "item": item}), filler if index % 10 == 0 else b""]
    path = write_events(tmp_path / "events.jsonl", *events)
    assert worker_actions(path, 3) == ["ran: cmd 37", "ran: cmd 38", "ran: cmd 39"]
    assert worker_actions(path, 100) == [f"ran: cmd {index}" for index in range(40)]


def test_worker_actions_on_a_128_mib_transcript_are_fast(tmp_path: Path) -> None:
    import time

    path = tmp_path / "events.jsonl"
    filler = line({"type": "item.completed", "item": {"id": "item_x", "type": "reasoning", "text": "r" * (1 << 20)}})
    with open(path, "wb") as handle:
        item = {"id": "item_0", "type": "command_execution", "command": "first"}
        handle.write(line({"type": "item.completed", "item": item}))
        for _ in range(128):
            handle.write(filler)
        for index in range(8):
            item = {"id": f"item_{index + 1}", "type": "command_execution", "command": f"late {index}"}
            handle.write(line({"type": "item.completed", "item": item}))
    started = time.monotonic()
    assert worker_actions(path, 8) == [f"ran: late {index}" for index in range(8)]
    assert time.monotonic() - started < 0.5  # reads only the tail
    assert worker_actions(path, 9)[0] == "ran: first"  # and still finds the start when asked


# --------------------------------------------------------------------------- final_message


def test_final_message_prefers_the_output_file(tmp_path: Path) -> None:
    summary = summarize("multi.jsonl")
    out = tmp_path / "last-message.txt"
    assert final_message(out, summary) == "Final answer: README.md only."  # no file: the last agent message
    out.write_text("")
    assert final_message(out, summary) == "Final answer: README.md only."  # empty file: same
    out.write_text("From the -o file.")
    assert final_message(out, summary) == "From the -o file."
    assert final_message(tmp_path / "none", EventSummary()) is None


def test_final_message_is_bounded_with_a_note(tmp_path: Path) -> None:
    summary = EventSummary()
    long_text = "é" * 5000  # 10,000 bytes
    summary.feed(line({"type": "item.completed", "item": {"id": "item_0", "type": "agent_message", "text": long_text}}))
    from_events = final_message(tmp_path / "absent", summary)
    out = tmp_path / "last-message.txt"
    out.write_text(long_text)
    from_file = final_message(out, summary)
    for message in (from_events, from_file):
        assert message is not None
        body, note = message.split("\n[", 1)
        assert body == "é" * 2048  # 4096 bytes, cut on a character boundary
        assert note == "… truncated: the final message was 10000 bytes]"
    exact = "a" * 4096
    out.write_text(exact)
    assert final_message(out, summary) == exact


def test_final_message_does_not_follow_symlinks_or_block_on_fifos(tmp_path: Path) -> None:
    import os

    summary = summarize("simple.jsonl")
    secret = tmp_path / "secret"
    secret.write_text("not for you")
    link = tmp_path / "link.txt"
    link.symlink_to(secret)
    assert final_message(link, summary) == "Hello from the mock model."
    fifo = tmp_path / "fifo.txt"
    os.mkfifo(fifo)
    assert final_message(fifo, summary) == "Hello from the mock model."


def test_worker_actions_do_not_accumulate_an_oversize_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from protocol import limits

    monkeypatch.setattr(limits, "EVENT_LINE_MAX_BYTES", 1000)
    path = write_events(
        tmp_path / "events.jsonl",
        completed("item_0", "command_execution", command="before"),
        b"x" * 3_000_000 + b"\n",
        completed("item_1", "command_execution", command="after"),
    )
    assert worker_actions(path, 8) == ["ran: before", "diagnostic: event line over 1000 bytes", "ran: after"]


def test_a_secret_straddling_the_cut_is_masked_before_cutting(tmp_path: Path) -> None:
    secret = b"sk-live-abcdefghijklmnop"
    message = tmp_path / "last.txt"
    message.write_bytes(b"x" * 4090 + secret + b"tail" * 10)
    text = final_message(message, EventSummary(), secret=secret, mask=b"[redacted]")
    assert text is not None and "truncated" in text
    assert not any(secret[:n].decode() in text for n in range(6, len(secret) + 1))
