"""The head's keeper: a long-lived Ray driver that creates the head node's service (docs/ray.md#the-keeper).

In Ray an actor belongs to the job of the driver that created it, and so does every task
that actor submits. The head's `NodeService` submits every run's holder task; when the
driver that created it was a receiver that has since exited (they all exit), its job is
finished, and Ray ends each worker of a finished job as soon as it goes idle: every holder
then starts a new worker process (an interpreter importing Ray and wb, about 1 s of CPU) and
the reuse of pooled workers is lost. The keeper is the driver that stays: it joins the
cluster, creates the head's service, and waits until the cluster goes away.

One keeper per head home: it holds an exclusive lock on `<home>/ray/keeper.lock` for its
whole life. `ensure_keeper` (called when a process on the head joins the cluster) starts one,
detached, when nobody holds the lock, and waits until the head's service exists.

The keeper process itself is courier/executor/ray_keeper_process.py, run as
`python -m courier.executor.ray_keeper_process ADDRESS` with the head's environment.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

KEEPER_READY_S = 30.0  # how long a process on the head waits for a keeper it started


def lock_path(home: Path) -> Path:
    directory = home / "ray"
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    return directory / "keeper.lock"


def _held(home: Path) -> bool:
    """Whether a live keeper holds the lock (a lock is released with its process)."""
    fd = hold_lock(home)
    if fd is None:
        return True
    os.close(fd)  # closing releases the lock taken to look
    return False


def ensure_keeper(home: Path, address: str, head_service_exists: Callable[[], bool] | None = None) -> None:
    """Start the head's keeper unless one runs; with `head_service_exists`, then wait (bounded)
    until the head's service exists.

    A keeper that cannot start costs only speed: the caller then creates the service itself.
    """
    if _held(home):
        return
    with open(os.devnull, "r+b") as null:
        subprocess.Popen(  # this interpreter, this module, the cluster's address: no shell, no task
            [sys.executable, "-m", "courier.executor.ray_keeper_process", address],
            stdin=null,
            stdout=null,
            stderr=null,
            start_new_session=True,  # not in the caller's process group: it outlives the caller
            close_fds=True,
            cwd="/",
        )
    if head_service_exists is None:
        return
    deadline = time.monotonic() + KEEPER_READY_S
    while time.monotonic() < deadline and not head_service_exists():
        time.sleep(0.1)


def hold_lock(home: Path) -> int | None:
    """The keeper's lock, taken for the life of this process (its descriptor), or None when another keeper has it."""
    fd = os.open(lock_path(home), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd
