"""asyncssh is imported without gcc and ld runs for a liboqs that is not here (courier/channels/asyncssh_import.py).

A `gcc`, `cc` and `ld` first on PATH log each run: find_library starts them for a name the
linker's cache does not hold, so a log line means the probe ran.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="find_library runs compilers on Linux only"
)

KEX = "import asyncssh.kex; print(b' '.join(asyncssh.kex.get_kex_algs()).decode())"


@pytest.fixture
def logging_toolchain(tmp_path: Path) -> tuple[dict[str, str], Path]:
    bin_dir, log = tmp_path / "bin", tmp_path / "toolchain.log"
    bin_dir.mkdir()
    for name in ("gcc", "cc", "ld"):
        tool = bin_dir / name
        tool.write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\nexit 1\n')
        tool.chmod(0o755)
    env = {key: value for key, value in os.environ.items() if key not in ("LD_LIBRARY_PATH", "LIBRARY_PATH")}
    env["PATH"] = f"{bin_dir}:{env.get('PATH', '/usr/bin:/bin')}"
    return env, log


def _python(code: str, env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_ssh_module_imports_asyncssh_without_running_gcc_or_ld(
    logging_toolchain: tuple[dict[str, str], Path],
) -> None:
    env, log = logging_toolchain
    if Path("/etc/ld.so.cache").is_file() and b"liboqs.so" in Path("/etc/ld.so.cache").read_bytes():
        pytest.skip("liboqs is installed here: the real probe is meant to run")
    _python("import courier.channels.ssh_client", env)
    assert not log.exists(), log.read_text()
    # The same import without wb's module does run them: what the test watches is real.
    _python("import asyncssh", env)
    assert "-loqs" in log.read_text()


def test_a_library_that_could_be_there_is_still_asked_of_the_real_probe(
    logging_toolchain: tuple[dict[str, str], Path], tmp_path: Path
) -> None:
    env, log = logging_toolchain
    libs = tmp_path / "libs"
    libs.mkdir()
    (libs / "liboqs.so").write_bytes(b"")
    _python("import courier.channels.ssh_client", {**env, "LD_LIBRARY_PATH": str(libs)})
    assert "-loqs" in log.read_text()


def test_asyncssh_offers_the_same_key_exchanges_either_way(logging_toolchain: tuple[dict[str, str], Path]) -> None:
    env, _ = logging_toolchain
    plain = _python(KEX, {**env, "PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    assert _python(f"import courier.channels.ssh_client\n{KEX}", env) == plain
    assert "mlkem768x25519-sha256" in plain or "curve25519-sha256" in plain


def test_importing_asyncssh_as_wb_does_prints_nothing() -> None:
    """cryptography 51 warns about DSA once per name asyncssh's import touches: none of it reaches stderr."""
    for module in ("courier.channels.ssh_client", "courier.demo.sshd"):
        done = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stderr == "", f"{module}: {done.stderr}"
