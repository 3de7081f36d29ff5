"""The README's first command on a machine whose python3 refuses `pip install` (PEP 668).

A fresh Debian 12 or Ubuntu 24.04 has only the system python3, which refuses to install
packages outside a virtual environment, and may lack `python3-venv`. Both are emulated by a
`python3` on PATH that wraps this interpreter's base: it refuses `-m pip install` outside a
venv with pip's own error, and (for the second test) makes a venv without pip and fails, as
Debian's python does until `apt-get install python3-venv`, which a stub `apt-get` "installs".
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT

BASE_PYTHON = Path(getattr(sys, "_base_executable", sys.executable)).resolve()
# The scripts install wb and run `wb demo`, which always runs cold: the WB_COURIER=off pass alone
# runs this module (tests/conftest.py).
pytestmark = pytest.mark.courier_independent(cold=True)

PEP668_PYTHON = """#!/bin/sh
# The system python3 of Debian 12 / Ubuntu 24.04: no `pip install` outside a venv.
echo "python3 $*" >> {log}
case " $* " in
  *" -m pip install "*)
    echo "error: externally-managed-environment" >&2
    exit 1 ;;
  *" -m venv "*)
    if [ ! -e {venv_marker} ]; then
      # As Debian without python3-venv: a venv without pip is left behind, then the error.
      {python} -m venv --without-pip "$3" >/dev/null 2>&1
      echo "The virtual environment was not created successfully because ensurepip is not available." >&2
      exit 1
    fi ;;
esac
exec {python} "$@"
"""

STUB_APT = """#!/bin/sh
echo "apt-get $*" >> {log}
case "$1" in install) touch {venv_marker} ;; esac
"""


def _checkout_copy(dest: Path) -> Path:
    """The repository's files (tracked and new, not ignored) copied to `dest`, without any .venv."""
    names = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO_ROOT, capture_output=True, check=True,
    ).stdout.split(b"\0")  # fmt: skip
    for raw in filter(None, names):
        source = REPO_ROOT / os.fsdecode(raw)
        if not source.is_file():  # deleted in the work tree
            continue
        target = dest / os.fsdecode(raw)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    return dest


def _system_bin(base: Path, *, venv_missing: bool) -> tuple[Path, Path]:
    """A PATH directory, ahead of /usr/bin, with a PEP 668 python3 and a stub apt-get; returns it and the call log."""
    bin_dir = base / "bin"
    bin_dir.mkdir()
    log = base / "calls.log"
    git = shutil.which("git")
    assert git is not None
    (bin_dir / "git").symlink_to(git)
    python = bin_dir / "python3"
    python.write_text(PEP668_PYTHON.format(log=log, venv_marker=base / "venv-installed", python=BASE_PYTHON))
    python.chmod(0o755)
    if not venv_missing:
        (base / "venv-installed").touch()
    apt = bin_dir / "apt-get"
    apt.write_text(STUB_APT.format(log=log, venv_marker=base / "venv-installed"))
    apt.chmod(0o755)
    return bin_dir, log


def _env(base: Path, bin_dir: Path) -> dict[str, str]:
    home = base / "home"
    home.mkdir()
    tmp = base / "tmp"
    tmp.mkdir()
    env = {"HOME": str(home), "PATH": f"{bin_dir}:/usr/bin:/bin", "LANG": "C.UTF-8", "TMPDIR": str(tmp)}
    # pip's index settings and proxies are the machine's, not the user's (a package registry may be local).
    env.update({k: v for k, v in os.environ.items() if k.startswith("PIP_") or k.lower().endswith("_proxy")})
    return env


def test_demo_script_installs_wb_into_a_venv_where_pip_may_not_install(tmp_path: Path) -> None:
    repo = _checkout_copy(tmp_path / "repo")
    bin_dir, log = _system_bin(tmp_path, venv_missing=False)
    done = subprocess.run(
        ["bash", "scripts/demo.sh"], cwd=repo, env=_env(tmp_path, bin_dir), capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "externally-managed-environment" not in done.stderr
    assert (repo / ".venv" / "bin" / "python").exists()
    assert "demo:agt-" in done.stdout  # the demo ran, with the venv's wb
    calls = log.read_text()
    assert "-m pip install" not in calls  # only the venv's pip installed anything
    # A first run is never silent while it installs: one line before each step, in order.
    steps = [
        "creating the virtual environment .venv (python3 -m venv)",
        "installing wb and its dependencies (pip install -e .) with .venv/bin/python",
        "compiling wb's bytecode (python -m compileall courier protocol)",
        "running the demo (wb demo)",
    ]
    lines = done.stdout.splitlines()
    assert all(step in lines for step in steps), done.stdout[:2000]
    assert [lines.index(step) for step in steps] == sorted(lines.index(step) for step in steps)
    assert lines.index(steps[-1]) < next(i for i, line in enumerate(lines) if "demo:agt-" in line)


def test_a_missing_python3_venv_is_installed_with_apt_and_the_broken_venv_replaced(tmp_path: Path) -> None:
    repo = _checkout_copy(tmp_path / "repo")
    bin_dir, log = _system_bin(tmp_path, venv_missing=True)
    script = ". scripts/venv.sh && _wb_make_venv && .venv/bin/python -m pip --version"
    done = subprocess.run(
        ["bash", "-c", script], cwd=repo, env=_env(tmp_path, bin_dir), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    calls = log.read_text().splitlines()
    assert "apt-get update -qq" in calls
    minor = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert f"apt-get install -y -qq python3-venv python{minor}-venv" in calls
    assert calls.index("apt-get update -qq") < calls.index(f"apt-get install -y -qq python3-venv python{minor}-venv")
    assert done.stdout.splitlines()[-1].startswith("pip ")  # the venv made after apt-get has a working pip


def test_test_script_uses_the_venv_python_when_there_is_one(tmp_path: Path) -> None:
    repo = _checkout_copy(tmp_path / "repo")
    venv_bin = repo / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    fake = venv_bin / "python"
    fake.write_text(f'#!/bin/sh\necho "venv python $*" > {tmp_path / "used"}\n')
    fake.chmod(0o755)
    done = subprocess.run(["bash", "scripts/test.sh", "-q", "x"], cwd=repo, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "used").read_text() == "venv python -m pytest -p no:cacheprovider -q x\n"
