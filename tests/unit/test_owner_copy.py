"""When a run's owner may be a copy of the dispatching process (docs/runs.md#the-owner)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from courier.runs.process import alone_in_process

PROBE = "from courier.runs.process import command_line_holds as holds; print(holds('fix the bug'), holds('bug'))"


def test_a_task_given_on_the_command_line_is_found_there_and_a_word_of_a_path_is_not() -> None:
    """The copy would show the command line as long as the run lives: a task given as an argument keeps the owner
    a new interpreter; a short task that is only part of another argument (a socket's path) does not."""
    for given in (["--task", "fix the bug"], ["--task=fix the bug"]):
        done = subprocess.run(
            [sys.executable, "-c", PROBE, "/tmp/bug-socket/x.sock", *given], capture_output=True, text=True, check=True
        )
        assert done.stdout.split() == ["True", "False"], given
    done = subprocess.run([sys.executable, "-c", PROBE, "--task-file", "-"], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "False"]


def test_a_process_with_a_second_thread_is_not_copied() -> None:
    import threading

    started, release = threading.Event(), threading.Event()

    def hold() -> None:
        started.set()
        release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        started.wait(10)
        assert not alone_in_process()
    finally:
        release.set()
        thread.join()


def test_the_sandbox_probe_is_kept_for_a_bubblewrap_as_it_is_and_asked_again_when_it_changes(tmp_path: Path) -> None:
    """The courier probes each caller's PATH once and its children inherit the answer (docs/runs.md#the-owner);
    a bubblewrap replaced since (another binary at the same path) is probed again."""
    from courier.runs import bwrap_probe

    fake = tmp_path / "bwrap"
    calls = tmp_path / "calls"
    fake.write_text(f"#!/bin/sh\necho run >> {calls}\nexit 0\n")
    fake.chmod(0o755)
    path_env = str(tmp_path)
    assert bwrap_probe.usable(path_env).usable and bwrap_probe.usable(path_env).usable
    assert calls.read_text().count("run") == 1
    fake.write_text(f"#!/bin/sh\necho run >> {calls}\necho 'bwrap: no namespaces here' >&2\nexit 1\n")
    os.utime(fake, ns=(1, 1))
    refused = bwrap_probe.usable(path_env)
    assert refused.reason == "bubblewrap cannot create namespaces here: bwrap: no namespaces here"
    assert calls.read_text().count("run") == 2


DEFERRED = """
import pydantic
import courier.runs.owner
from courier import deferred_models

def deferred():
    found, pending = [], list(pydantic.BaseModel.__subclasses__())
    while pending:
        model = pending.pop()
        pending.extend(model.__subclasses__())
        if type(model.__pydantic_validator__).__name__ == "MockValSer":
            found.append(model.__name__)
    return found

before = deferred()
deferred_models.build_all()
print(" ".join(sorted(before)), "|", " ".join(deferred()))
"""


def test_a_process_owners_are_copied_from_builds_every_deferred_model_first() -> None:
    """courier/deferred_models.py: what the courier and an owner launcher run before their first copy, so no owner
    builds the sandbox's, the change summary's or a provider's schema itself."""
    done = subprocess.run([sys.executable, "-c", DEFERRED], capture_output=True, text=True, check=True)
    before, _, after = done.stdout.partition("|")
    assert {"Sandbox", "ChangeSummary", "Usage", "Provider"} <= set(before.split())
    assert after.split() == []
