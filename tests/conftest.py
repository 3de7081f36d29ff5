"""Shared fixtures: a throwaway "machine" (home, projects root, config, PATH) and real git clones."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import pytest

from courier.channels.asyncssh_import import preload_asyncssh
from courier.main import COLD_COMMANDS
from tests.cli_lookup import cli_dirs, locate_cli
from tests.integration.sshd import SshdFactory
from tests.json_documents import check_output
from tests.ssh_tiers import SshMachine, ssh_machines, ssh_tier  # noqa: F401  (the two SSH tiers' fixtures)

# The suite runs in both courier modes (docs/courier.md, .ci/run): WB_COURIER as the runner set it
# reaches every process a test starts, also those given an environment of their own.
_COURIER_MODE = os.environ.get("WB_COURIER")
_popen_init = subprocess.Popen.__init__


def _popen_with_courier_mode(self: subprocess.Popen[bytes], *args: object, **kwargs: object) -> None:
    env = kwargs.get("env")
    mark = _RUNNING[-1].get_closest_marker(COURIER_INDEPENDENT) if _RUNNING else None
    if mark is not None and "because" not in mark.kwargs:
        _refuse_pass_dependent_wb(_RUNNING[-1], args[0] if args else kwargs.get("args"), env)
    if _COURIER_MODE is not None and isinstance(env, dict) and "WB_COURIER" not in env:
        kwargs["env"] = {**env, "WB_COURIER": _COURIER_MODE}
    _popen_init(self, *args, **kwargs)  # type: ignore[arg-type]


subprocess.Popen.__init__ = _popen_with_courier_mode  # type: ignore[assignment,method-assign]

# ------------------------------------------------------------- tests that run in one courier pass only
# A test that starts no `wb COMMAND` whose courier mode comes from the pass (only private entries
# such as `--wb-internal-agent-remote`, commands that always run cold such as `wb demo`, in-process
# code, or wb with WB_COURIER set by the test itself) runs the same with WB_COURIER=on and off.
# Marked `courier_independent`, it runs in one pass only: the courier pass (WB_COURIER=on or unset),
# or, marked `courier_independent(cold=True)`, the WB_COURIER=off pass, so that the two passes
# weigh about the same. The other pass deselects it, unless every collected test is such a test
# (then the caller asked for exactly those). Every test under tests/unit is one (in-process code),
# but those of UNIT_MODULES_OF_BOTH_PASSES. The mark is checked, not trusted: a marked test that
# starts a pass-dependent wb fails, naming it; only `courier_independent(because="…")` is taken on
# its word, where the courier does not touch what the test checks though its commands pass through it.
COURIER_INDEPENDENT = "courier_independent"
UNIT_MODULES_OF_BOTH_PASSES = ("test_schemas.py",)  # `wb schema`, `wb agent dispatch` through `machine`
# The real CLIs of tests/e2e: what Codex, Claude Code or Gemini does in a run does not depend on
# which process started the run's owner (the thin client's courier or wb itself; the fake CLIs'
# suites check that start in both passes). Each module runs in one pass, split so that both weigh alike.
E2E_BECAUSE = "a real CLI's run does not depend on the process that started its owner (fake CLIs: both passes)"
E2E_COLD_MODULES = ("test_real_unattended.py", "test_codex_supervisor.py", "test_real_codex_remote.py")
_SUITE_TEMP_PARENT = "/var/tmp"  # see pytest_configure
_RUNNING: list[pytest.Item] = []  # the test now running (its setup, call and teardown)
_DESELECTED: list[int] = []


def _launched_wb_command(argv: object) -> str | None:
    """The wb command `argv` starts that WB_COURIER steers (`agent list`), or None (a private entry,
    a command that always runs cold, no wb at all). Only the test's own children are seen: what a
    wb_path script or an SSH session starts is a remote receiver, a private entry."""
    if not isinstance(argv, list | tuple):
        return None
    words = [str(word) for word in argv]
    if len(words) >= 3 and words[1:3] == ["-m", "courier.main"]:
        rest = words[3:]
    elif words and Path(words[0]).name == "wb":
        rest = words[1:]
    else:
        return None
    if rest and (rest[0].startswith("--wb-internal-") or rest[0] in COLD_COMMANDS):
        return None  # never through the thin client, whatever WB_COURIER says (courier/main.py)
    return " ".join(rest[:2]) or "(no arguments)"


def _refuse_pass_dependent_wb(item: pytest.Item, argv: object, env: object) -> None:
    command = _launched_wb_command(argv)
    if command is None or (isinstance(env, dict) and "WB_COURIER" in env):
        return
    raise AssertionError(
        f"{item.nodeid} is marked {COURIER_INDEPENDENT} but starts `wb {command}` in the pass's courier mode: "
        f"the WB_COURIER=off pass would run something else; drop the mark or set WB_COURIER in that env"
    )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> None:
    _RUNNING.append(item)


@pytest.hookimpl(trylast=True)
def pytest_runtest_logfinish() -> None:
    if _RUNNING:
        _RUNNING.pop()


def pytest_configure(config: pytest.Config) -> None:
    if config.option.basetemp is None and not hasattr(config, "workerinput"):
        # Not under /tmp: with bubblewrap installed, the real Codex refuses to set up its sandbox's
        # helpers for a CODEX_HOME under the temporary directory, and its file edits then fail
        # (docs/codex-notes.md#the-known-limits-of-the-sandbox, item 4). A user's WB_HOME is never
        # there; the suite's should not be.
        config.option.basetemp = tempfile.mkdtemp(prefix="wb-tests-", dir=_SUITE_TEMP_PARENT)
        config.add_cleanup(lambda: shutil.rmtree(config.option.basetemp, ignore_errors=True))
    config.addinivalue_line(
        "markers",
        f"{COURIER_INDEPENDENT}(cold=False, because=None): runs the same in both courier passes, so in one "
        "only: WB_COURIER=on, or off with cold=True; checked unless `because` says why not (tests/conftest.py)",
    )


def _runs_cold_only(item: pytest.Item) -> bool | None:
    """None for a test of both passes; else whether it runs in the WB_COURIER=off pass (not the on one)."""
    mark = item.get_closest_marker(COURIER_INDEPENDENT)
    if mark is None:
        return None
    return bool(mark.kwargs.get("cold", False))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    unit, e2e = REPO_ROOT / "tests" / "unit", REPO_ROOT / "tests" / "e2e"
    for item in items:
        if item.get_closest_marker(COURIER_INDEPENDENT) is not None:
            continue
        if item.path.is_relative_to(unit) and item.path.name not in UNIT_MODULES_OF_BOTH_PASSES:
            item.add_marker(COURIER_INDEPENDENT)
        elif item.path.is_relative_to(e2e):
            cold = item.path.name in E2E_COLD_MODULES
            item.add_marker(pytest.mark.courier_independent(cold=cold, because=E2E_BECAUSE))
    cold_pass = not courier_on()
    other_pass = [item for item in items if _runs_cold_only(item) not in (None, cold_pass)]
    if not other_pass or all(_runs_cold_only(item) is not None for item in items):
        return
    config.hook.pytest_deselected(items=other_pass)
    deselected = {id(item) for item in other_pass}
    items[:] = [item for item in items if id(item) not in deselected]
    _DESELECTED.append(len(other_pass))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _DESELECTED:
        terminalreporter.write_line(
            f"{_DESELECTED[0]} {COURIER_INDEPENDENT} tests deselected: they run in the other courier pass"
        )


# Launched from a non-interactive shell (`trap "" INT`, a script's `cmd &`, `setsid nohup`) the
# suite inherits SIGINT ignored, and an ignored signal stays ignored across exec: every process a
# test starts would shrug off the Ctrl-C the tests send it (Python installs its KeyboardInterrupt
# handler only over the default disposition). With a handler here instead, exec resets SIGINT to
# the default in every child, however it is started (subprocess, asyncio, sshd, wb itself).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

REPO_ROOT = Path(__file__).resolve().parents[1]
FAKES = REPO_ROOT / "tests" / "fakes"
CREDENTIAL_ENV = "TEST_PROVIDER_KEY"
CREDENTIAL_VALUE = "sk-test-0d4f7c1e9b2a-credential-never-printed"

CONFIG_TEMPLATE = """\
agents:
  providers:
    mock:
      base_url: http://127.0.0.1:9/v1
      credential_env: {credential_env}
      request_max_retries: 0
      stream_max_retries: 0
  profiles:
    fake:
      harness: codex
      provider: mock
      model: gpt-5.5
      reasoning: high
