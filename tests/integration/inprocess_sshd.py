"""In-process SSH machines on loopback: the root-free tier beside the OpenSSH one of tests/integration/sshd.py.

`InProcessSshdFactory(base)` has the interface of `SshdFactory` (one client key, one
known_hosts file, `start("127.0.0.2")`, `target`, `write_wb_config`, …), but each machine is
an asyncssh server (courier/demo/sshd.py's `LoopbackSshd`) whose event loop runs in a thread
of the test process, so nothing needs root or an sshd binary. The server outlives each call
(the CLI under test runs as subprocesses and connects over TCP), just as a real sshd does.

A session runs its exec command as sshd does: `/bin/sh -c <command>` in a new session, with
the machine's environment (its own HOME, WB_HOME, WB_PROJECTS_ROOT, WB_CONFIG and a PATH
that starts with the machine's bin dir), so `wb --wb-internal-agent-remote`, the courier's
`--wb-internal-agent-serve` and fake `wb_path` scripts run exactly as on an sshd machine.
When a client goes away, the session's pipes close and its process is left to notice, as
sshd does for a session without a PTY.

What only OpenSSH shows stays in that tier: a login shell's PATH, MaxStartups and
MaxSessions, restarting sshd, the per-connection sshd process a test can kill or freeze.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncssh
import psutil
import yaml

from courier.demo.sshd import LoopbackSshd, new_key, private_openssh, public_line

USER = "root"  # the SSH user name the machines accept (any uid runs them; the name is only checked)
_REFUSED_STATUS = 1


class ShellSshd(LoopbackSshd):
    """One machine's server: any exec request, run by `/bin/sh -c` with the machine's environment."""

    end_on_disconnect = False
    # Allowed on purpose, as in the OpenSSH template: the client must not ask, and the log shows it did not.
    allow_pty = True
    agent_forwarding = True

    def __init__(self, *, client_key: asyncssh.SSHKey, host: str, env: dict[str, str], cwd: Path) -> None:
        super().__init__(user=USER, client_key=client_key, host=host)
        self._env = env
        self._cwd = cwd
        self.lines: list[str] = []

    def note(self, line: str) -> None:
        self.lines.append(line)

    async def _spawn(self, process: asyncssh.SSHServerProcess[bytes]) -> asyncio.subprocess.Process | None:
        if process.get_terminal_type() is not None:
            self.note("session: pty-req")
        if process.channel.get_agent_path() is not None:
            self.note("session: auth-agent-req@openssh.com")
        command = process.command
        if command is None or process.subsystem is not None:
            self.note(f"refused {process.subsystem or 'shell'}")
            process.stderr.write(b"in-process sshd: only exec requests are served\n")
            process.exit(_REFUSED_STATUS)
            return None
        self.note(f"session: request exec: {command}")
        peer = process.get_extra_info("peername") or ("127.0.0.1", 0)
        env = {**self._env, "SSH_CONNECTION": f"{peer[0]} {peer[1]} {self.host} {self.port}"}
        env["SSH_CLIENT"] = f"{peer[0]} {peer[1]} {self.port}"
        return await asyncio.create_subprocess_exec(
            "/bin/sh",
            "-c",
            command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            cwd=self._cwd,
            start_new_session=True,
        )


@dataclass
class InProcessServer:
    """One in-process machine: where it listens, its files and home (the fields of `SshdServer`)."""

    host: str
    root: Path
    sshd: ShellSshd

    @property
    def port(self) -> int:
        return self.sshd.port

    @property
    def host_public_key(self) -> str:
        return self.sshd.host_public_key

    @property
    def wb_home(self) -> Path:
        return self.root / "wbhome"

    @property
    def projects_root(self) -> Path:
        return self.root / "projects"

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin"

    def log(self) -> str:
        return "".join(f"{line}\n" for line in list(self.sshd.lines))

    def script(self, name: str, body: str) -> Path:
        """An executable `#!/bin/sh` script in this machine's bin dir, usable as wb_path."""
        path = self.bin_dir / name
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(0o755)
        return path

    def session_processes(self) -> list[psutil.Process]:
        """The sessions' processes and everything they started that is still their child."""
        if not self.sshd.running:
            return []
        found = []
        for pid in self.sshd.child_pids():
            with contextlib.suppress(psutil.Error):
                process = psutil.Process(pid)
                found.append(process)
                found.extend(process.children(recursive=True))
        return found

    def kill_sessions(self) -> None:
        """Drop every connection at once, as killing each session's sshd would."""
        if self.sshd.running:
            self.sshd.abort_connections()

    def stop(self) -> None:
        leftovers = self.session_processes()
        self.sshd.stop()
        for process in leftovers:
            with contextlib.suppress(psutil.Error):
                process.send_signal(signal.SIGKILL)


