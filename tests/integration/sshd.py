"""Real OpenSSH sshd instances on loopback for transport tests, and the client-side files that reach them.

`SshdFactory(base)` makes one client key and one known_hosts file, then `start("127.0.0.1")`
(or 127.0.0.2, … for a fleet) runs `/usr/sbin/sshd -D -E <log> -f <generated config>` on a
free port, with its own host key, authorized_keys, and `SetEnv WB_HOME=… PATH=…` so the
remote `wb` (this checkout's console script) runs as another machine with its own home
(its PATH also holds the directories where the caller found the real harness CLIs).
`start` returns only after a real SSH key exchange (ssh-keyscan) presented the expected
host key. Nothing here touches the real ~/.ssh: the client reads `client_config`
through `WB_SSH_CONFIG`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import string
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml

from tests.cli_lookup import harness_cli_dirs

SSHD = "/usr/sbin/sshd"
PRIVSEP_DIR = Path("/run/sshd")
READY_TIMEOUT_S = 15.0
DEFAULT_PATH = ("/usr/local/bin", "/usr/bin", "/bin")


def sshd_unavailable_reason() -> str | None:
    """Why these tests cannot run here, or None when they can."""
    if not os.access(SSHD, os.X_OK):
        return f"{SSHD} is not installed (Debian package openssh-server)"
    if os.geteuid() != 0:
        return "the sshd fixture runs sshd as root (it must setuid into the session)"
    for tool in ("ssh-keygen", "ssh-keyscan"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian package openssh-client)"
    return None


def keygen(path: Path) -> str:
    """A fresh ed25519 key pair at path; returns the public key line."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "wb-test", "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return Path(f"{path}.pub").read_text().strip()


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


SSHD_CONFIG_TEMPLATE = Path(__file__).resolve().parents[2] / "fixtures" / "sshd" / "sshd_config.template"


@dataclass
class SshdServer:
    """One running sshd: where it listens, its files, and the remote machine's home."""

    host: str
    port: int
    root: Path
    host_public_key: str
    process: subprocess.Popen[bytes]
    log_path: Path

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
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def script(self, name: str, body: str) -> Path:
        """An executable `#!/bin/sh` script in this machine's bin dir, usable as wb_path."""
        path = self.bin_dir / name
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(0o755)
        return path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        for child in _descendants(self.process.pid):
            _signal(child, signal.SIGKILL)

    def session_processes(self) -> list[psutil.Process]:
        """The per-connection sshd processes (not the listener)."""
        return _descendants(self.process.pid)

    def kill_sessions(self) -> None:
        """SIGKILL every per-connection sshd (not the listener): each client sees its connection drop."""
        for process in self.session_processes():
            with contextlib.suppress(psutil.Error):  # a short-lived child may be gone by now
                if process.name() == "sshd":
                    process.send_signal(signal.SIGKILL)


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _signal(process: psutil.Process, signum: int) -> None:
    with contextlib.suppress(psutil.Error):
        process.send_signal(signum)


