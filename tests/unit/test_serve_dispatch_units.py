"""`courier.dispatch_over_serve` (docs/courier.md, "Environment"): the setting, and a serve session's refusal of
a run whose harness its environment lacks."""

from __future__ import annotations

from pathlib import Path

import pytest

from courier.config_file import Settings, read_settings
from courier.errors import NeedsNewLogin, UsageError
from courier.runs.admission import require_on_path


def _settings(tmp_path: Path, text: str) -> Settings:
    path = tmp_path / "wb.yaml"
    path.write_text(text)
    path.chmod(0o600)
    return read_settings(path)


def test_the_setting_is_off_unless_said_and_must_be_true_or_false(tmp_path: Path) -> None:
    assert _settings(tmp_path, "courier: {idle: 1m}\n").courier_dispatch_over_serve is False
    assert _settings(tmp_path, "courier: {dispatch_over_serve: true}\n").courier_dispatch_over_serve is True
    with pytest.raises(UsageError, match=r"courier\.dispatch_over_serve: must be true or false"):
        _settings(tmp_path, "courier: {dispatch_over_serve: yes please}\n")


def test_a_serve_session_refuses_a_harness_its_path_lacks_and_a_new_login_is_not_checked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no codex here
    with pytest.raises(NeedsNewLogin, match="codex is not on this session's PATH") as refused:
        require_on_path("codex", fresh_login=False)
    assert refused.value.failure_kind == "new_login"
    require_on_path("codex", fresh_login=True)  # a new login's environment is the one to trust
    require_on_path("command", fresh_login=False)  # it names its own program
