"""The transport against a containerised machine (fixtures/sshd), through pytest-docker.

Skipped, saying so, when no Docker engine is reachable. The container runs this
checkout's wb behind OpenSSH; the test owns the host key and the client key.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from pytest_docker.plugin import Services

from courier import __version__
from courier.call import caller as client
from courier.channels import ssh_client as ssh
from courier.config import load_config
from courier.errors import TransportError
from protocol.models import RemoteRequest
from tests.integration.sshd import keygen

REPO_ROOT = Path(__file__).resolve().parents[2]


def _docker_unavailable_reason() -> str | None:
    if shutil.which("docker") is None:
        return "no docker CLI on PATH"
    try:
        probe = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"docker info failed: {exc}"
    if probe.returncode != 0:
        return "no reachable Docker engine (docker info failed)"
    return None


_REASON = _docker_unavailable_reason()
pytestmark = [pytest.mark.docker, pytest.mark.skipif(_REASON is not None, reason=str(_REASON))]


@pytest.fixture(scope="session")
def docker_keys(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """host_key and authorized_keys for the container, plus the client key that matches."""
    keys = tmp_path_factory.mktemp("docker-sshd")
    keygen(keys / "host_key")
    public = keygen(keys / "client_key")
    (keys / "authorized_keys").write_text(public + "\n")
    for name in ("host_key", "authorized_keys"):
        (keys / name).chmod(0o644)  # read by sshd in the container through a bind mount
    previous = os.environ.get("WB_SSHD_FIXTURE_DIR")
    os.environ["WB_SSHD_FIXTURE_DIR"] = str(keys)
    yield keys
    if previous is None:
        os.environ.pop("WB_SSHD_FIXTURE_DIR", None)
    else:
        os.environ["WB_SSHD_FIXTURE_DIR"] = previous


@pytest.fixture(scope="session")
def docker_compose_file() -> str:
    return str(REPO_ROOT / "fixtures" / "sshd" / "docker-compose.yml")


def test_version_and_list_through_a_container(
    docker_keys: Path, docker_services: Services, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real machine image answers version and list over SSH with host-key verification on."""
    port = docker_services.port_for("sshd", 22)
    host_public = " ".join((docker_keys / "host_key.pub").read_text().split()[:2])
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{port} {host_public}\n")
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text(
        f"Host *\n  IdentityFile {docker_keys / 'client_key'}\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {known}\n  GlobalKnownHostsFile {tmp_path / 'none'}\n"
    )
    monkeypatch.setenv(ssh.CONFIG_ENV, str(ssh_config))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    wb_yaml = tmp_path / "cfg" / "wb.yaml"
    wb_yaml.parent.mkdir(mode=0o700)
    wb_yaml.write_text(
        f"session_move:\n  targets:\n    box:\n      ssh: {{host: 127.0.0.1, port: {port}, user: root}}\n"
    )
    wb_yaml.chmod(0o600)
    config = load_config(wb_yaml)

    def answers() -> bool:
        try:
            return client.call(config, "box", RemoteRequest(schema_version=1, operation="version")).failure == ""
        except TransportError:  # the container may still be starting sshd
            return False

    docker_services.wait_until_responsive(check=answers, timeout=120.0, pause=0.5)
    version = client.call(config, "box", RemoteRequest(schema_version=1, operation="version"))
    assert version.wb_version == __version__ and version.home_id
    listing = client.call(config, "box", RemoteRequest(schema_version=1, operation="list"))
    assert listing.failure == "" and listing.results_of() == []
