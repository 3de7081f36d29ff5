"""The tiers of machines the remote suites run over: two SSH tiers, two exec tiers, the in-process channel.

`ssh_tier` is a module-scoped fixture parametrized over TIERS; `ssh_machines` is the factory
of that tier (one interface: `SshMachines`), shared by one test module. A module that asks
for `ssh_machines` runs once per tier, the in-process one first.

- SSH_TIERS, every remote suite: `inprocess` (asyncssh servers in this process,
  tests/integration/inprocess_sshd.py: no root, no sshd) and `openssh` (real sshd,
  tests/integration/sshd.py, for fidelity: a real sshd's sessions, SetEnv, key exchange).
- EXEC_TIERS, the CLI, fleet and courier suites (`ssh_tier = channel_tiers(...)` in the module):
  `exec-env` (an exec target `env -i -C HOME K=V … wb` per machine, the machine's own home and
  projects with its sshd session's environment) and `exec-ssh` (an exec target `ssh -T …`
  through OpenSSH to a loopback sshd); tests/integration/exec_machines.py.
- INPROCESS_CHANNEL, the CLI and fleet suites: wb started by tests/integration/inprocess_channel_cli.py
  (`wb_command(tier)`), which reaches each exec-env machine with tests/inprocess_channel.py's
  receiver inside the CLI's own process (no command, no courier). The fleet's broken machines
  have their in-process form there: a machine whose home is gone, one whose receiver holds its answer.

A test that exercises what only some tiers have pins them with
`@pytest.mark.parametrize("ssh_tier", [...], indirect=True)` and says why in its docstring
(host keys and MaxSessions: SSH_TIERS; restarting sshd: openssh; a wb_path script or a session
to kill: not the in-process channel). Without root or sshd the OpenSSH-backed tiers skip with
the reason (a failure under CI, which runs them all).

Time: the suite runs twice in CI (WB_COURIER=on, off) and must stay near 20 minutes a pass on
2 cores. The SSH tiers run in both passes; each other tier in one (`channel_tiers(warm=…,
cold=…)`), so that each pass gains about the same (~2-3 minutes): the CLI and fleet suites run
exec-ssh warm (the courier's `ssh -T` serve process per exec machine) and exec-env cold; the
in-process channel is cold by nature (the launcher runs the CLI itself, whatever WB_COURIER says),
so it runs the same in either pass: the CLI suite's in the off pass, the fleet suite's in the on
pass, to keep the passes even. The courier suite's remote tests set
WB_COURIER=on themselves, so both passes would run them alike: they are `courier_independent`
(tests/conftest.py) and run, over every tier, in the WB_COURIER=on pass only
(`channel_tiers(warm=EXEC_TIERS, cold=())`). They are not run over the in-process channel: each
checks what the courier keeps for a command on the machine (its serve process, a one-call peer's
`wb_path` script, MaxSessions, host keys), and that channel runs no command and cannot be carried
by the courier (its receiver lives in the caller).

WB_TEST_SSH_TIERS=inprocess,exec-env (any of ALL_TIERS, comma-separated) runs those tiers only,
a named one in either courier pass; unset, all of this pass's.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import psutil
import pytest

SSH_TIERS = ("inprocess", "openssh")
EXEC_TIERS = ("exec-env", "exec-ssh")
INPROCESS_CHANNEL = "inprocess-channel"  # the CLI and fleet suites (tests/integration/inprocess_channel_cli.py)
TIERS = SSH_TIERS  # what a module asking for `ssh_machines` runs over by default
ALL_TIERS = (*SSH_TIERS, *EXEC_TIERS, INPROCESS_CHANNEL)  # the CLI, fleet and courier suites: `channel_tiers()`
TIERS_ENV = "WB_TEST_SSH_TIERS"


class SshMachine(Protocol):
    """One machine reached over SSH: where it listens, its files and its own home."""

    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def root(self) -> Path: ...
    @property
    def host_public_key(self) -> str: ...
    @property
    def wb_home(self) -> Path: ...
    @property
    def projects_root(self) -> Path: ...
    @property
    def bin_dir(self) -> Path: ...

    def log(self) -> str: ...
    def script(self, name: str, body: str) -> Path: ...
    def session_processes(self) -> list[psutil.Process]: ...
    def kill_sessions(self) -> None: ...
    def stop(self) -> None: ...


class SshMachines(Protocol):
    """Starts machines sharing one client key, one known_hosts file and one client config."""

    @property
    def base(self) -> Path: ...
    @property
    def channel(self) -> str: ...
    @property
    def host_keys(self) -> bool: ...
    @property
    def client_key(self) -> Path: ...
    @property
    def known_hosts(self) -> Path: ...
    @property
    def client_config(self) -> Path: ...

    def start(self, host: str = ..., *, remember_key: bool = ..., sshd_options: str = ...) -> Any: ...
    def write_client_config(self, name: str, extra: str = "", *, known_hosts: Path | None = None) -> Path: ...
    def known_hosts_line(self, server: Any) -> str: ...
    def write_wb_config(self, name: str, targets: dict[str, dict[str, Any]]) -> Path: ...
    def target(self, server: Any, **extra: Any) -> dict[str, Any]: ...
    def address(self, server: Any) -> dict[str, Any]: ...
    def close(self) -> None: ...


def selected_tiers() -> tuple[str, ...]:
    """The tiers WB_TEST_SSH_TIERS names (comma-separated), or all of them."""
    named = [word.strip() for word in os.environ.get(TIERS_ENV, "").split(",") if word.strip()]
    unknown = sorted(set(named) - set(ALL_TIERS))
    if unknown:
        raise pytest.UsageError(f"{TIERS_ENV}={os.environ[TIERS_ENV]!r}: unknown tier {unknown[0]!r}; use {ALL_TIERS}")
    return tuple(named) or ALL_TIERS


def make_machines(tier: str, base: Path) -> SshMachines:
    """A factory of `tier`'s machines under `base` (the caller closes it)."""
    if tier == "inprocess":
        from tests.integration.inprocess_sshd import InProcessSshdFactory

        return InProcessSshdFactory(base)
    if tier == INPROCESS_CHANNEL:  # the exec-env machines; the in-process channel reads their argv
        from tests.integration.inprocess_channel_cli import InProcessChannelFactory

        return InProcessChannelFactory(base)
    if tier == "exec-env":
        from tests.integration.exec_machines import ExecEnvFactory

        return ExecEnvFactory(base)
    if tier == "exec-ssh":
        from tests.integration.exec_machines import ExecSshFactory

        return ExecSshFactory(base)
    from tests.integration.sshd import SshdFactory

    return SshdFactory(base)