"""


@dataclass
class Machine:
    """One wb installation: its own HOME, WB_HOME, projects root, config and PATH."""

    root: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def home(self) -> Path:
        return self.root / "wbhome"

    @property
    def projects(self) -> Path:
        return self.root / "projects"

    @property
    def config_path(self) -> Path:
        return self.root / "config" / "wb.yaml"

    def write_config(self, text: str) -> None:
        self.config_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.config_path.write_text(text)
        self.config_path.chmod(0o600)

    def wb(
        self,
        *args: str,
        input: bytes | str | None = None,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        data = input.decode() if isinstance(input, bytes) else input
        done = subprocess.run(
            [sys.executable, "-m", "courier.main", *args],
            input=data if data is not None else "",
            capture_output=True,
            text=True,
            cwd=cwd or self.root,
            env={**self.env, **(env or {})},
            timeout=timeout,
        )
        check_output(args, done)  # every --json output follows its published schema
        return done

    def wb_json(self, *args: str, **kwargs: object) -> object:
        done = self.wb(*args, "--json", **kwargs)  # type: ignore[arg-type]
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def clone(self, repository: str = "acme/widget") -> Path:
        """A real canonical clone at <projects>/<owner>/<repo> with one commit and an origin."""
        path = make_clone(self.projects / repository)
        git(path, "remote", "add", "origin", f"git@github.com:{repository}.git")
        return path

    def dispatch(
        self, *args: str, task: str = "scenario:complete", worktree: str = "w1", repo: str = "acme/widget"
    ) -> str:
        done = self.wb(
            "agent", "dispatch", "--new-worktree", worktree, "--profile", "fake", "--repo", repo, "--task", task, *args
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.split()[0]


def git(cwd: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_CONFIG_NOSYSTEM": "1",
    }
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def make_clone(path: Path) -> Path:
    """A real git repository at `path` with one commit on main."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    (path / "README.md").write_text("# widget\n")
    git(path, "add", "README.md")
    git(path, "commit", "-q", "-m", "initial")
    return path


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshdFactory]:
    """Real OpenSSH sshd machines on loopback, shared by one test module and stopped after it."""
    factory = SshdFactory(tmp_path_factory.mktemp("sshd"))
    try:
        yield factory
    finally:
        factory.close()


