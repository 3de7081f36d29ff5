"""wb.yaml rules (docs/config.md): every refusal names the file, the key and the rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from courier.config import Problem, Provider, Target, check_base_url, load_config
from courier.errors import UsageError


def _load(tmp_path: Path, text: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "wb.yaml"
    path.write_text(text)
    path.chmod(0o600)
    tmp_path.chmod(0o700)
    return load_config(path)


def test_a_missing_file_means_builtins_and_nothing_else(tmp_path: Path) -> None:
    config = load_config(tmp_path / "absent.yaml")
    assert set(config.providers) == {"deepseek", "openrouter", "anthropic", "gemini"}
    assert config.profiles == {} and config.targets == {}


@pytest.mark.parametrize(
    "url",
    [
        "https://api.example.com/v1",
        "http://localhost:8000/v1",
        "http://127.0.0.1/v1",
        "http://127.9.9.9:1/v1",
        "http://[::1]:8000/v1",
    ],
)
def test_allowed_base_urls(url: str) -> None:
    assert check_base_url(url) == url


@pytest.mark.parametrize(
    "url",
    [
        "http://example.com/v1",
        "http://10.0.0.1/v1",
        "https://u:p@x.com/v1",
        "https://x.com/v1?key=1",
        "https://x.com/v1#f",
        "ftp://x.com",
        "https://ünï.com",
        "https://x.com/" + "a" * 2048,
        "http://localhost.evil.com/v1",
    ],
)
def test_refused_base_urls(url: str) -> None:
    with pytest.raises(ValueError):
        check_base_url(url)


def test_one_bad_entry_leaves_the_others_usable(tmp_path: Path) -> None:
    config = _load(
        tmp_path,
        """
agents:
  providers:
    good: {base_url: 'https://x.example', credential_env: GOOD_KEY}
    Bad_Name: {base_url: 'https://x.example', credential_env: K}
    both: {base_url: 'https://x.example', credential_env: K, credential_file: /k}
  profiles:
    ok: {harness: codex, provider: good, model: gpt-5.5}
    typo: {harness: codex, provider: good, model: m, reasonin: high}
session_move:
  targets:
    box: {ssh: {host: box.lan, user: ai, port: 2222, wb_path: /home/ai/.local/bin/wb}}
    evil: {ssh: {host: 'a;b'}}
    spaced: {ssh: {host: h, wb_path: '/home/a b/wb'}}
    relative: {ssh: {host: h, wb_path: bin/wb}}
    noport: {ssh: {host: h, port: 70000}}
