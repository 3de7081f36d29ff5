"""`wb demo`: the real product, end to end, in a throwaway sandbox, in a few seconds.

What it sets up, all inside one temporary directory that is removed at the end (also on
Ctrl-C and errors):

* a *local* side: its own WB_HOME, a wb.yaml (0600 in a 0700 dir) naming one machine,
  `demo`, and an OpenSSH-style client config (`WB_SSH_CONFIG`) whose IdentityFile is an
  ephemeral client key and whose UserKnownHostsFile holds only the embedded server's key;
* a *demo machine*: its own WB_HOME, projects root with a canonical clone `demo/hello`
  (real git), a wb.yaml with the `demo` profile pointing at the scripted model server;
* an embedded SSH server (`courier.demo.sshd`) on 127.0.0.1 that runs the real receiver
  as that machine, and the scripted model server (`courier.demo.model_server`);
* the harness (`--harness codex|gemini|claude`, default codex): the real CLI when it is on
  PATH, else the bundled stand-in (`courier.demo.standin_<harness>`) installed under the
  CLI's name in the machine's bin dir; the scripted server speaks that vendor's API.

Then it runs the real CLI as subprocesses with the local side's environment: `dispatch
--to demo`, `await` (with a live progress line on a terminal's stderr), `status`, `logs`
and `list --all`. Nothing outside the temporary directory is written: the user's HOME,
~/.ssh, ~/.config/wb and ~/.wb are never read for configuration or written.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Protocol, TextIO

import psutil

import courier
from courier.demo.anthropic_server import AnthropicServer
from courier.demo.gemini_server import GeminiServer
from courier.demo.model_server import ModelServer
from courier.demo.sshd import EmbeddedSshd, new_key, private_openssh
from courier.runs.git import CLONE_TIMEOUT_S
from protocol import limits

MACHINE = "demo"
REPOSITORY = "demo/hello"
WORKTREE = "hello"
PROFILE = "demo"
PROVIDER = "demo"
CREDENTIAL_ENV = "DEMO_API_KEY"
WB_PATH = "wb"  # what the local config asks the machine to run; the embedded server runs the receiver
TASK = "Create hello.txt with a friendly greeting, then say what you did."
AWAIT_BOUND = "60s"
CLI_TIMEOUT_S = 90.0
POLL_INTERVAL_S = 0.5
STRAGGLER_GRACE_S = 5.0  # an owner finishing its record after await returned
INTERRUPTED_GRACE_S = 0.5
_SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
_ASCII_SPINNER = "|/-\\"
_PASSED_THROUGH = ("LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "USER", "LOGNAME", "SHELL", "TERM")


class DemoFailed(Exception):
    """A step of the demo did not work; the message says which and why."""


@dataclass(frozen=True)
class DemoHarness:
    """What the demo needs to know to run one harness: its CLI, stand-in, model and provider."""

    name: str  # the profile's harness and the CLI's executable
    display: str
    model: str
    wire_api: str
    provider_extra: str = ""  # more provider lines of the machine's wb.yaml
    profile_extra: str = ""
    home_env: str = ""  # where the CLI keeps its state: pointed into the sandbox for the version probe


DEMO_HARNESSES: dict[str, DemoHarness] = {
    # gpt-5.5 is in Codex's bundled catalogue: the real Codex offers its full tool set.
    "codex": DemoHarness(
        "codex",
        "Codex",
        "gpt-5.5",
        "responses",
        "      request_max_retries: 0\n      stream_max_retries: 0\n",
        "      reasoning: high\n",
        "CODEX_HOME",
    ),
    "gemini": DemoHarness("gemini", "Gemini CLI", "gemini-2.5-pro", "gemini", home_env="GEMINI_CLI_HOME"),
    "claude": DemoHarness("claude", "Claude Code", "claude-sonnet-4-5", "anthropic", home_env="CLAUDE_CONFIG_DIR"),
}


@dataclass
class Harness:
    spec: DemoHarness
    real: bool
    description: str
    bin_dir: Path | None = None  # the stand-in under the CLI's name, first on the machine's PATH


class _Stoppable(Protocol):
    def stop(self) -> None: ...


@dataclass
class Sandbox:
    root: Path
    servers: list[_Stoppable] = field(default_factory=list)

    @property
    def local(self) -> Path:
        return self.root / "local"

    @property
    def machine(self) -> Path:
        return self.root / "machine"


# --------------------------------------------------------------------------- entry


def run_demo(harness: str = "codex", *, ui: bool = False) -> int:
    """Run the demo with `harness`; 0 when the dispatched run completed, 1 when it did not, 130 on Ctrl-C.

    With `ui`, `wb ui --all` serves the sandbox's fleet on a web page from before the dispatch
    (docs/ui.md), and stays up after the run until Ctrl-C, which then ends the demo with the run's status.
    """
    spec = DEMO_HARNESSES[harness]
    started = time.monotonic()
    with _terminate_as_interrupt():
        try:
            with _sandbox() as sandbox:
                code = _demo(sandbox, started, spec, ui)
        except KeyboardInterrupt:
            sys.stderr.write("\ninterrupted; the demo sandbox was removed\n")
            return limits.EXIT_INTERRUPTED
        except DemoFailed as exc:
            sys.stderr.write(f"error: wb demo: {exc}\n")
            return 1
    return code


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM cleans up like Ctrl-C does (only possible from the main thread)."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _sandbox() -> Iterator[Sandbox]:
    root = Path(tempfile.mkdtemp(prefix="wb-demo-")).resolve()
    root.chmod(0o700)
    sandbox = Sandbox(root)
    grace = STRAGGLER_GRACE_S
    try:
        yield sandbox
    except BaseException:
        grace = INTERRUPTED_GRACE_S  # a run still going is ended, not waited for
        raise
    finally:
        # Cleanup must not be cut short by a second Ctrl-C.
        with _signals_deferred():
            for server in reversed(sandbox.servers):
                with contextlib.suppress(Exception):
                    server.stop()
            _end_stragglers(root, grace)
            shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _end_stragglers(root: Path, grace: float) -> None:
    """Owners and workers of the demo run (cwd or argv under the sandbox): let them finish, then end them."""
    marker = str(root)

    def leftovers() -> list[psutil.Process]:
        found = []
        for proc in psutil.process_iter(["pid", "cmdline", "cwd"]):
            try:
                cmdline = " ".join(proc.info["cmdline"] or [])
                cwd = proc.info["cwd"] or ""
            except (psutil.Error, OSError):
                continue
            if proc.pid != os.getpid() and (marker in cmdline or cwd == marker or cwd.startswith(marker + os.sep)):
                with contextlib.suppress(psutil.Error):
                    if proc.status() != psutil.STATUS_ZOMBIE:
                        found.append(proc)
        return found

    deadline = time.monotonic() + grace
    while (procs := leftovers()) and time.monotonic() < deadline:
        time.sleep(0.05)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not procs:
            return
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)
        psutil.wait_procs(procs, timeout=3)
        procs = leftovers()


# --------------------------------------------------------------------------- the demo


def _model_server(spec: DemoHarness) -> ModelServer | GeminiServer | AnthropicServer:
    """The scripted server speaking the harness's vendor API."""
    if spec.wire_api == "gemini":
        return GeminiServer(scenario="write-file")
    if spec.wire_api == "anthropic":
        return AnthropicServer(scenario="write-file")
    return ModelServer(scenario="write-file")