def wb_command(tier: str) -> list[str]:
    """How a test starts the caller's `wb` over `tier`: wb itself, or the in-process channel's launcher."""
    if tier == INPROCESS_CHANNEL:
        return [sys.executable, "-m", "tests.integration.inprocess_channel_cli"]
    return [sys.executable, "-m", "courier.main"]


def wb_environment(tier: str) -> dict[str, str]:
    """What the caller's environment needs besides its own for `wb_command(tier)`."""
    if tier == INPROCESS_CHANNEL:
        # The launcher is a tests module; it runs the CLI itself, so the courier is never asked.
        return {"PYTHONPATH": str(Path(__file__).resolve().parents[1]), "WB_COURIER": "off"}
    return {}


def require_tier(tier: str) -> None:
    """Skip (fail under CI) when this tier cannot or must not run here, saying why."""
    from conftest import unavailable

    from tests.integration.sshd import sshd_unavailable_reason

    if tier not in selected_tiers():
        unavailable(f"the {tier} tier is not selected ({TIERS_ENV}={os.environ.get(TIERS_ENV)})")
    if tier in ("openssh", "exec-ssh"):
        reason = sshd_unavailable_reason()
        if reason is not None:
            unavailable(f"the {tier} tier cannot run: {reason}")


@pytest.fixture(scope="module", params=TIERS)
def ssh_tier(request: pytest.FixtureRequest) -> str:
    """Which SSH machines this module's tests run over (see the module docstring)."""
    tier = str(request.param)
    require_tier(tier)
    return tier


def active_tiers(*, warm: tuple[str, ...] = EXEC_TIERS, cold: tuple[str, ...] = EXEC_TIERS) -> list[str]:
    """The tiers a module runs over in this courier pass: the SSH tiers, and those `warm` or `cold` names.

    The SSH tiers run in both courier passes; any other tier in the pass whose mode names it
    (`warm`: WB_COURIER=on, `cold`: off), or in both (see "Time" above). A tier named in
    WB_TEST_SSH_TIERS runs whatever the pass.
    """
    from conftest import courier_on

    passes = warm if courier_on() else cold
    named = os.environ.get(TIERS_ENV, "").split(",")
    return [tier for tier in ALL_TIERS if tier in SSH_TIERS or tier in passes or tier in named]


def channel_tiers(*, warm: tuple[str, ...] = EXEC_TIERS, cold: tuple[str, ...] = EXEC_TIERS) -> Any:
    """A module's own `ssh_tier` fixture over `active_tiers(warm=…, cold=…)`: `ssh_tier = channel_tiers(…)`."""
    params = active_tiers(warm=warm, cold=cold)

    @pytest.fixture(scope="module", params=params, name="ssh_tier")
    def tier(request: pytest.FixtureRequest) -> str:
        """Which machines this module's tests run over: the SSH tiers, then the exec tiers."""
        chosen = str(request.param)
        require_tier(chosen)
        return chosen

    return tier


@pytest.fixture(scope="module")
def ssh_machines(ssh_tier: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshMachines]:
    """This tier's machines, shared by one test module and stopped after it."""
    factory = make_machines(ssh_tier, tmp_path_factory.mktemp(f"ssh-{ssh_tier}"))
    try:
        yield factory
    finally:
        factory.close()