REMOTE_CONFIG = """\
agents:
  providers:
    mock:
      base_url: http://127.0.0.1:9/v1
      credential_file: {credential}
  profiles:
    fake: {{harness: codex, provider: mock, model: gpt-5.5}}
"""


def prepare_remote(server: SshMachine) -> None:
    """A canonical clone, the fake Codex on PATH, a profile and a credential file on the remote machine."""
    shutil.copy(FAKES / "codex", server.bin_dir / "codex")
    make_clone(server.projects_root / "acme" / "widget")
    credential = server.root / "credential"
    credential.write_text(CREDENTIAL_VALUE)
    credential.chmod(0o600)
    config = server.root / "remote-wb.yaml"
    config.write_text(REMOTE_CONFIG.format(credential=credential))
    config.chmod(0o600)


def make_machine(root: Path) -> Machine:
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o700)
    machine = Machine(root=root)
    user_home = root / "userhome"
    user_home.mkdir()
    machine.env = {
        "HOME": str(user_home),
        "PATH": f"{FAKES}:{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "WB_CONFIG": str(machine.config_path),
        "WB_HOME": str(machine.home),
        "WB_PROJECTS_ROOT": str(machine.projects),
        CREDENTIAL_ENV: CREDENTIAL_VALUE,
        "PYTHONPATH": str(REPO_ROOT),
        "GIT_CONFIG_GLOBAL": "/dev/null",
    }
    machine.write_config(CONFIG_TEMPLATE.format(credential_env=CREDENTIAL_ENV))
    return machine


@pytest.fixture
def machine(tmp_path: Path) -> Iterator[Machine]:
    yield make_machine(tmp_path / "m")
    _kill_leftovers(tmp_path)


COURIER_MODULE = "courier.courier_process"


def pytest_collection_finish(session: pytest.Session) -> None:
    """Everything imported and collected so far lives for the session: keep the collector off it.

    The per-test collection below then looks only at what tests made, so it costs little.
    """
    gc.freeze()