def _set_up(
    sandbox: Sandbox, harness: Harness
) -> tuple[ModelServer | GeminiServer | AnthropicServer, EmbeddedSshd, dict[str, str]]:
    """The scripted model server, the demo machine behind its SSH server, and the local side's environment."""
    user = getpass.getuser()
    client_key = new_key()

    model = _model_server(harness.spec)
    model.start()
    sandbox.servers.append(model)

    machine_env = _make_machine(sandbox, model, harness)
    sshd = EmbeddedSshd(user=user, client_key=client_key, wb_path=WB_PATH, env=machine_env, cwd=str(sandbox.machine))
    sshd.start()
    sandbox.servers.append(sshd)
    return model, sshd, _make_local(sandbox, sshd, user, private_openssh(client_key))


def _demo(sandbox: Sandbox, started: float, spec: DemoHarness, ui: bool = False) -> int:
    out = sys.stdout
    harness = _find_harness(sandbox, spec)
    model, sshd, local_env = _set_up(sandbox, harness)
    page = _DemoPage.start(local_env, sandbox) if ui else None

    _say(out, f"wb demo: a throwaway sandbox in {sandbox.root} (removed at the end; nothing of yours is touched)")
    _say(
        out,
        f"  machine  {MACHINE} at {sshd.host}:{sshd.port} (embedded SSH server, host key {sshd.host_key_fingerprint})",
    )
    _say(out, f"  repo     {REPOSITORY} (a canonical clone on {MACHINE}, branch main)")
    _say(out, f"  model    scripted model server at {model.base_url} (profile {PROFILE}: {PROVIDER}/{spec.model})")
    _say(out, f"  harness  {harness.description}")
    if page is not None:
        _say(out, f"  page     {page.url}")
        if sys.stdin.isatty():
            _say(out, "open the page, then press Enter to dispatch")
            sys.stdin.readline()
    _say(out, "")

    dispatched = _wb(
        out, local_env, sandbox,
        "agent", "dispatch", "--to", MACHINE, "--new-worktree", WORKTREE, "--repo", REPOSITORY,
        "--profile", PROFILE, "--task", TASK,
    )  # fmt: skip
    words = dispatched.split()
    ref = words[0] if words else ""
    if not ref.startswith(f"{MACHINE}:agt-"):
        raise DemoFailed(f"dispatch printed no reference: {dispatched.strip()!r}")

    # await prints the run's status (the facts `wb agent status` prints, plus what changed and the result).
    awaited = _wb(
        out,
        local_env,
        sandbox,
        "agent",
        "await",
        ref,
        "--wait-timeout",
        AWAIT_BOUND,
        progress=(ref, words[1] if len(words) > 1 else "dispatched"),
    )
    _wb(out, local_env, sandbox, "agent", "logs", ref)
    _wb(out, local_env, sandbox, "agent", "list", "--all")

    facts = _facts(awaited)
    state = facts.get("state")
    ended = time.monotonic() - started  # the run's part: from the demo's start to its terminal state
    if page is not None:
        _say(out, f"{ref} ended {state}; the page stays up with its diff: {page.url}")
        _say(out, "press Ctrl-C to end the demo")
        page.wait_for_interrupt()
    if state == "completed":
        total = time.monotonic() - started  # the real elapsed time, the page's part included
        how = f" after {ended:.1f}s, then the page stayed up {total - ended:.1f}s" if page is not None else ""
        _say(out, f"done in {total:.1f}s: {ref} completed on {MACHINE}{how}; cleaning up the sandbox")
        return 0
    failure = facts.get("failure")
    sys.stderr.write(
        f"error: wb demo: the run {ref} ended {state or 'in an unknown state'}"
        + (f": {failure}" if failure else "")
        + "\n"
    )
    return 1


