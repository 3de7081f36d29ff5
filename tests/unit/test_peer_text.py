"""A peer's words masked for every configured credential (courier/call/peer_text.py, docs/cli.md#credentials)."""

from __future__ import annotations

from pathlib import Path

from tests_support import sample_record

from courier.call.peer_text import configured_secrets, mask_response, redact_peer_text
from courier.config import Config, Problem, Provider
from protocol.models import ListWarning, RemoteResponse, Result

ENV_KEY = "sk-env-0123456789abcdef"
FILE_KEY = "sk-file-fedcba9876543210"


def _config(tmp_path: Path, **providers: Provider | Problem) -> Config:
    return Config(path=tmp_path / "wb.yaml", home=tmp_path, projects_root=tmp_path, providers=dict(providers))


def test_every_providers_credential_that_can_be_read_is_masked(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(FILE_KEY + "\n")
    config = _config(
        tmp_path,
        env=Provider(base_url="https://example.com/v1", credential_env="ENV_PROVIDER_KEY"),
        file=Provider(base_url="https://example.com/v1", credential_file=str(key_file)),
        short=Provider(base_url="https://example.com/v1", credential_env="SHORT_PROVIDER_KEY"),
        unset=Provider(base_url="https://example.com/v1", credential_env="UNSET_PROVIDER_KEY"),
        gone=Provider(base_url="https://example.com/v1", credential_file=str(tmp_path / "missing")),
        broken=Problem("a provider entry that did not validate"),
    )
    environ = {"ENV_PROVIDER_KEY": f"  {ENV_KEY}\n", "SHORT_PROVIDER_KEY": "short"}
    secrets = configured_secrets(config, environ)
    assert sorted(secrets) == sorted([ENV_KEY, FILE_KEY])  # a value under 8 bytes is no credential
    escaped = "".join(f"\\u{ord(char):04x}" for char in FILE_KEY)
    text = f"env {ENV_KEY} json {escaped} short and clipped …{FILE_KEY[6:]}"
    assert redact_peer_text(text, secrets) == "env [redacted] json [redacted] short and clipped …[redacted]"
    assert redact_peer_text(text, ()) == text


def test_a_replys_failures_warnings_and_diagnostics_are_masked() -> None:
    result = Result.model_validate(
        sample_record(state="failed", failure=f"worker said {ENV_KEY}", harness_diagnostics=[f"x {ENV_KEY}"]).to_wire()
    )
    response = RemoteResponse.model_validate(
        {"schema_version": 1, "operation": "list", "failure": None, "warnings": [], "results": []}
    )
    response.set_results([result])
    response.warnings = [ListWarning(agent_id=result.agent_id, error=f"unreadable: {ENV_KEY}")]
    mask_response(response, (ENV_KEY,))
    assert response.results_of()[0].failure == "worker said [redacted]"
    assert response.results_of()[0].harness_diagnostics == ["x [redacted]"]
    assert response.warnings[0].error == "unreadable: [redacted]"
