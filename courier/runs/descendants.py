"""Every process a worker left behind, found by its ancestry, and ended (docs/runs.md#the-owner, issue: `setsid`
escapes the group).

A worker's child may leave the worker's process group and session (`setsid`), so signalling
the group misses it. The owner makes itself a child subreaper (Linux), so such a process, once
its parent exits, is re-parented to the owner instead of to init: every process the worker
ever started stays a descendant of the owner until it exits. Elsewhere the owner tracks the
descendants it saw in repeated scans. Either way they are found by walking parent links.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING

from courier.runs import process

if TYPE_CHECKING:
    from protocol.models import ListWarning

_PR_SET_CHILD_SUBREAPER = 36
_IS_LINUX = sys.platform.startswith("linux")
_SCAN_INTERVAL_S = 0.2


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux prctl); False where that is not available."""
    if not _IS_LINUX:
        return False
    import ctypes  # only the owner needs it; status and list import this module too

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _parents() -> dict[int, int]:
    """pid → parent pid of every live (non-zombie) process."""
    parents: dict[int, int] = {}
    if _IS_LINUX:
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as handle:
                    raw = handle.read()
            except OSError:
                continue
            fields = raw[raw.rfind(b")") + 2 :].split()
            if len(fields) > 1 and fields[0] not in (b"Z", b"X"):
                parents[int(entry.name)] = int(fields[1])
        return parents
    import psutil

    for proc in psutil.process_iter(["pid", "ppid", "status"]):
        if proc.info["status"] != psutil.STATUS_ZOMBIE:
            parents[proc.info["pid"]] = proc.info["ppid"]
    return parents


_children_listed: bool | None = None


def _kernel_lists_children() -> bool:
    """Whether /proc lists each thread's children (CONFIG_PROC_CHILDREN, on in the usual distribution kernels)."""
    global _children_listed
    if _children_listed is None:
        _children_listed = _IS_LINUX and os.path.exists("/proc/thread-self/children")
    return _children_listed


def _children_of(pid: int) -> list[int]:
    """The children of `pid`, from the children lists of its threads (a child may be any thread's); none when gone."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    children: list[int] = []
    for thread in threads:
        try:
            with open(f"/proc/{pid}/task/{thread}/children", "rb") as handle:
                children += [int(child) for child in handle.read().split()]
        except (OSError, ValueError):
            continue  # a thread that has ended
    return children


def _children_by_parent() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for pid, parent in _parents().items():
        children.setdefault(parent, []).append(pid)
    return children


def of(root: int) -> dict[int, str]:
    """The live descendants of `root` (not root itself), each with its start token.

    Where the kernel lists each process's children, the walk reads only the tree's own
    processes; elsewhere it reads every process's parent once. An owner asks this at each run's
    end, when its tree is usually empty and the machine may run hundreds of processes.
    """
    if _kernel_lists_children():
        children_of = _children_of
    else:
        by_parent = _children_by_parent()

        def children_of(pid: int) -> list[int]:
            return by_parent.get(pid, [])

    found: dict[int, str] = {}
    stack = children_of(root)
    while stack:
        pid = stack.pop()
        if pid in found or pid == root:
            continue
        token = process.start_token(pid)
        if token is None:
            continue  # gone, or a zombie: its children, if any, were given to a reaper
        found[pid] = token
        stack.extend(children_of(pid))
    return found


class Tracker:
    """Descendants of one root seen in any scan, kept by identity, so one re-parented to init
    after its parent exited is still ended (where the owner cannot be a subreaper)."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.seen: dict[int, str] = {}

    def scan(self) -> None:
        self.seen.update(of(self.root))

    def alive(self, exclude: frozenset[int] = frozenset()) -> dict[int, str]:
        self.scan()
        return {
            pid: token for pid, token in self.seen.items() if pid not in exclude and process.same_process(pid, token)
        }

    def end(self, grace: float, exclude: frozenset[int] = frozenset()) -> tuple[list[int], list[int]]:
        """SIGTERM every live tracked descendant, SIGKILL what is left after `grace`.
        Returns (the pids found, the pids still alive afterwards)."""
        found = self.alive(exclude)
        if not found:
            return [], []
        _signal_all(found, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and self.alive(exclude):
            time.sleep(0.02)
        # New ones may have been started meanwhile: alive() rescans.
        left = self.alive(exclude)
        _signal_all(left, signal.SIGKILL)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and (left := self.alive(exclude)):
            time.sleep(0.02)
        _reap(set(found) | set(left))
        return sorted(set(found) | set(left)), sorted(left)

    def watch(self, running: threading.Event) -> None:
        """Where the owner cannot adopt orphans, scan while `running` is set (a daemon thread)."""

        def loop() -> None:
            while running.is_set():
                with contextlib.suppress(Exception):
                    self.scan()
                time.sleep(_SCAN_INTERVAL_S)

        threading.Thread(target=loop, daemon=True).start()


def track_worker_tree() -> Tracker:
    """For the owner, before it starts the worker: every later process it has is the worker's."""
    tracker = Tracker(os.getpid())
    if not become_subreaper():
        running = threading.Event()
        running.set()
        tracker.watch(running)
    return tracker


def _signal_all(members: dict[int, str], signum: int) -> None:
    for pid, token in members.items():
        # The identity is re-checked just before each signal, so a reused PID is never hit.
        if process.same_process(pid, token):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)


def _reap(pids: set[int]) -> None:
    """Collect the ones re-parented to us (a subreaper), so none stays a zombie of the owner."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def of_run(
    owner_pid: int | None, owner_token: str | None, worker_pid: int | None, worker_token: str | None
) -> dict[int, str]:
    """For stop: the processes a live worker has started, including those that left its group.
    While the worker lives, everything under its owner (their subreaper) is the worker's; once
    it has exited the owner ends what is left itself (and may be running git), so nothing."""
    if not worker_pid or not process.same_process(worker_pid, worker_token):
        return {}
    if owner_pid and process.same_process(owner_pid, owner_token):
        return of(owner_pid)
    return of(worker_pid)


def end(members: dict[int, str], grace: float) -> list[int]:
    """SIGTERM the members still alive, SIGKILL them after `grace`; the pids that survived."""

    def alive() -> dict[int, str]:
        return {pid: token for pid, token in members.items() if process.same_process(pid, token)}

    _signal_all(alive(), signal.SIGTERM)
    process.wait_until(lambda: not alive(), grace)
    _signal_all(alive(), signal.SIGKILL)
    process.wait_until(lambda: not alive(), 2.0)
    return sorted(alive())


def survivor_warnings(agent_id: str, survivors: list[int]) -> list[ListWarning] | None:
    """Stop's report of processes that outlived SIGKILL (they travel as the reply's warnings)."""
    from protocol.models import ListWarning

    return [
        ListWarning(agent_id=agent_id, error=f"process {pid} started by the worker survived SIGKILL")
        for pid in survivors
    ] or None


def describe(found: list[int], left: list[int]) -> list[str]:
    """harness_diagnostics lines for what `Tracker.end` did."""
    lines = []
    if found:
        listed = ", ".join(str(pid) for pid in found[:20])
        lines.append(f"ended {len(found)} process(es) the worker left running (pids {listed})")
    if left:
        listed = ", ".join(str(pid) for pid in left[:20])
        lines.append(f"{len(left)} process(es) the worker started survived SIGKILL (pids {listed})")
    return lines