def _facts(text: str) -> dict[str, str]:
    """`label: value` lines of a status text (docs/cli.md, wb agent status) as a mapping."""
    facts: dict[str, str] = {}
    for line in text.splitlines():
        label, colon, value = line.partition(":")
        if colon and label.isidentifier() and label not in facts:
            facts[label] = value.strip()
    return facts


def _say(out: TextIO, line: str) -> None:
    out.write(line + "\n")
    out.flush()


@dataclass
class _DemoPage:
    """`wb ui --all` as the local side (docs/ui.md), a server of the sandbox: stopped with it."""

    process: subprocess.Popen[str]
    url: str

    @classmethod
    def start(cls, env: dict[str, str], sandbox: Sandbox) -> _DemoPage:
        opening = ("--open",) if sys.stdout.isatty() else ()
        process = subprocess.Popen(
            _argv("ui", "--all", *opening),
            cwd=sandbox.local,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # the demo ends it: a terminal's Ctrl-C reaches the demo only
        )
        assert process.stdout is not None
        line = process.stdout.readline()
        page = cls(process, line.split(" ")[-1].strip())
        sandbox.servers.append(page)
        if not line.startswith("wb ui: http"):
            page.stop()
            assert process.stderr is not None
            raise DemoFailed(f"wb ui did not start: {process.stderr.read().strip() or 'no address printed'}")
        return page

    def wait_for_interrupt(self) -> None:
        try:
            while self.process.poll() is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(timeout=1.0)
        except KeyboardInterrupt:
            pass
        if self.process.poll() is not None and self.process.returncode not in (0, limits.EXIT_INTERRUPTED):
            raise DemoFailed(f"wb ui ended with status {self.process.returncode}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


# --------------------------------------------------------------------------- setup


def _find_harness(sandbox: Sandbox, spec: DemoHarness) -> Harness:
    found = shutil.which(spec.name)
    if found is not None:
        version = ""
        # Even `codex --version` writes helper binaries into its home: keep the CLI's home in the sandbox.
        probe_env = {**os.environ}
        if spec.home_env:
            probe_env[spec.home_env] = str(_private_dir(sandbox.root / f"{spec.name}-probe"))
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            done = subprocess.run(
                [found, "--version"],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=30,
                env=probe_env,
            )
            version = done.stdout.strip()
        number = re.search(r"\d+(?:\.\d+)+", version)  # "codex-cli 0.169.0", "2.1.328 (Claude Code)"
        shown = number.group() if number else "unknown version"
        return Harness(spec, real=True, description=f"real {spec.display} {shown} ({found})")
    return _install_standin(sandbox, spec)


def _install_standin(sandbox: Sandbox, spec: DemoHarness) -> Harness:
    """The bundled stand-in under the CLI's name in the machine's bin dir, which goes first on its PATH."""
    bin_dir = sandbox.machine / "bin"
    bin_dir.mkdir(parents=True, mode=0o700)
    wrapper = bin_dir / spec.name
    package_parent = str(Path(courier.__file__).resolve().parents[1])
    wrapper.write_text(
        "#!/bin/sh\n"
        f"# wb demo: the bundled stand-in for the {spec.display} CLI\n"
        f"PYTHONPATH={shlex.quote(package_parent)}; export PYTHONPATH\n"
        f'exec {shlex.quote(sys.executable)} -m courier.demo.standin_{spec.name} "$@"\n'
    )
    wrapper.chmod(0o700)
    return Harness(
        spec,
        real=False,
        description=f"{spec.name} not found on PATH: using the bundled stand-in (same event stream, no sandbox)",
        bin_dir=bin_dir,
    )


def _base_env() -> dict[str, str]:
    """What both sides inherit: locale and identity, PATH, and where this package is; no WB_* nor agent socket."""
    env = {name: os.environ[name] for name in _PASSED_THROUGH if name in os.environ}
    env.setdefault("LANG", "C.UTF-8")
    env["HOME"] = os.environ.get("HOME", str(Path.home()))
    env["PATH"] = os.environ.get("PATH", os.defpath)
    env["WB_COURIER"] = "off"  # the sandbox is removed at the end: no courier may outlive it
    package_parent = str(Path(courier.__file__).resolve().parents[1])
    inherited = os.environ.get("PYTHONPATH")
    env["PYTHONPATH"] = package_parent + (os.pathsep + inherited if inherited else "")
    return env


def _private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def _private_file(path: Path, data: str | bytes) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data.encode() if isinstance(data, str) else data)
    path.chmod(0o600)
    return path


