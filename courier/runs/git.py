"""Running git safely: one helper that never raises and never lets the user's git setup steer it.

Every call ignores the global and system git config (GIT_CONFIG_GLOBAL=/dev/null,
GIT_CONFIG_NOSYSTEM=1), drops inherited GIT_* variables (GIT_DIR, GIT_INDEX_FILE,
GIT_CONFIG_PARAMETERS, … would redirect it), never prompts (GIT_TERMINAL_PROMPT=0, stdin
from /dev/null, its own session), takes no optional locks (so reading status never
contends with a worker's git), and speaks the C locale (so `--shortstat` parses).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence

from courier.text import clip_bytes, sanitize

# Return codes of results that git itself did not produce.
TIMED_OUT = 124  # as timeout(1): git ran longer than its bound and was killed
NOT_RUN = 127  # as a shell: git could not be started (missing, cwd gone, …)

# How long one git call may run, in seconds, by what it is for; past it, its process group is killed.
# Every git call names one of these (tests/unit/test_one_home_per_fact.py), so they are never spelled twice.
SUMMARY_TIMEOUT_S = 30.0  # a run's change summary (courier/runs/changes.py), and a call that names none
# A canonical clone: its worktrees and branches made, found, removed (courier/runs/worktrees.py); the demo's made.
CLONE_TIMEOUT_S = 60.0
PATCH_TIMEOUT_S = 120.0  # a run's whole patch for `wb agent diff` (courier/runs/patch.py): every changed file read
_DRAIN_AFTER_KILL_S = 2.0


def git_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment every git call gets: this process's, minus GIT_*, plus the safe settings."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("GIT_")}
    env.pop("LANGUAGE", None)
    env.update(
        {
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_OPTIONAL_LOCKS": "0",
            "GIT_ASKPASS": "",
            "SSH_ASKPASS": "",
            "LC_ALL": "C",
        }
    )
    if extra:
        env.update(extra)
    return env


def run_git(
    args: Sequence[str],
    cwd: str | os.PathLike[str],
    timeout: float = SUMMARY_TIMEOUT_S,
    *,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """Run `git <args>` in `cwd` and return its CompletedProcess (stdout and stderr as bytes).

    Never raises for git's own failures: a non-zero exit is simply the returncode. When git
    runs past `timeout` seconds its whole process group is killed and the result has
    returncode `TIMED_OUT` (124) and stderr `git timed out after <t> s`; when it cannot be
    started (git missing, `cwd` not a directory, …) the result has returncode `NOT_RUN` (127)
    and stderr naming the OSError. Either way stdout is whatever was captured (possibly b"").
    `env` adds to (or overrides) the safe environment of `git_environment`.
    """
    argv = ["git", *args]
    try:
        process = subprocess.Popen(
            argv,
            cwd=cwd,
            env=git_environment(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as error:
        return subprocess.CompletedProcess(argv, NOT_RUN, b"", f"could not run git: {error}".encode())
    with process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            try:
                stdout, _ = process.communicate(timeout=_DRAIN_AFTER_KILL_S)
            except subprocess.TimeoutExpired:  # something outside the group holds the pipes
                stdout = b""
            message = f"git timed out after {timeout:g} s".encode()
            return subprocess.CompletedProcess(argv, TIMED_OUT, stdout or b"", message)
        except BaseException:
            _kill_group(process)
            process.wait()
            raise
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except OSError:
        process.kill()


def stderr_line(done: subprocess.CompletedProcess[bytes], limit: int = 512) -> str:
    """git's stderr as one short sanitised line for a message (its last non-blank line, cut to `limit` bytes)."""
    lines = [line.strip() for line in done.stderr.decode("utf-8", "replace").splitlines() if line.strip()]
    text = lines[-1] if lines else f"git exited with status {done.returncode}"
    return clip_bytes(sanitize(text), limit)


def copy_index(index_path: str, copy_path: str) -> None:
    """A scratch copy of a worktree's index that git reads exactly as it reads the original.

    The copy keeps the index's mtime: git re-reads a file whose stat matches its entry only
    when the index is no newer than the file (its "racy" check), so a fresh mtime on the copy
    would hide a same-size edit made in the second the index was written.
    """
    shutil.copy2(index_path, copy_path)