""",
    )
    assert isinstance(config.providers["good"], Provider)
    assert "provider names must match" in config.providers["Bad_Name"].message  # type: ignore[union-attr]
    assert "exactly one of credential_env and credential_file" in config.providers["both"].message  # type: ignore[union-attr]
    assert "agents.profiles.typo.reasonin: unknown key" in config.profiles["typo"].message  # type: ignore[union-attr]
    assert config.target("box") == Target(host="box.lan", user="ai", port=2222, wb_path="/home/ai/.local/bin/wb")
    for name, rule in (
        ("evil", "host must match"),
        ("spaced", "wb_path segments"),
        ("relative", "absolute"),
        ("noport", "between 1 and 65535"),
    ):
        entry = config.targets[name]
        assert isinstance(entry, Problem) and rule in entry.message and str(tmp_path / "wb.yaml") in entry.message
        with pytest.raises(UsageError, match=rule):
            config.target(name)


def test_builtin_provider_fields_merge_and_credential_source_is_replaced(tmp_path: Path) -> None:
    config = _load(tmp_path, "agents:\n  providers:\n    deepseek: {credential_file: /etc/wb/ds}\n")
    provider = config.provider("deepseek")
    assert provider.base_url == "https://api.deepseek.com" and provider.credential_file == "/etc/wb/ds"
    assert provider.credential_env is None


def test_home_and_projects_root_come_from_the_file_then_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WB_HOME", "/env/home")
    monkeypatch.setenv("WB_PROJECTS_ROOT", "/env/projects")
    assert load_config(tmp_path / "absent.yaml").home == Path("/env/home")
    config = _load(tmp_path, "agents:\n  home: /file/home\n")
    assert config.home == Path("/file/home") and config.projects_root == Path("/env/projects")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("session_move:\n  targets:\n    m: {ssh: {host: h, user: no}}\n", "must be a YAML string"),
        ("session_move:\n  targets:\n    m: {ssh: {host: h, port: '22'}}\n", "must be a whole number"),
    ],
)
def test_yaml_coercions_are_refused(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        _load(tmp_path, text).target("m")


def test_unknown_machine_lists_the_configured_ones_sorted(tmp_path: Path) -> None:
    config = _load(tmp_path, "session_move:\n  targets:\n    zeta: {ssh: {host: z}}\n    alpha: {ssh: {host: a}}\n")
    with pytest.raises(UsageError, match='unknown machine "nope": configured machines: alpha, zeta'):
        config.target("nope")


def test_unknown_top_level_sections_are_ignored(tmp_path: Path) -> None:
    assert _load(tmp_path, "editor: vim\nagents: {}\n").profiles == {}


@pytest.mark.parametrize("host", ["-oProxyCommand=x", "a b", "a;b", "$(x)", "`x`", "a\nb", ""])
def test_hosts_a_shell_or_ssh_could_reinterpret_are_refused_before_any_connection(tmp_path: Path, host: str) -> None:
    config = _load(tmp_path, "session_move:\n  targets:\n    m:\n      ssh:\n        host: " + json.dumps(host) + "\n")
    with pytest.raises(UsageError, match="host must match"):
        config.target("m")


def test_a_target_without_an_ssh_block_is_not_a_machine(tmp_path: Path) -> None:
    """docs/cli.md#machine-selection: it may serve another transport of WB's; --to naming it is the unknown-machine
    error."""
    text = "session_move:\n  targets:\n    box: {ssh: {host: b}}\n    docker-1: {docker: {image: x}}\n    bare:\n"
    config = _load(tmp_path, text)
    assert set(config.targets) == {"box"}
    with pytest.raises(UsageError, match='unknown machine "docker-1": configured machines: box '):
        config.target("docker-1")
    with pytest.raises(UsageError, match='unknown machine "bare": configured machines: box '):
        config.target("bare")
    broken = _load(tmp_path, "session_move:\n  targets:\n    half: {ssh: 'host'}\n").targets["half"]
    assert isinstance(broken, Problem) and "session_move.targets.half.ssh: must be a mapping" in broken.message


def test_slots_and_labels_are_read_on_the_target_beside_its_block(tmp_path: Path) -> None:
    """docs/config.md#targets: `session_move.targets.NAME.slots`, not inside `ssh`/`exec`."""
    text = (
        "session_move:\n  targets:\n"
        "    b1: {slots: 1, labels: [gpu, big], ssh: {host: b1}}\n"
        "    e1: {slots: 3, exec: {argv: [env]}}\n"
        "    open: {ssh: {host: o}}\n"
    )
    config = _load(tmp_path, text)
    b1, e1, open_ = config.target("b1"), config.target("e1"), config.target("open")
    assert (b1.slots, b1.labels) == (1, ["gpu", "big"])
    assert (e1.slots, e1.labels) == (3, [])
    assert (open_.slots, open_.labels) == (None, [])


@pytest.mark.parametrize("kind", ["ssh", "exec"])
def test_slots_and_labels_inside_the_channel_block_are_an_error_naming_the_right_place(
    tmp_path: Path, kind: str
) -> None:
    block = "{host: b1, slots: 1}" if kind == "ssh" else "{argv: [env], labels: [gpu]}"
    field = "slots" if kind == "ssh" else "labels"
    config = _load(tmp_path, f"session_move:\n  targets:\n    b1: {{{kind}: {block}}}\n")
    entry = config.targets["b1"]
    assert isinstance(entry, Problem)
    assert entry.message == (
        f"{tmp_path / 'wb.yaml'}: session_move.targets.b1.{kind}.{field}: {field} belongs on the target "
        f"(session_move.targets.b1.{field})"
    )
    with pytest.raises(UsageError, match=f"{field} belongs on the target"):
        config.target("b1")