def _git(cwd: Path, *args: str) -> None:
    env = {
        **_base_env(),
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_AUTHOR_NAME": "wb demo",
        "GIT_AUTHOR_EMAIL": "wb-demo@example.invalid",
        "GIT_COMMITTER_NAME": "wb demo",
        "GIT_COMMITTER_EMAIL": "wb-demo@example.invalid",
    }
    try:
        done = subprocess.run(
            ["git", *args],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=CLONE_TIMEOUT_S,
        )
    except FileNotFoundError:
        raise DemoFailed("git is not installed (wb needs it to make worktrees)") from None
    if done.returncode != 0:
        raise DemoFailed(f"git {' '.join(args)} failed: {done.stderr.strip()}")


def _make_machine(
    sandbox: Sandbox, model: ModelServer | GeminiServer | AnthropicServer, harness: Harness
) -> dict[str, str]:
    """The demo machine's home, projects root, canonical clone and wb.yaml; returns its environment."""
    root = _private_dir(sandbox.machine)
    home = _private_dir(root / "wbhome")
    projects = _private_dir(root / "projects")
    clone = projects / REPOSITORY
    clone.mkdir(parents=True)
    _git(clone, "init", "-q")
    _git(clone, "symbolic-ref", "HEAD", "refs/heads/main")
    (clone / "README.md").write_text("# hello\n\nA repository for the wb demo.\n")
    _git(clone, "add", "README.md")
    _git(clone, "commit", "-q", "-m", "Initial commit")
    _git(clone, "remote", "add", "origin", f"git@example.invalid:{REPOSITORY}.git")

    spec = harness.spec
    config = _private_file(
        _private_dir(root / "config") / "wb.yaml",
        "agents:\n"
        "  providers:\n"
        f"    {PROVIDER}:\n"
        f"      base_url: {model.base_url}\n"
        f"      credential_env: {CREDENTIAL_ENV}\n"
        f"      wire_api: {spec.wire_api}\n" + spec.provider_extra + "  profiles:\n"
        f"    {PROFILE}:\n"
        f"      harness: {spec.name}\n"
        f"      provider: {PROVIDER}\n"
        f"      model: {spec.model}\n" + spec.profile_extra,
    )
    env = _base_env()
    if harness.bin_dir is not None:
        env["PATH"] = str(harness.bin_dir) + os.pathsep + env["PATH"]
    env.update(
        {
            "WB_HOME": str(home),
            "WB_PROJECTS_ROOT": str(projects),
            "WB_CONFIG": str(config),
            # wb.yaml's parsed copy (docs/config.md#the-parsed-copy) stays in the sandbox, out of the user's HOME.
            "XDG_CACHE_HOME": str(_private_dir(root / "cache")),
            # Codex warns when its home is under the temporary directory; the machine gets its own.
            "TMPDIR": str(_private_dir(root / "tmp")),
            CREDENTIAL_ENV: "demo-" + secrets.token_hex(16),
        }
    )
    return env


