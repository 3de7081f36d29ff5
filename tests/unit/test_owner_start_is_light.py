"""A run's owner starts without the metering relay's modules (docs/benchmarks.md#ray-cluster).

Every run starts an owner, so its imports are paid once per run; the relay (http, email, ssl)
is needed only by a run through a provider with a budget or a usage-limit wait in force.
"""

from __future__ import annotations

import subprocess
import sys

RELAY_ONLY = ("http.client", "http.server", "email.utils", "ssl", "courier.runs.meter")


def test_the_owner_imports_no_relay_module_until_a_run_needs_the_relay() -> None:
    probe = f"import sys, courier.runs.owner; print(sorted(set({RELAY_ONLY!r}) & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout
