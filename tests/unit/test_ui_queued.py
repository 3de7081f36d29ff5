"""`wb ui` shows a queued run of a Ray cluster as the CLI does (docs/ray.md, docs/ui.md).

Its row says what it waits for, the state filter offers `queued`, and its page offers stop
(a queued run may be stopped before it starts), not continue.
"""

from __future__ import annotations

from tests_support import sample_record

from courier.runs.store import render
from courier.ui import pages
from courier.ui.asks import FleetView
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


def test_a_stop_of_a_queued_run_says_it_stopped_before_it_started() -> None:
    """A Ray head answers the stop of a queued run with the state it had, `queued`
    (docs/ray.md#stop-of-a-queued-run); the caller says so in words, not "its worker is already gone"."""
    from courier.ops.stop import stop_document, stop_message
    from protocol.models import StopResult

    stopped = StopResult(agent_id=_queued().agent_id, worker_pid=0, state="queued")
    assert stop_message("lab", stopped) == f"lab:{stopped.agent_id}: stopped before it started"
    document = stop_document("lab", stopped)
    assert (document.message, document.state) == (f"lab:{stopped.agent_id}: stopped before it started", "queued")