def _make_local(sandbox: Sandbox, sshd: EmbeddedSshd, user: str, client_private_key: bytes) -> dict[str, str]:
    """The local side: its home, wb.yaml naming `demo`, the client key, known_hosts and ssh config."""
    root = _private_dir(sandbox.local)
    home = _private_dir(root / "wbhome")
    ssh_dir = _private_dir(root / "ssh")
    key = _private_file(ssh_dir / "id_ed25519", client_private_key)
    known_hosts = _private_file(ssh_dir / "known_hosts", sshd.host_key_line + "\n")
    ssh_config = _private_file(
        ssh_dir / "config",
        f"Host {sshd.host}\n"
        f"  IdentityFile {key}\n"
        "  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {known_hosts}\n"
        f"  GlobalKnownHostsFile {known_hosts}\n"
        "  PasswordAuthentication no\n"
        "  KbdInteractiveAuthentication no\n"
        "  GSSAPIAuthentication no\n",
    )
    wb_path = f"        wb_path: {WB_PATH}\n" if WB_PATH.startswith("/") else ""
    config = _private_file(
        _private_dir(root / "config") / "wb.yaml",
        "session_move:\n"
        "  targets:\n"
        f"    {MACHINE}:\n"
        "      ssh:\n"
        f"        host: {sshd.host}\n"
        f"        port: {sshd.port}\n"
        f"        user: {json.dumps(user)}\n" + wb_path,
    )
    env = _base_env()
    env.update(
        {
            "WB_HOME": str(home),
            "WB_CONFIG": str(config),
            "XDG_CACHE_HOME": str(_private_dir(root / "cache")),  # as the machine's: nothing in the user's HOME
            "WB_PROJECTS_ROOT": str(_private_dir(root / "projects")),
            "WB_SSH_CONFIG": str(ssh_config),
        }
    )
    return env


