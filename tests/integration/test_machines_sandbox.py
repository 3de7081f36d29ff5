"""`wb machines --check` shows whether each machine can confine a run (docs/cli.md, wb machines).

Two loopback machines reached over `exec` (`env -i … wb`, as tests/integration/exec_machines.py
makes them): the real bubblewrap is on one receiver's PATH and hidden from the other's.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from tests.json_documents import check_output

WB = str(Path(sys.executable).parent / "wb")


def _machine(root: Path, path_env: str) -> dict[str, object]:
    root.mkdir(mode=0o700)
    for sub in ("home", "wbhome", "projects"):
        (root / sub).mkdir(mode=0o700)
    argv = [
        "env",
        "-i",
        f"HOME={root / 'home'}",
        f"WB_HOME={root / 'wbhome'}",
        f"WB_PROJECTS_ROOT={root / 'projects'}",
        f"WB_CONFIG={root / 'wb.yaml'}",
        f"PATH={path_env}",
    ]
    return {"exec": {"argv": argv, "wb_path": WB}}


def _installed_bwrap_version() -> str:
    found = shutil.which("bwrap")
    assert found, "bubblewrap is part of the test machine (docs/security.md#confined-runs)"
    return subprocess.run([found, "--version"], capture_output=True, text=True, check=True).stdout.split()[-1]


def test_machines_check_shows_bwrap_or_why_not_per_machine(tmp_path: Path) -> None:
    without_bwrap = tmp_path / "bare-bin"  # the receiver finds nothing at all on this PATH
    without_bwrap.mkdir()
    config_dir = tmp_path / "config"
    config_dir.mkdir(mode=0o700)
    config = config_dir / "wb.yaml"
    targets = {
        "confined": _machine(tmp_path / "confined", "/usr/local/bin:/usr/bin:/bin"),
        "bare": _machine(tmp_path / "bare", str(without_bwrap)),
    }
    config.write_text(yaml.safe_dump({"session_move": {"targets": targets}}))
    config.chmod(0o600)
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "WB_HOME": str(tmp_path / "caller-home"),
        "WB_CONFIG": str(config),
    }

    def wb(*args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "courier.main", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        check_output(args, done)  # the --json rows follow docs/schema/machines.json
        return done

    done = wb("machines", "--check", "--json", "--machine-timeout", "60s")
    assert done.returncode == 0, done.stderr
    rows = {row["machine"]: row for row in json.loads(done.stdout)}
    assert rows["confined"]["sandbox"] == f"bwrap {_installed_bwrap_version()}"
    assert rows["bare"]["sandbox"] == "none: bubblewrap not found"

    text = wb("machines", "--check", "--machine-timeout", "60s")
    assert text.returncode == 0, text.stderr
    header, *lines = text.stdout.splitlines()
    assert header.split()[-2:] == ["SANDBOX", "ERROR"]
    column = header.index("SANDBOX")  # the last column but ERROR, empty on a healthy row
    cells = {line.split()[0]: line[column:].strip() for line in lines}
    assert cells == {"bare": "none: bubblewrap not found", "confined": f"bwrap {_installed_bwrap_version()}"}

    unchecked = wb("machines", "--json")
    assert [row["sandbox"] for row in json.loads(unchecked.stdout)] == [None, None]
