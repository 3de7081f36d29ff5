"""Machines reached over `exec` targets (docs/cli.md#exec-targets): the two exec tiers of tests/ssh_tiers.py.

Each factory has the interface of `SshdFactory` (`start`, `target`, `write_wb_config`, …), so
the CLI, fleet and courier suites run over them unchanged; only `target()` differs: it
writes `session_move.targets.NAME.exec` instead of `.ssh`.

- `ExecEnvFactory` (tier `exec-env`): no server at all. A machine is a directory with its own
  home, WB_HOME, projects root, wb.yaml and bin dir; its target's argv is
  `env -i -C <home> HOME=… USER=root … WB_HOME=… WB_PROJECTS_ROOT=… WB_CONFIG=… PATH=…`, so
  its `wb` runs locally with exactly the environment and working directory its sshd session
  would have had (sshd starts a session with a fresh environment in the user's home, plus
  the template's SetEnv). A stopped machine is one whose home is gone: `env -C` cannot enter
  it, as `docker exec` cannot enter a stopped container.
- `ExecSshFactory` (tier `exec-ssh`): real OpenSSH sshd machines (tests/integration/sshd.py),
  reached by OpenSSH's own client: `ssh -T -F /dev/null -p PORT -i KEY -o
  UserKnownHostsFile=… -o StrictHostKeyChecking=yes -o BatchMode=yes … root@HOST`. Host keys
  are ssh's business on this channel (wb checks none), so they are still checked, by ssh.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml

from tests.integration.sshd import SshdFactory, SshdServer

USER = "root"
PYTHON_BIN = Path(sys.executable).parent
_SESSION_ARGUMENTS = ("--wb-internal-agent-remote", "--wb-internal-agent-serve")


def write_targets(config_dir: Path, name: str, targets: dict[str, dict[str, Any]]) -> Path:
    """A wb.yaml (0600 in a 0700 dir): a `{"exec": …}` or `{"ssh": …}` entry as it is, any other as `ssh:`.

    A raw dict (`{"host": "bad host"}`) stays an SSH target in every tier: a bad entry is a config
    error whatever the other machines' channel.
    """
    entries = {key: spec if set(spec) in ({"exec"}, {"ssh"}) else {"ssh": spec} for key, spec in targets.items()}
    document = {"session_move": {"targets": entries}}
    path = config_dir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(document))
    path.chmod(0o600)
    return path


@dataclass
class ExecEnvMachine:
    """One local exec machine: a directory with the fields of `SshdServer` (no host, port or key)."""

    host: str
    root: Path
    port: int = 0
    host_public_key: str = ""

    @property
    def wb_home(self) -> Path:
        return self.root / "wbhome"

    @property
    def projects_root(self) -> Path:
        return self.root / "projects"

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin"

    @property
    def home(self) -> Path:
        return self.root / "home"

    def environment(self) -> dict[str, str]:
        """What an sshd session on this machine gets (the OpenSSH template's SetEnv, sshd's own four)."""
        return {
            "HOME": str(self.home),
            "USER": USER,
            "LOGNAME": USER,
            "SHELL": "/bin/sh",
            "WB_HOME": str(self.wb_home),
            "WB_PROJECTS_ROOT": str(self.projects_root),
            "WB_CONFIG": str(self.root / "remote-wb.yaml"),
            "PATH": f"{self.bin_dir}:{PYTHON_BIN}:/usr/local/bin:/usr/bin:/bin",
        }

    def argv(self) -> list[str]:
        # -i: nothing of the caller's environment, as over SSH; -C: the session starts in the home.
        return ["env", "-i", "-C", str(self.home), *(f"{k}={v}" for k, v in self.environment().items())]

    def log(self) -> str:
        """No server, so no log: the exec child's command line is the fixed argv plus the wb tail."""
        return ""

    def script(self, name: str, body: str) -> Path:
        """An executable `#!/bin/sh` script in this machine's bin dir, usable as wb_path."""
        path = self.bin_dir / name
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(0o755)
        return path

    def session_processes(self) -> list[psutil.Process]:
        """This machine's receivers (`wb --wb-internal-agent-remote` or `-serve`, its WB_HOME) and their children."""
        found = []
        for process in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error):
                if not set(_SESSION_ARGUMENTS) & set(process.info["cmdline"] or []):
                    continue
                if process.environ().get("WB_HOME") == str(self.wb_home):
                    found.append(process)
                    found.extend(process.children(recursive=True))
        return found

    def kill_sessions(self) -> None:
        """SIGKILL every receiver on this machine, as killing each session's sshd ends its command."""
        for process in self.session_processes():
            with contextlib.suppress(psutil.Error):
                process.send_signal(signal.SIGKILL)

    def stop(self) -> None:
        """The machine is gone: its receivers end and its home no longer exists (`env -C` fails)."""
        self.kill_sessions()
        shutil.rmtree(self.home, ignore_errors=True)