# --------------------------------------------------------------------------- running the CLI


def _argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "courier.main", *args]


def _wb(out: TextIO, env: dict[str, str], sandbox: Sandbox, *args: str, progress: tuple[str, str] | None = None) -> str:
    """Run one real `wb` command, echo it and its output; a non-zero exit is a DemoFailed."""
    _say(out, "$ wb " + shlex.join(args))
    process = subprocess.Popen(
        _argv(*args),
        cwd=sandbox.local,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        if progress is not None and sys.stderr.isatty():
            _progress(process, env, sandbox, *progress)
        stdout, stderr = process.communicate(timeout=CLI_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise DemoFailed(
            f"wb {args[0]} {args[1] if len(args) > 1 else ''} did not finish in {CLI_TIMEOUT_S:g}s"
        ) from None
    except BaseException:
        process.kill()
        process.communicate()
        raise
    for line in stdout.splitlines():
        _say(out, "  " + line)
    _say(out, "")
    if process.returncode != 0:
        detail = stderr.strip() or f"exit status {process.returncode}"
        raise DemoFailed(f"`wb {shlex.join(args)}` failed: {detail}")
    return stdout


def _status_json(env: dict[str, str], sandbox: Sandbox, ref: str) -> dict[str, Any] | None:
    try:
        done = subprocess.run(
            _argv("agent", "status", ref, "--json"),
            cwd=sandbox.local,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT_S,
        )
        value = json.loads(done.stdout) if done.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _progress(process: subprocess.Popen[str], env: dict[str, str], sandbox: Sandbox, ref: str, state: str) -> None:
    """While `process` (the await) runs: one line on stderr, redrawn in place, with the run's state."""
    utf8 = (sys.stderr.encoding or "").lower().replace("-", "") == "utf8"
    spinner = _SPINNER if utf8 else _ASCII_SPINNER
    started = time.monotonic()
    poller: threading.Thread | None = None
    lock = threading.Lock()

    def poll() -> None:
        nonlocal state
        result = _status_json(env, sandbox, ref)
        if result is not None and isinstance(result.get("state"), str):
            with lock:
                state = result["state"]

    frame = 0
    polled = 0.0
    try:
        while process.poll() is None:
            if (poller is None or not poller.is_alive()) and time.monotonic() - polled >= POLL_INTERVAL_S:
                polled = time.monotonic()
                poller = threading.Thread(target=poll, daemon=True)
                poller.start()
            with lock:
                shown = state
            elapsed = time.monotonic() - started
            sys.stderr.write(f"\r\x1b[K{spinner[frame % len(spinner)]} {ref}  {shown}  {elapsed:4.1f}s")
            sys.stderr.flush()
            frame += 1
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=POLL_INTERVAL_S / 4)
    finally:
        sys.stderr.write("\r\x1b[K")
        sys.stderr.flush()
        if poller is not None:
            poller.join(timeout=CLI_TIMEOUT_S)
