"""Go durations, and text rendering that never lets foreign control characters through."""

from __future__ import annotations

import pytest
from tests_support import sample_record

from courier.ops.dispatch import dispatch_line
from courier.ops.list_ import list_lines
from courier.ops.status import status_text
from courier.render import sort_results
from courier.text import clip_bytes, sanitize
from protocol.durations import BadDuration, format_duration_ms, parse_duration_ms
from protocol.models import ChangeSummary, Result


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("0", 0),
        ("90s", 90_000),
        ("30m", 1_800_000),
        ("1h30m", 5_400_000),
        ("500ms", 500),
        ("1.5s", 1500),
        ("-1s", -1000),
        ("168h", 604_800_000),
        ("2h3m4s5ms", 7_384_005),
        ("1000us", 1),
    ],
)
def test_go_durations(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["", "1", "s", "1d", "1h 2m", "h1", "--1s", "1.s.s", "0x10s"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(BadDuration):
        parse_duration_ms(text)


def test_format_duration_round_trips() -> None:
    for ms in (0, 1, 999, 61_000, 3_600_000, 5_400_500):
        assert parse_duration_ms(format_duration_ms(ms)) == ms


def test_sanitize_replaces_controls_bidi_and_zero_width() -> None:
    assert sanitize("a\x1b[2Jb\u202ec\u200bd\x07e\nf") == "a [2Jb c d e f"
    assert sanitize("line1\nline2\x00", keep_newlines=True) == "line1\nline2 "


def test_clip_bytes_never_splits_a_character() -> None:
    clipped = clip_bytes("é" * 300, 240)
    assert len(clipped.encode()) <= 240 and clipped.endswith("…")


def _result(**overrides: object) -> Result:
    from courier.runs.store import render

    return render(sample_record(**overrides)).model_copy(
        update={k: v for k, v in overrides.items() if k in ("machine",)}
    )


def test_status_text_pads_labels_and_sanitises_foreign_text() -> None:
    result = _result(failure="bad\x1b]0;pwned\x07thing", result="done\x1b[31m!")
    text = status_text(result, details=True)
    assert "failure:  bad ]0;pwned thing\n" in text
    assert "result:   done [31m!\n" in text and "\x1b" not in text


def test_status_base_is_the_named_ref_and_its_commit_or_the_commit_alone() -> None:
    sha = "23e5d98cef04" + "0" * 28
    named = status_text(_result().model_copy(update={"base": "main", "base_sha": sha}))
    assert "base:     main (23e5d98cef04)\n" in named
    unnamed = status_text(_result().model_copy(update={"base": None, "base_sha": sha}))
    assert "base:     23e5d98cef04\n" in unnamed and "()" not in unnamed
    empty = status_text(_result().model_copy(update={"base": "", "base_sha": sha}))
    assert "base:     23e5d98cef04\n" in empty
    assert "base:" not in status_text(_result().model_copy(update={"base": None, "base_sha": None}))


def test_list_is_newest_first_with_ties_by_machine_then_id() -> None:
    older = _result(started_at="2026-01-01T00:00:00.000Z")
    newer_local = _result(started_at="2026-02-01T00:00:00Z")
    newer_remote = _result(started_at="2026-02-01T00:00:00.000000000Z", machine="box")
    ordered = sort_results([older, newer_remote, newer_local])
    assert ordered == [newer_local, newer_remote, older]
    assert list_lines([]) == "no dispatched agent runs\n"
    assert list_lines([newer_remote]).startswith(f"box:{newer_remote.agent_id}\tabandoned\tfake\t")


def test_dispatch_line_names_the_worktree_not_its_path() -> None:
    """docs/cli.md#wb-agent-dispatch: `<ref> <state> <location> (<provider>/<model>)`, the location `<machine>:<name>`
    for a remote run."""
    path = "/home/ai/projects/.wb-worktrees/acme/widget/fix-login"
    local = _result(worktree="fix-login", worktree_dir=path, state="running")
    assert dispatch_line(local) == f"{local.agent_id} {local.state} fix-login (mock/gpt-5.5)\n"
    remote = _result(worktree="fix-login", worktree_dir=path, machine="m1")
    assert dispatch_line(remote) == f"m1:{remote.agent_id} {remote.state} m1:fix-login (mock/gpt-5.5)\n"


def test_changes_line_counts_lines_of_every_file() -> None:
    """docs/runs.md#summaries: insertions include new files' lines, so the line no longer says "(tracked files)"."""
    changes = ChangeSummary(files_changed=1, files=["hello.txt"], insertions=1, deletions=0, new_files=1)
    result = _result(changes=changes)
    assert "changes:  1 file changed, +1 -0\n" in status_text(result)