@dataclass
class ExecEnvFactory:
    """Local exec machines sharing one wb config dir (the `exec-env` tier)."""

    base: Path
    servers: list[ExecEnvMachine] = field(default_factory=list)
    channel = "exec"
    host_keys = False  # nothing on this channel has a host key

    def __post_init__(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        self.base.chmod(0o700)
        self.config_dir = self.base / "wbconfig"
        self.config_dir.mkdir(mode=0o700, exist_ok=True)
        # The SSH-only fields, for the caller's WB_SSH_CONFIG: an empty client config, no keys.
        self.client_key = self.base / "no-client-key"
        self.known_hosts = self.base / "known_hosts"
        self.known_hosts.write_text("")
        self.client_config = self.base / "client_config"
        self.client_config.write_text("")

    def start(self, host: str = "127.0.0.1", *, remember_key: bool = True, sshd_options: str = "") -> ExecEnvMachine:
        if sshd_options:
            raise ValueError("sshd_options are OpenSSH's: a test that needs them belongs to the OpenSSH tier only")
        root = self.base / f"exec-{host}-{len(self.servers)}"
        root.mkdir(mode=0o700)
        for sub in ("wbhome", "projects", "bin", "home"):
            (root / sub).mkdir(mode=0o700)
        machine = ExecEnvMachine(host, root)
        self.servers.append(machine)
        return machine

    def write_client_config(self, name: str, extra: str = "", *, known_hosts: Path | None = None) -> Path:
        raise NotImplementedError("no SSH client reaches an exec-env machine: that test belongs to the SSH tiers")

    def known_hosts_line(self, server: Any) -> str:
        raise NotImplementedError("an exec-env machine has no host key: that test belongs to the SSH tiers")

    def write_wb_config(self, name: str, targets: dict[str, dict[str, Any]]) -> Path:
        return write_targets(self.config_dir, name, targets)

    def target(self, server: ExecEnvMachine, **extra: Any) -> dict[str, Any]:
        return {"exec": {"argv": server.argv(), **extra}}

    def address(self, server: ExecEnvMachine) -> dict[str, Any]:
        """What `wb machines --json` shows of where this machine is: its argv."""
        return {"argv": server.argv()}

    def close(self) -> None:
        for machine in self.servers:
            machine.kill_sessions()
        self.servers.clear()


@dataclass
class ExecSshFactory(SshdFactory):
    """Real sshd machines reached through `ssh -T` as an exec target (the `exec-ssh` tier)."""

    channel = "exec"
    host_keys = True  # checked by ssh itself (StrictHostKeyChecking=yes), not by wb

    def argv(self, server: SshdServer) -> list[str]:
        return [
            "ssh", "-T", "-F", "/dev/null", "-p", str(server.port), "-i", str(self.client_key),
            "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
            "-o", "LogLevel=ERROR", f"{USER}@{server.host}",
        ]  # fmt: skip

    def target(self, server: SshdServer, **extra: Any) -> dict[str, Any]:
        return {"exec": {"argv": self.argv(server), **extra}}

    def address(self, server: SshdServer) -> dict[str, Any]:
        return {"argv": self.argv(server)}

    def write_wb_config(self, name: str, targets: dict[str, dict[str, Any]]) -> Path:
        return write_targets(self.config_dir, name, targets)
