"""`courier.dispatch_over_serve` (docs/courier.md, "Environment"): the setting, the login files a serve session
watches, and its refusal of a run whose environment a new login would set otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import REPO_ROOT

from courier import stamp
from courier.capabilities import DISPATCH_IN_SERVE, LOGIN_WATCH, SERVE
from courier.channels.serve_lines import needs_fresh_session
from courier.config_file import Settings, read_settings
from courier.errors import NeedsNewLogin, UsageError
from courier.runs.admission import require_session_environment


def _settings(tmp_path: Path, text: str) -> Settings:
    path = tmp_path / "wb.yaml"
    path.write_text(text)
    path.chmod(0o600)
    return read_settings(path)


def test_the_setting_is_on_unless_said_and_must_be_true_or_false(tmp_path: Path) -> None:
    assert _settings(tmp_path, "courier: {idle: 1m}\n").courier_dispatch_over_serve is True
    assert _settings(tmp_path, "courier: {dispatch_over_serve: false}\n").courier_dispatch_over_serve is False
    with pytest.raises(UsageError, match=r"courier\.dispatch_over_serve: must be true or false"):
        _settings(tmp_path, "courier: {dispatch_over_serve: yes please}\n")


def test_dispatch_takes_the_serve_session_only_of_a_peer_that_watches_its_login_files() -> None:
    watching = [SERVE, LOGIN_WATCH]
    for operation in ("dispatch", "continue"):
        assert not needs_fresh_session(operation, watching)
        assert needs_fresh_session(operation, watching, serve_dispatch=False)
        assert needs_fresh_session(operation, [SERVE])  # an older peer: its session would keep a stale PATH
        assert not needs_fresh_session(operation, [SERVE, DISPATCH_IN_SERVE], serve_dispatch=False)
    assert needs_fresh_session("version", watching)  # it reports what a new login finds
    assert not needs_fresh_session("status", [SERVE])


@pytest.fixture
def login_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("ENV", raising=False)
    monkeypatch.setenv("BASH_ENV", str(tmp_path / "bash_env"))
    monkeypatch.setattr(stamp, "_watched_login", [])  # this process was not a serve session
    return home


@pytest.mark.parametrize(
    "change",
    [
        "create ~/.profile",
        "edit ~/.bashrc",
        "remove ~/.bashrc",
        "edit $BASH_ENV",
        "add to ~/.config/environment.d",
        "make ~/.local/bin",
    ],
)
def test_a_change_a_new_login_would_read_changes_the_login_stamp(login_home: Path, change: str) -> None:
    bashrc = login_home / ".bashrc"
    bashrc.write_text("export A=1\n")
    environment_d = login_home / ".config" / "environment.d"
    environment_d.mkdir(parents=True)
    before = stamp.login_stamp()
    assert stamp.login_stamp() == before  # nothing changed: the same stamp
    match change:
        case "create ~/.profile":
            (login_home / ".profile").write_text("PATH=/opt/new/bin:$PATH\n")
        case "edit ~/.bashrc":
            bashrc.write_text("export A=2\n")  # the same size: its mtime or inode tells
            os.utime(bashrc, ns=(1, 1))
        case "remove ~/.bashrc":
            bashrc.unlink()
        case "edit $BASH_ENV":
            Path(os.environ["BASH_ENV"]).write_text("export PATH=/opt/new/bin:$PATH\n")
        case "add to ~/.config/environment.d":
            (environment_d / "50-path.conf").write_text("PATH=/opt/new/bin:$PATH\n")
        case "make ~/.local/bin":
            (login_home / ".local" / "bin").mkdir(parents=True)
    assert stamp.login_stamp() != before, change


def test_a_serve_session_refuses_a_run_once_its_login_files_changed(login_home: Path) -> None:
    stamp.watch_login()
    require_session_environment("command", fresh_login=False)  # unchanged: the session's environment is current
    (login_home / ".profile").write_text("PATH=/opt/new/bin:$PATH\n")
    with pytest.raises(NeedsNewLogin, match="login files changed since this session started") as refused:
        require_session_environment("command", fresh_login=False)
    assert refused.value.failure_kind == "new_login"
    require_session_environment("command", fresh_login=True)  # a one-call session is a new login


def test_a_serve_session_refuses_a_harness_its_path_lacks_and_a_new_login_is_not_checked(
    monkeypatch: pytest.MonkeyPatch, login_home: Path, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no codex here
    with pytest.raises(NeedsNewLogin, match="codex is not on this session's PATH") as refused:
        require_session_environment("codex", fresh_login=False)
    assert refused.value.failure_kind == "new_login"
    require_session_environment("codex", fresh_login=True)  # a new login's environment is the one to trust
    require_session_environment("command", fresh_login=False)  # it names its own program


_WATCH_AFTER_A_LINE = (
    "import sys\n"
    "sys.stdin.readline()\n"  # the test writes (or not) a login file while this process is starting
    "from courier import stamp\n"
    "stamp.watch_login()\n"
    "print(stamp.login_changed())\n"
)


def _watch_in_a_new_process(login_home: Path, change: Callable[[], None]) -> str:
    """What `login_changed` says at once in a process whose login files changed (or not) after it started."""
    child = subprocess.Popen(
        [sys.executable, "-c", _WATCH_AFTER_A_LINE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "HOME": str(login_home), "PYTHONPATH": str(REPO_ROOT)},
    )
    change()
    answer, _ = child.communicate("go\n", timeout=60)
    return answer.strip()


def test_a_login_file_changed_while_a_session_was_starting_leaves_its_environment_unsure(login_home: Path) -> None:
    """The shell read the files before wb took its stamp: a file newer than the process's start may not be in
    its environment, so a run goes to a new login (courier/stamp.py `watch_login`)."""
    profile = login_home / ".profile"
    profile.write_text("PATH=/opt/old/bin:$PATH\n")
    os.utime(profile, (time.time() - 60, time.time() - 60))  # long before the session: its environment has it
    assert _watch_in_a_new_process(login_home, lambda: None) == "False"
    assert _watch_in_a_new_process(login_home, lambda: profile.write_text("PATH=/opt/new/bin:$PATH\n")) == "True"
    # A file dated in the future (a clock set back, a copy keeping another machine's times) was not written
    # while the session started: counting it would send every dispatch to a new login, for good.
    os.utime(profile, (time.time() + 3600, time.time() + 3600))
    assert _watch_in_a_new_process(login_home, lambda: None) == "False"
