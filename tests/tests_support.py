"""Small builders shared by tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from courier.runs.store import Record, rfc3339, utc_now
from protocol.models import Resolved, Routing
from protocol.refs import new_run_id


def sample_record(**overrides: object) -> Record:
    body: dict[str, object] = dict(
        agent_id=new_run_id(),
        state="running",
        profile="fake",
        resolved=Resolved(
            profile="fake",
            harness="codex",
            provider="mock",
            model="gpt-5.5",
            routing=Routing(base_url="http://127.0.0.1:9/v1", credential_env="TEST_PROVIDER_KEY", wire_api="responses"),
        ),
        repository="acme/widget",
        worktree_mode="new",
        worktree="w1",
        timeout_ms=60_000,
        started_at=rfc3339(utc_now()),
    )
    body.update(overrides)
    return Record.model_validate(body)


def imported_modules(
    argv: list[str], env: dict[str, str], cwd: Path
) -> tuple[set[str], subprocess.CompletedProcess[str]]:
    """The modules `python -X importtime ARGV…` loads (the start-up tests' measure), and the run itself."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *argv], capture_output=True, text=True, env=env, cwd=cwd, timeout=120
    )
    names = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    return names, done


def wb_recording_modules(record: Path, argv: list[str]) -> str:
    """Python source that runs `wb ARGV…` in this interpreter and writes every loaded module's name
    to `record` as the process ends: at exit, or just before the os._exit that the receiver and
    the hot commands end with (courier/main.py: exit_now). For what `-X importtime` cannot see
    (the receiver points its stderr at /dev/null)."""
    return (
        "import atexit, os, sys\n"
        f"def record(): open({str(record)!r}, 'w').write('\\n'.join(sys.modules))\n"
        "atexit.register(record)\n"
        "end = os._exit\n"
        "os._exit = lambda code: (record(), end(code))\n"
        f"sys.argv = ['wb', *{argv!r}]\n"
        "from courier.main import main\n"
        "main()\n"
    )
