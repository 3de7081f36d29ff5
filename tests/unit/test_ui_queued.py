"""`wb ui` shows a queued run of a Ray cluster as the CLI does (docs/ray.md, docs/ui.md).

Its row says what it waits for, the state filter offers `queued`, and its page offers stop
(a queued run may be stopped before it starts), not continue.
"""

from __future__ import annotations

from tests_support import sample_record

from courier.runs.store import render
from courier.ui import pages
from courier.ui.operations import FleetView
from protocol.models import Result


def _queued() -> Result:
    return render(sample_record(state="queued", queued_for="cpus=2, gpus=1", machine="lab"))


def test_the_fleet_page_shows_what_a_queued_run_waits_for() -> None:
    result = _queued()
    html = pages.fleet_page("/s/k", FleetView(rows=[], results=[result]), state="", machine="")
    assert 'data-state="queued"' in html
    assert "queued (waiting for cpus=2, gpus=1)" in html
    assert '<option value="queued">queued</option>' in html


def test_a_queued_run_can_be_filtered_for_and_stopped_not_continued() -> None:
    result = _queued()
    assert pages.matches(result, "queued", "")
    assert not pages.matches(result, "running", "")
    facts = pages.facts_fragment("/s/k", f"lab:{result.agent_id}", result, None)
    assert "queued (waiting for cpus=2, gpus=1)" in facts
    assert "id=stop" in facts and "id=continue" not in facts
