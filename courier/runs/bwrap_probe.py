"""Whether bubblewrap can confine a worker on this machine (docs/security.md): found on PATH, and able to
make the namespaces a confined run uses. Asked by the owner before each run and by `version` for
`wb machines --check`.

A found `bwrap` is not enough: Ubuntu 24.04's AppArmor, a container without user namespaces or a
kernel with them switched off make it fail at start. So the probe runs it once, with the same
namespaces a confined worker gets, and keeps bubblewrap's own first line of refusal as the reason.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from dataclasses import dataclass

_PROBE_TIMEOUT_S = 10.0
# The namespaces of a confined worker (courier/runs/sandbox.py), around a command that only exits.
_TRIAL = ("--unshare-pid", "--unshare-ipc", "--unshare-net", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev")


@dataclass(frozen=True)
class BwrapProbe:
    """`path` and `version` when bubblewrap is usable here; else `reason` says why not."""

    path: str | None = None
    version: str | None = None
    reason: str | None = None

    @property
    def usable(self) -> bool:
        return self.reason is None

    def describe(self) -> str:
        """`bwrap 0.8.0`, or `none: <why>` (the `sandbox` column of `wb machines --check`)."""
        return f"bwrap {self.version}" if self.usable else f"none: {self.reason}"


def probe(path_env: str | None = None) -> BwrapProbe:
    """Look for a usable bubblewrap on `path_env` (default: this process's PATH)."""
    return _probe(path_env, True)


def usable(path_env: str | None = None) -> BwrapProbe:
    """As `probe`, without asking its version (`version` is None): what a run's start needs, one process fewer."""
    return _probe(path_env, False)


def _probe(path_env: str | None, with_version: bool) -> BwrapProbe:
    found = shutil.which("bwrap", path=path_env)
    if found is None:
        return BwrapProbe(reason="bubblewrap not found")
    try:
        info = os.stat(found)
        identity = (info.st_dev, info.st_ino, info.st_mtime_ns)
    except OSError:
        identity = (0, 0, 0)
    return _trial(found, identity, with_version)


@functools.cache
def _trial(found: str, identity: tuple[int, int, int], with_version: bool) -> BwrapProbe:
    """The probe of one bubblewrap binary as it is (`identity`: a reinstalled one is probed again), kept for the
    process's life: the courier probes each caller's PATH once, and its commands and their runs' owners, copies
    of it, start with the answer (docs/benchmarks.md#dispatch-latency)."""
    del identity  # part of the cache's key only
    try:
        version = (
            subprocess.run([found, "--version"], capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S, check=False)
            if with_version
            else None
        )
        trial = subprocess.run(
            [found, *_TRIAL, "--", "true"],
            capture_output=True,
            text=True,
            timeout=_PROBE_TIMEOUT_S,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return BwrapProbe(path=found, reason=f"bubblewrap could not be run: {exc}")
    if trial.returncode != 0:
        first = next((line.strip() for line in trial.stderr.splitlines() if line.strip()), f"exit {trial.returncode}")
        return BwrapProbe(path=found, reason=f"bubblewrap cannot create namespaces here: {first[:200]}")
    if version is None:
        return BwrapProbe(path=found)
    words = version.stdout.split()
    return BwrapProbe(path=found, version=words[-1] if words else "unknown")
