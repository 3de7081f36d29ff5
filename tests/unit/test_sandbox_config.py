"""wb.yaml's `sandbox:` section and a profile's sandbox keys (docs/config.md#sandbox); the bwrap command line
(courier/runs/sandbox.py) and the `sandbox:` status line."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from courier.config import Problem, load_config
from courier.errors import UsageError
from courier.ops.status import sandbox_text
from courier.runs import sandbox
from protocol.models import Sandbox


def _load(tmp_path: Path, text: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "wb.yaml"
    path.write_text(text)
    path.chmod(0o600)
    tmp_path.chmod(0o700)
    return load_config(path)


PROFILE = "agents:\n  profiles:\n    p: {{harness: command, command: [/bin/true]{extra}}}\n"


def test_the_defaults_are_auto_and_no_writable_path(tmp_path: Path) -> None:
    config = _load(tmp_path, PROFILE.format(extra=""))
    assert sandbox.setting_for(config, "p") == sandbox.Setting("auto", "wb.yaml's sandbox.default", ())


def test_the_profile_wins_over_the_section_and_a_bare_off_is_off(tmp_path: Path) -> None:
    text = "sandbox:\n  default: required\n  writable: [/srv/cache]\n" + PROFILE.format(
        extra=", sandbox: off, sandbox_writable: [/srv/mine]"
    )
    config = _load(tmp_path, text)
    assert sandbox.setting_for(config, "p") == sandbox.Setting("off", "profile p", ("/srv/mine",))
    section_only = _load(tmp_path, "sandbox:\n  default: off\n  writable: [/srv/cache]\n" + PROFILE.format(extra=""))
    expected = sandbox.Setting("off", "wb.yaml's sandbox.default", ("/srv/cache",))
    assert sandbox.setting_for(section_only, "p") == expected


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ("sandbox:\n  default: sometimes\n", "sandbox.default: must be auto, required or off"),
        ("sandbox:\n  writable: [rel/path]\n", "sandbox.writable: 'rel/path' must be an absolute, clean path"),
        ("sandbox:\n  writable: /srv\n", "sandbox.writable: must be a list of absolute paths"),
        ("sandbox:\n  network: true\n", "sandbox.network: unknown key (the keys are default and writable)"),
        ("sandbox: [auto]\n", "sandbox: must be a mapping"),
    ],
)
def test_a_bad_section_refuses_the_file_naming_the_key_and_the_rule(
    tmp_path: Path, section: str, message: str
) -> None:
    with pytest.raises(UsageError) as caught:
        _load(tmp_path, section)
    assert str(caught.value).startswith(f"{tmp_path / 'wb.yaml'}: ") and message in str(caught.value)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (", sandbox: maybe", "agents.profiles.p.sandbox: Input should be 'auto', 'required' or 'off'"),
        (", sandbox_writable: [/a/../b]", "sandbox_writable: '/a/../b' must be an absolute, clean path other than /"),
        (", network: ['https://pypi.org/']", "must be HOST or HOST:PORT"),
        (", network: []", "network must be true, false or a list of HOST or HOST:PORT"),
    ],
)
def test_a_bad_profile_key_makes_that_profile_unusable(tmp_path: Path, extra: str, message: str) -> None:
    entry = _load(tmp_path, PROFILE.format(extra=extra)).profiles["p"]
    assert isinstance(entry, Problem) and message in entry.message, entry


def test_a_network_list_is_kept_as_written(tmp_path: Path) -> None:
    config = _load(tmp_path, PROFILE.format(extra=", network: [pypi.org, 'files.pythonhosted.org:443']"))
    assert config.profile("p").network == ["pypi.org", "files.pythonhosted.org:443"]


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (Sandbox(kind="bwrap", network="provider"), "bwrap (network: provider only)"),
        (Sandbox(kind="bwrap", network="all"), "bwrap (network: all)"),
        (Sandbox(kind="bwrap", network=["a.org", "b.com:8443"]), "bwrap (network: a.org, b.com:8443)"),
        (Sandbox(kind="none", reason="bubblewrap not found"), "none (bubblewrap not found)"),
    ],
)
def test_the_status_line(value: Sandbox, text: str) -> None:
    assert sandbox_text(value) == text


def test_the_command_line_hides_the_homes_and_keeps_the_worker_in_its_namespaces(tmp_path: Path) -> None:
    worktree = tmp_path / "wt"
    worktree.mkdir()
    run_dir = tmp_path / "home" / "agents" / "agt-1"
    plan = sandbox.Plan(
        bwrap="/usr/bin/bwrap",
        worktree=str(worktree),
        run_dir=run_dir,
        harness_home=run_dir / "harness-home",
        wb_home=tmp_path / "home",
        path_env="/usr/bin:/bin",
        writable=("/srv/cache",),
    )
    plan.prepare()
    argv = plan.command_line(["/bin/true", "x"])
    assert argv[:5] == ["/usr/bin/bwrap", "--die-with-parent", "--unshare-pid", "--unshare-ipc", argv[4]]
    assert "--unshare-net" in argv and "--new-session" not in argv
    assert argv[argv.index("--tmpfs", argv.index("--proc")) :].count("--tmpfs") >= 2
    assert ["--tmpfs", str(tmp_path / "home")] == argv[argv.index(str(tmp_path / "home")) - 1 :][:2]
    assert ["--bind-try", str(worktree), str(worktree)] == argv[argv.index(str(worktree)) - 1 :][:3]
    assert ["--chdir", str(worktree), "--"] == argv[argv.index("--chdir") :][:3]
    assert argv[-2:] == ["/bin/true", "x"]
    assert str(plan.socket_dir) not in argv  # no provider: no forwarder and no sockets bound


def test_a_harness_tmp_dir_is_the_runs_own_bound_over_an_empty_one_of_the_users(tmp_path: Path) -> None:
    """Codex makes /tmp/codex-daemon-<uid> (docs/harnesses.md): /tmp stays read-only; that directory is the run's."""
    worktree = tmp_path / "wt"
    worktree.mkdir()
    run_dir = tmp_path / "home" / "agents" / "agt-1"
    made, linked = f"/tmp/wb-unit-daemon-{os.getpid()}", f"/tmp/wb-unit-link-{os.getpid()}"
    os.symlink(str(tmp_path), linked)  # not a directory of the user's: never bound over
    try:
        plan = sandbox.Plan(
            bwrap="/usr/bin/bwrap", worktree=str(worktree), run_dir=run_dir, harness_home=run_dir / "harness-home",
            wb_home=tmp_path / "home", path_env="/usr/bin:/bin", tmp_dirs=[made, linked],
        )  # fmt: skip
        plan.prepare()
        assert os.path.isdir(made) and oct(os.stat(made).st_mode & 0o777) == "0o700"
        argv = plan.command_line(["/bin/true"])
        private = str(run_dir / "tmp" / f"slash-tmp-{os.path.basename(made)}")
        assert ["--bind-try", private, made] == argv[argv.index(private) - 1 :][:3] and os.path.isdir(private)
        assert linked not in argv and "/tmp" not in argv  # /tmp itself is never bound writable
    finally:
        os.unlink(linked)
        os.rmdir(made)


def test_wbs_own_code_and_interpreter_are_bound_back_from_a_hidden_home_but_never_a_whole_home() -> None:
    """A harness that is a wb module (the demo's stand-ins: `python -m courier.demo.standin_claude`) runs on
    wb's interpreter and code, which may sit in a hidden home (a venv or checkout under ~): both come back
    read-only. A hidden root itself never does, even when wb's code is that root."""
    from courier.runs import sandbox

    code = str(sandbox._WB_CODE)
    home = os.path.dirname(code)
    reads = sandbox._needed_reads(["/bin/true"], "/usr/bin:/bin", [home], forwarder=False)
    assert code in reads
    if os.path.realpath(sys.prefix).startswith(home + "/"):
        assert os.path.realpath(sys.prefix) in reads
    assert home not in reads
    assert code not in sandbox._needed_reads(["/bin/true"], "/usr/bin:/bin", [code], forwarder=False)