@pytest.fixture(autouse=True)
def _garbage_of_this_test() -> Iterator[None]:
    """Free what the test left in reference cycles before the next test starts.

    A finalizer's warning (a killed subprocess never waited for, a pipe never closed) is then
    reported in this test's teardown, by the same filterwarnings=error rule, instead of in
    whichever later test the collector happened to run in.
    """
    yield
    gc.collect()


def _a_child_subreaper() -> bool:
    """Whether this process adopts its orphaned descendants (Linux prctl PR_GET_CHILD_SUBREAPER)."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    flag = ctypes.c_int(0)
    ctypes.CDLL(None, use_errno=True).prctl(37, ctypes.byref(flag), 0, 0, 0)
    return bool(flag.value)


@pytest.fixture(autouse=True)
def _owner_not_in_the_runner() -> Iterator[None]:
    """No test runs a run's owner in the test runner's own process: an owner makes its process a child
    subreaper and, when its worker is done, ends every descendant that process has (courier/runs/descendants.py):
    in pytest's, the session's fixtures, such as the Ray cluster's namespace holder and the sshd machines."""
    yield
    assert not _a_child_subreaper(), "this test made the test runner a subreaper: run the owner in a process of its own"


@pytest.fixture(scope="session", autouse=True)
def _stop_couriers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """No courier a test started outlives the test session (each serves one test's WB_HOME)."""
    yield
    import psutil

    marker = str(tmp_path_factory.getbasetemp())
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmdline = proc.info["cmdline"] or []
        except (psutil.Error, OSError):
            continue
        if COURIER_MODULE in cmdline and any(marker in part for part in cmdline):
            with contextlib.suppress(psutil.Error):
                proc.kill()


def courier_on() -> bool:
    """Whether the wb processes this suite starts go through the courier (docs/courier.md)."""
    from courier.warm.thin_client import enabled

    return sys.platform.startswith("linux") and enabled(os.environ)


def command_process(pid: int) -> int | None:
    """The process that runs wb's command: `pid` itself (cold), or its child in the courier (warm).

    A thin client (docs/courier.md) passes its stdio to the courier, whose forked child then holds
    the same stdout; that child is the one doing the work.
    """
    import psutil

    try:
        stdout = os.readlink(f"/proc/{pid}/fd/1")
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return None
    if "pydantic_core" in maps:
        return pid
    for proc in psutil.process_iter(["cmdline"]):
        if COURIER_MODULE not in (proc.info["cmdline"] or []):
            continue
        with contextlib.suppress(psutil.Error, OSError):
            for child in proc.children():
                if os.readlink(f"/proc/{child.pid}/fd/1") == stdout:
                    return child.pid
    return None


def _kill_leftovers(tmp_path: Path) -> None:
    """End any owner or worker a test left running under its own directory, and what they started.

    Scanned again until a pass finds nothing: a child forked just before its parent was killed
    may exec its program (bubblewrap, with the worktree on its command line) after the first scan.
    A later pass also ends what is left in a process group led by anything killed before: bubblewrap's
    sandbox init, cloned just after the scan and whose parent (the worker, its group's leader) was then
    killed, waits for that parent in its set-up for ever; it names nothing of this test, and only its
    group ties it to the run.
    """
    import psutil

    marker = str(tmp_path)
    own_group = os.getpgrp()
    groups: set[int] = set()
    for _ in range(_LEFTOVER_PASSES):
        found = []
        for proc in psutil.process_iter(["pid", "cmdline", "cwd"]):
            try:
                cmdline = " ".join(proc.info["cmdline"] or [])
                cwd = proc.info["cwd"] or ""
            except (psutil.Error, OSError):
                continue
            if proc.pid == os.getpid():
                continue
            if marker in cmdline or cwd.startswith(marker) or (_group_of(proc.pid) in groups and pid_alive(proc.pid)):
                with contextlib.suppress(psutil.Error):
                    found += proc.children(recursive=True)
                found.append(proc)
        if not found:
            return
        for proc in found:
            # Only a group the found process leads (a worker, an owner): a child in another's group (an exec
            # channel's receiver in a courier the whole session shares) does not make that group this test's.
            if _group_of(proc.pid) == proc.pid:
                groups.add(proc.pid)
            with contextlib.suppress(psutil.Error):
                proc.kill()
        groups.discard(own_group)
        # Not psutil.wait_procs: a killed process whose parent is PID 1 stays a zombie until that init reaps it
        # (some never do), and psutil waits the whole timeout for it.
        killed = [proc.pid for proc in found]
        wait_for(lambda: not any(pid_alive(pid) for pid in killed), 5, 0.01)  # noqa: B023 (called here, at once)


