"""Origin URLs to OWNER/REPO, and signals held across the admission span."""

from __future__ import annotations

import os
import signal

import pytest

from courier.runs.admission import deferred_signals
from courier.runs.worktrees import repository_from_url


@pytest.mark.parametrize(
    "url",
    [
        "git@github.com:acme/widget.git",
        "git@github.com:acme/widget",
        "ssh://git@github.com/acme/widget.git",
        "ssh://git@github.com:2222/acme/widget.git",
        "https://github.com/acme/widget.git",
        "https://github.com/acme/widget/",
        "https://gitlab.example.com/group/acme/widget.git",
        "github.com:acme/widget.git",
    ],
)
def test_origin_urls_name_the_repository(url: str) -> None:
    assert repository_from_url(url) == "acme/widget"


@pytest.mark.parametrize("url", ["", "widget", "https://github.com/", "/srv/git/widget.git", "git@host:../x.git"])
def test_origin_urls_without_a_repository(url: str) -> None:
    assert repository_from_url(url) is None


def test_sigterm_during_admission_is_delivered_after_it() -> None:
    received: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: received.append(signum))
    try:
        with deferred_signals():
            os.kill(os.getpid(), signal.SIGTERM)
            assert received == []  # held: the worktree, record and owner are not half made
        assert received == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)
