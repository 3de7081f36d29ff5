"""The courier's log lines are stamped by the one RFC 3339 rule (protocol/timestamps.py): UTC, milliseconds, `Z`."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from courier.channels import ssh_pool as pool
from courier.warm import daemon
from protocol.timestamps import parse_rfc3339, utc_now

STAMPED = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z) courier( \d+)?: the message\n$")


@pytest.mark.parametrize("log", [daemon._log, pool._log], ids=["daemon", "pool"])
def test_a_courier_log_line_starts_with_a_utc_rfc3339_stamp(
    log: Callable[[str], None], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TZ", "America/New_York")  # a local-time stamp would differ from UTC by hours
    before = utc_now()
    log("the message")
    line = capsys.readouterr().err
    found = STAMPED.match(line)
    assert found, line
    assert before.replace(microsecond=0) <= parse_rfc3339(found.group(1)) <= utc_now()