@dataclass
class SshdFactory:
    """Starts sshd instances sharing one client key and one known_hosts file."""

    base: Path
    channel = "ssh"  # the wb.yaml key of this factory's targets
    host_keys = True  # wb checks each machine's host key
    servers: list[SshdServer] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        self.base.chmod(0o700)
        self.client_key = self.base / "client_key"
        self.client_public_key = keygen(self.client_key)
        self.known_hosts = self.base / "known_hosts"
        self.known_hosts.write_text("")
        self.client_config = self.write_client_config("client_config")
        self.config_dir = self.base / "wbconfig"
        self.config_dir.mkdir(mode=0o700, exist_ok=True)
        # Where the caller found the real CLIs (a non-default npm prefix, say): a remote run finds the same ones.
        self.cli_dirs = [d for d in harness_cli_dirs() if d not in DEFAULT_PATH]

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

    def known_hosts_line(self, server: SshdServer) -> str:
        return f"[{server.host}]:{server.port} {server.host_public_key}\n"

    def start(self, host: str = "127.0.0.1", *, remember_key: bool = True, sshd_options: str = "") -> SshdServer:
        """`sshd_options` lines go before the template's, so they win (sshd keeps a keyword's first value)."""
        if not PRIVSEP_DIR.is_dir():
            PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
        root = self.base / f"sshd-{host}-{len(self.servers)}"
        root.mkdir(mode=0o700)
        for sub in ("wbhome", "projects", "bin"):
            (root / sub).mkdir(mode=0o700)
        host_key = root / "host_key"
        host_public = " ".join(keygen(host_key).split()[:2])
        authorized = root / "authorized_keys"
        authorized.write_text(self.client_public_key + "\n")
        log_path = root / "sshd.log"
        python_bin = Path(sys.executable).parent
        last_error = ""
        for _attempt in range(5):
            port = free_port(host)
            config = root / "sshd_config"
            config.write_text(
                sshd_options
                + string.Template(SSHD_CONFIG_TEMPLATE.read_text()).substitute(
                    SSHD_PORT=port,
                    SSHD_LISTEN=host,
                    SSHD_HOST_KEY=host_key,
                    SSHD_AUTHORIZED_KEYS=authorized,
                    WB_HOME=root / "wbhome",
                    WB_PROJECTS_ROOT=root / "projects",
                    WB_CONFIG=root / "remote-wb.yaml",
                    SSHD_PATH=":".join([str(root / "bin"), str(python_bin), *self.cli_dirs, *DEFAULT_PATH]),
                )
            )
            # -E (not -e): with -e a session child's debug lines would land on the session's stderr.
            process = subprocess.Popen(
                [SSHD, "-D", "-E", str(log_path), "-f", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            server = SshdServer(host, port, root, host_public, process, log_path)
            try:
                self._wait_ready(server)
            except RuntimeError as exc:
                last_error = str(exc)
                server.stop()
                continue
            self.servers.append(server)
            if remember_key:
                with open(self.known_hosts, "a") as handle:
                    handle.write(self.known_hosts_line(server))
            return server
        raise RuntimeError(f"sshd on {host} did not start: {last_error}")

    def _wait_ready(self, server: SshdServer) -> None:
        """Wait for the listener, then for one real key exchange that shows the expected host key."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        marker = f"Server listening on {server.host} port {server.port}"
        while marker not in server.log():
            if server.process.poll() is not None:
                raise RuntimeError(f"sshd exited with {server.process.returncode}: {server.log()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"sshd did not listen within {READY_TIMEOUT_S}s: {server.log()[-2000:]}")
            time.sleep(0.01)
        scan = subprocess.run(
            ["ssh-keyscan", "-T", "5", "-t", "ed25519", "-p", str(server.port), server.host],
            capture_output=True,
            text=True,
            timeout=READY_TIMEOUT_S,
        )
        key_blob = server.host_public_key.split()[1]
        if key_blob not in scan.stdout:
            raise RuntimeError(f"ssh-keyscan did not see the host key: {scan.stdout!r} {scan.stderr[-500:]!r}")

    def write_wb_config(self, name: str, targets: dict[str, dict[str, Any]]) -> Path:
        """A wb.yaml (0600 in a 0700 dir) whose session_move.targets are `{machine: {host, port, …}}`."""
        path = self.config_dir / f"{name}.yaml"
        document = {"session_move": {"targets": {machine: {"ssh": ssh} for machine, ssh in targets.items()}}}
        path.write_text(yaml.safe_dump(document))
        path.chmod(0o600)
        return path

    def address(self, server: SshdServer) -> dict[str, Any]:
        """What `wb machines --json` shows of where this machine is."""
        return {"host": server.host, "port": server.port, "user": "root"}

    def target(self, server: SshdServer, **extra: Any) -> dict[str, Any]:
        return {"host": server.host, "port": server.port, "user": "root", **extra}

    def close(self) -> None:
        for server in self.servers:
            server.stop()
        self.servers.clear()
