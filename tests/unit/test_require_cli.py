"""require_cli: an e2e tier without its real CLI skips saying why, but fails under CI (CI=true)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import FAKES, require_cli


def _cli(bin_dir: Path, name: str, prints: str) -> Path:
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\necho '{prints}'\n")
    path.chmod(0o755)
    return path


def test_a_missing_cli_skips_naming_it_and_the_install_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception) as skipped:
        require_cli("wb-test-harness", "1.2.3", install="run `bash scripts/install-it.sh`")
    expected = "the real wb-test-harness CLI (1.2.3) is not installed: run `bash scripts/install-it.sh`"
    assert str(skipped.value) == expected


@pytest.mark.parametrize("ci", ["true", "1", "yes"])
def test_a_missing_cli_fails_under_ci(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ci: str) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception, match=r"wb-test-harness CLI \(1\.2\.3\) is not installed.*CI is set"):
        require_cli("wb-test-harness", "1.2.3")


def test_the_right_version_is_found_and_a_wrong_one_is_not(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    right = _cli(tmp_path / "right", "wb-test-harness", "wb-test-harness-cli 1.2.3")
    _cli(tmp_path / "wrong", "wb-test-harness", "1.2.30 (Wb Test)")
    monkeypatch.setenv("PATH", str(right.parent))
    assert require_cli("wb-test-harness", "1.2.3").executable == str(right)
    monkeypatch.setenv("PATH", str(tmp_path / "wrong"))
    wrong = r"reports '1\.2\.30 \(Wb Test\)', expected wb-test-harness 1\.2\.3"
    with pytest.raises(pytest.skip.Exception, match=wrong):
        require_cli("wb-test-harness", "1.2.3")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"expected wb-test-harness 1\.2\.3"):
        require_cli("wb-test-harness", "1.2.3")


def test_the_fake_codex_never_stands_in_for_the_real_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(FAKES))
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match="the real codex CLI"):
        require_cli("codex", "0.169.0")
