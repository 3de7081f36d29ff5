"""A run's owner starts without the metering relay's modules (docs/benchmarks.md#ray-cluster).

Every run starts an owner, so its imports are paid once per run; the relay (http, email, ssl)
is needed only by a run through a provider with a budget or a usage-limit wait in force.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests_support import imported_modules

RELAY_ONLY = ("http.client", "http.server", "email.utils", "ssl", "courier.runs.meter")


def test_the_owner_imports_no_relay_module_until_a_run_needs_the_relay(tmp_path: Path) -> None:
    names, done = imported_modules(["-c", "import courier.runs.owner"], dict(os.environ), tmp_path)
    assert done.returncode == 0, done.stderr
    assert "courier.runs.owner" in names
    assert sorted(names & set(RELAY_ONLY)) == []
