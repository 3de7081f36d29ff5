"""The fleet page's counts, kinds, pages and times, and the review's follow-up task (docs/ui.md), as pages.py and
actions.py render them; tests/integration/test_ui_browser.py shows them in a real browser."""

from __future__ import annotations

import re
from datetime import timedelta

from tests_support import sample_record

from courier.runs.store import render
from courier.ui import actions, pages
from courier.ui.asks import FleetView
from courier.ui.diffview import Hunk, Line
from protocol.models import Result
from protocol.timestamps import rfc3339, utc_now


def _run(state: str = "running", **fields: object) -> Result:
    return render(sample_record(state=state, **fields))


def _ended(state: str, **fields: object) -> Result:
    return _run(state, finished_at=rfc3339(utc_now()), exit_code=0, **fields)


def test_each_kind_is_counted_and_coloured_and_a_stop_on_request_is_its_own_kind() -> None:
    results = [_ended("completed"), _ended("completed"), _ended("failed", failure="exit 1"),
               _ended("failed", failure="stopped on request at 2026-12-04T10:00:00.000Z")]  # fmt: skip
    html = pages.fleet_fragment("/s/k", FleetView(rows=[], results=results), "", "")
    counts = dict(re.findall(r'data-kind="(\w+)"><a href="[^"]*">\w+ <b>(\d+)</b>', html))
    assert counts["completed"] == "2" and counts["failed"] == "1" and counts["stopped"] == "1"
    assert counts["running"] == "0"  # the main kinds are always shown, with 0
    assert html.count('class="state kind-stopped"') == 1 and html.count('data-kind="completed"') == 3
    stopped = pages.fleet_fragment("/s/k", FleetView(rows=[], results=results), "stopped", "")
    assert stopped.count("<tr data-ref") == 1  # the state filter takes a kind


def test_a_hundred_runs_a_page_newest_first_and_the_pager_links_carry_the_filters() -> None:
    results = [_ended("completed") for _ in range(230)]
    view = FleetView(rows=[], results=results)
    first = pages.fleet_fragment("/s/k", view, "completed", "@local")
    assert first.count("<tr data-ref") == 100 and 'data-page="1" data-pages="3"' in first
    assert 'rel=next href="/s/k/?state=completed&amp;machine=%40local&amp;page=2"' in first
    last = pages.fleet_fragment("/s/k", view, "completed", "@local", page_number=3)
    assert last.count("<tr data-ref") == 30 and "rel=prev" in last and "rel=next" not in last
    assert results[-1].agent_id in last and results[0].agent_id not in last
    beyond = pages.fleet_fragment("/s/k", view, "completed", "@local", page_number=99)
    assert beyond == last  # past the end: the last page


def test_the_row_names_its_worktree_and_says_how_long_ago_it_started_with_the_time_in_its_title() -> None:
    started = utc_now() - timedelta(minutes=5, seconds=3)
    view = FleetView(rows=[], results=[_run(started_at=rfc3339(started), worktree="fix-login")])
    html = pages.fleet_fragment("/s/k", view, "", "")
    assert "<td>fix-login</td>" in html
    found = re.search(r'<time datetime="([^"]+)" title="([^"]+)">([^<]+)</time>', html)
    assert found and found.group(3) == "5m ago" and re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", found.group(2))
    assert [pages.relative_words(s) for s in (0, 59, 60, 3599, 3600, 86400 * 3)] == [
        "0s ago", "59s ago", "1m ago", "59m ago", "1h ago", "3d ago",
    ]  # fmt: skip


def test_each_diff_line_is_numbered_where_a_comment_would_point() -> None:
    kinds = [("ctx", "a"), ("del", "b"), ("add", "c"), ("add", "d"), ("ctx", "e"), ("note", "\\ No newline")]
    hunk = Hunk("@@ -10,3 +10,4 @@ def f():", [Line(kind, text) for kind, text in kinds])
    assert pages.line_numbers(hunk) == ["10", "11 (removed)", "11", "12", "13", None]


def test_the_review_task_is_the_comments_in_page_order_then_the_free_text() -> None:
    form = {"c src/app.py:12": "rename this\r\n", "c src/app.py:40 (removed)": "  ", "task": "Then run the tests.",
            "c tests/test_app.py:3": "add a case"}  # fmt: skip
    assert actions.review_task(form) == (
        "src/app.py:12: rename this\ntests/test_app.py:3: add a case\n\nThen run the tests."
    )
    assert actions.review_task({"task": "only text"}) == "only text"