def _group_of(pid: int) -> int:
    """The process group of `pid`; -1 when it is gone."""
    try:
        return os.getpgid(pid)
    except OSError:
        return -1


_LEFTOVER_PASSES = 10


def wait_for(predicate: object, timeout: float = 30.0, interval: float = 0.05) -> bool:
    """Wait on a condition (never a fixed sleep); True when it held before the timeout."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(interval)
    return bool(predicate())  # type: ignore[operator]


def pid_alive(pid: int) -> bool:
    """A live, non-zombie process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            state = handle.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


# --------------------------------------------------------------------------- real CLIs for the e2e tiers


def in_ci() -> bool:
    """True when CI is set (CI=true, as .ci/run's callers set it): a missing tool is then a failure."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def unavailable(reason: str) -> NoReturn:
    """Skip saying why on a developer machine; fail in CI, where a skip would hide a tier that did not run."""
    if in_ci():
        pytest.fail(f"{reason} (CI is set, so this fails instead of skipping)", pytrace=False)
    pytest.skip(reason)


@dataclass(frozen=True)
class RealCli:
    """A real harness CLI found for an e2e tier: its executable and the PATH directories it needs."""

    executable: str
    dirs: list[str]  # the executable's directory, then node's for an npm launcher (`#!/usr/bin/env node`)


def require_cli(name: str, version: str, *, install: str | None = None) -> RealCli:
    """The real `name` at exactly `version`, or a skip (a failure under CI) naming what is missing and the fix.

    Looks on PATH without tests/fakes, then in npm's global bin; `<name> --version` must
    print `version` as one of its words ("codex-cli 0.169.0", "2.1.328 (Claude Code)", "0.61.0").
    """
    hint = install or f"install {name} {version}"
    executable = locate_cli(name)
    if executable is None:
        unavailable(f"the real {name} CLI ({version}) is not installed: {hint}")
    # `--version` alone writes the CLI's home (~/.gemini, ~/.codex helpers): give it a throwaway one.
    with tempfile.TemporaryDirectory(prefix="wb-cli-probe-") as probe_home:
        homes = ("HOME", "CODEX_HOME", "GEMINI_CLI_HOME", "CLAUDE_CONFIG_DIR")
        env = {**os.environ, **dict.fromkeys(homes, probe_home)}
        try:
            done = subprocess.run(
                [executable, "--version"], capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL
            )
            reported = (done.stdout or done.stderr).strip()
        except (OSError, subprocess.TimeoutExpired) as exc:
            reported = f"no version ({exc})"
    if version not in [word.removeprefix("v") for word in reported.split()]:
        unavailable(f"{executable} reports {reported!r}, expected {name} {version}: {hint}")
    return RealCli(executable, cli_dirs(executable))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Under CI (CI=true in .ci/run) a skip is a failure: a missing prerequisite (an sshd, a real
    CLI, root) would otherwise let a feature go untested while the run stays green. Only the
    docker tier may skip there, since no Docker engine runs on CI's machine."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if os.environ.get("CI") and report.skipped and "docker" not in item.keywords and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under CI, which must run every tier: {reason}"


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """The suite's one real Ray cluster (tests/integration/ray_cluster.py), started once, stopped at the end."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed: pip install -e '.[ray]' (CI installs it)")
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        pytest.skip("the Ray tier needs unshare and nsenter (util-linux)")
    from tests.integration.ray_cluster import default_cluster

    cluster = default_cluster(tmp_path_factory.mktemp("ray"))
    try:
        cluster.start()
    except RuntimeError as exc:
        cluster.stop()
        pytest.skip(f"cannot start the Ray cluster here: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()

# The tests' own asyncssh servers and clients import asyncssh as wb does, quietly (a warning is an error here).
preload_asyncssh()
