"""agents.executor.ray refusals that need no cluster (docs/ray.md, docs/config.md): exit 2 naming what to fix."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import CONFIG_TEMPLATE, CREDENTIAL_ENV, Machine

RAY_HEAD = "  executor:\n    ray:\n      address: 127.0.0.1:6380\n"


def head_config(machine: Machine, executor: str = RAY_HEAD, profile_extra: str = "") -> None:
    text = CONFIG_TEMPLATE.format(credential_env=CREDENTIAL_ENV).replace("agents:\n", "agents:\n" + executor, 1)
    machine.write_config(text + profile_extra)


def dispatch_args() -> tuple[str, ...]:
    return ("agent", "dispatch", "--new-worktree", "w1", "--profile", "fake", "--repo", "acme/widget", "--task", "x")


def test_without_the_extra_a_ray_head_refuses_naming_it(machine: Machine, tmp_path: Path) -> None:
    # A Python where `ray` cannot be imported: sys.modules["ray"] = None makes find_spec say so.
    shim = tmp_path / "no-ray"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text('import sys\nsys.modules["ray"] = None\n')
    head_config(machine)
    machine.clone()
    env = {"PYTHONPATH": f"{shim}:{machine.env['PYTHONPATH']}"}
    for args in (dispatch_args(), ("agent", "list")):
        done = machine.wb(*args, env=env)
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith("error: "), done.stderr
        assert "agents.executor.ray needs the optional extra wb[ray]" in done.stderr, done.stderr
        assert "pip install 'wb[ray]'" in done.stderr and "Traceback" not in done.stderr
    assert not (machine.home / "agents").exists() or not any((machine.home / "agents").iterdir())


def test_a_bad_executor_block_is_refused_naming_the_key(machine: Machine) -> None:
    cases = {
        "  executor:\n    ray:\n      adress: auto\n": "agents.executor.ray.adress: unknown key",
        "  executor:\n    slurm: {}\n": "agents.executor.slurm: unknown executor",
        "  executor:\n    ray:\n      address: 'http://x'\n": 'ray.address: must be "auto" or HOST:PORT',
    }
    for block, message in cases.items():
        head_config(machine, block)
        done = machine.wb(*dispatch_args())
        assert done.returncode == 2, done.stderr
        assert message in done.stderr, done.stderr


def test_bad_profile_resources_are_refused_at_dispatch(machine: Machine) -> None:
    cases = {
        "      resources: {cpus: -1}\n": "resources.cpus",
        "      resources: {memory: lots}\n": 'memory must be bytes or a size such as "4GiB"',
        "      resources: {custom: {'wb-repo:acme/x': 1}}\n": "not wb-repo:",
        "      resources: {cores: 2}\n": "resources.cores",
        "      resources: {labels: {'ray.io/node-id': x}}\n": "not ray.io/",
        "      resources: {labels: {zone: 'in(a,'}}\n": "labels.zone must be VALUE, !VALUE, in(A, B) or !in(A, B)",
    }
    for extra, message in cases.items():
        head_config(machine, profile_extra=extra)
        done = machine.wb(*dispatch_args())
        assert done.returncode == 2, done.stderr
        assert message in done.stderr, done.stderr