@dataclass
class InProcessSshdFactory:
    """Starts in-process machines sharing one client key and one known_hosts file (as `SshdFactory`)."""

    base: Path
    channel = "ssh"  # the wb.yaml key of this factory's targets
    host_keys = True  # wb checks each machine's host key
    servers: list[InProcessServer] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        self.base.chmod(0o700)
        self._client_key = new_key()
        self.client_key = self.base / "client_key"
        self.client_key.write_bytes(private_openssh(self._client_key))
        self.client_key.chmod(0o600)
        self.client_public_key = public_line(self._client_key)
        Path(f"{self.client_key}.pub").write_text(self.client_public_key + "\n")
        self.known_hosts = self.base / "known_hosts"
        self.known_hosts.write_text("")
        self.client_config = self.write_client_config("client_config")
        self.config_dir = self.base / "wbconfig"
        self.config_dir.mkdir(mode=0o700, exist_ok=True)

    def write_client_config(self, name: str, extra: str = "", *, known_hosts: Path | None = None) -> Path:
        """An OpenSSH client config for every host: the fixture's key and known_hosts, nothing from ~/.ssh."""
        path = self.base / name
        path.write_text(
            f"Host *\n"
            f"  IdentityFile {self.client_key}\n"
            f"  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {known_hosts or self.known_hosts}\n"
            f"  GlobalKnownHostsFile {self.base / 'no-global-known-hosts'}\n"
            f"  PasswordAuthentication no\n"
            f"  KbdInteractiveAuthentication no\n"
            f"  GSSAPIAuthentication no\n" + extra
        )
        return path

    def known_hosts_line(self, server: InProcessServer) -> str:
        return f"[{server.host}]:{server.port} {server.host_public_key}\n"

    def start(self, host: str = "127.0.0.1", *, remember_key: bool = True, sshd_options: str = "") -> InProcessServer:
        if sshd_options:
            raise ValueError("sshd_options are OpenSSH's: a test that needs them belongs to the OpenSSH tier only")
        root = self.base / f"sshd-{host}-{len(self.servers)}"
        root.mkdir(mode=0o700)
        for sub in ("wbhome", "projects", "bin", "home"):
            (root / sub).mkdir(mode=0o700)
        python_bin = Path(sys.executable).parent
        env = {
            # What sshd gives a session (HOME, USER, LOGNAME, SHELL) plus the OpenSSH template's SetEnv;
            # HOME is the machine's own, so a harness writing there stays inside the machine.
            "HOME": str(root / "home"),
            "USER": USER,
            "LOGNAME": USER,
            "SHELL": "/bin/sh",
            "WB_HOME": str(root / "wbhome"),
            "WB_PROJECTS_ROOT": str(root / "projects"),
            "WB_CONFIG": str(root / "remote-wb.yaml"),
            "PATH": f"{root / 'bin'}:{python_bin}:/usr/local/bin:/usr/bin:/bin",
        }
        sshd = ShellSshd(client_key=self._client_key, host=host, env=env, cwd=root / "home")
        sshd.start()
        server = InProcessServer(host, root, sshd)
        self.servers.append(server)
        if remember_key:
            with open(self.known_hosts, "a") as handle:
                handle.write(self.known_hosts_line(server))
        return server

    def write_wb_config(self, name: str, targets: dict[str, dict[str, Any]]) -> Path:
        """A wb.yaml (0600 in a 0700 dir) whose session_move.targets are `{machine: {host, port, …}}`."""
        path = self.config_dir / f"{name}.yaml"
        document = {"session_move": {"targets": {machine: {"ssh": ssh} for machine, ssh in targets.items()}}}
        path.write_text(yaml.safe_dump(document))
        path.chmod(0o600)
        return path

    def address(self, server: InProcessServer) -> dict[str, Any]:
        """What `wb machines --json` shows of where this machine is."""
        return {"host": server.host, "port": server.port, "user": USER}

    def target(self, server: InProcessServer, **extra: Any) -> dict[str, Any]:
        return {"host": server.host, "port": server.port, "user": USER, **extra}

    def close(self) -> None:
        for server in self.servers:
            server.stop()
        self.servers.clear()


def keygen(path: Path) -> str:
    """A fresh ed25519 key pair at path, without ssh-keygen; returns the public key line."""
    key = new_key()
    path.write_bytes(private_openssh(key))
    os.chmod(path, 0o600)
    line = public_line(key) + " wb-test"
    Path(f"{path}.pub").write_text(line + "\n")
    return line
