"""Bad input: a clear message, the documented exit code, and nothing created or lost."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import CREDENTIAL_ENV, CREDENTIAL_VALUE, Machine, git


def _nothing_created(machine: Machine) -> None:
    agents = machine.home / "agents"
    assert not agents.exists() or not [p for p in agents.iterdir() if p.name.startswith("agt-")]
    assert not (machine.projects / ".wb-worktrees" / "acme" / "widget" / "w1").exists()


def _dispatch(machine: Machine, *args: str, task: tuple[str, ...] = ("--task", "do it"), **kwargs: object):  # type: ignore[no-untyped-def]
    return machine.wb("agent", "dispatch", *args, *task, **kwargs)  # type: ignore[arg-type]


BASE = ("--new-worktree", "w1", "--profile", "fake", "--repo", "acme/widget")

USAGE_CASES = [
    (
        ("--new-worktree", "w1", "--use-worktree", "w1", "--profile", "fake", "--repo", "acme/widget"),
        "exactly one of --new-worktree",
    ),
    (("--profile", "fake", "--repo", "acme/widget"), "exactly one of --new-worktree"),
    (("--new-worktree", "w1", "--repo", "acme/widget"), "pass --profile"),
    (("--use-worktree", "w1", "--profile", "fake", "--branch", "x"), "--branch applies only"),
    ((*BASE, "--timeout", "0"), "--timeout must be more than 0"),
    ((*BASE, "--timeout", "169h"), "at most 168h"),
    ((*BASE, "--timeout", "soon"), 'invalid duration "soon"'),
    ((*BASE, "--base", "--orphan"), 'must not start with "-"'),
    (("--new-worktree", "../x", "--profile", "fake", "--repo", "acme/widget"), "invalid worktree name"),
    (("--new-worktree", "w1", "--profile", "fake", "--repo", "a/b/c"), "invalid repository"),
    (("--new-worktree", "w1", "--profile", "fake", "--repo", "../x"), "invalid repository"),
    (
        ("--new-worktree", "w1", "--profile", "nope", "--repo", "acme/widget"),
        'unknown profile "nope": configured profiles: fake',
    ),
    ((*BASE, "--branch", "bad..name"), 'git refuses the branch name "bad..name"'),
    ((*BASE, "--to", "-oProxyCommand=x"), "invalid machine name"),
    ((*BASE, "--to", "nowhere"), 'unknown machine "nowhere": configured machines: none'),
]


@pytest.mark.parametrize(("args", "message"), USAGE_CASES, ids=[m for _, m in USAGE_CASES])
def test_usage_errors_exit_2_and_create_nothing(machine: Machine, args: tuple[str, ...], message: str) -> None:
    machine.clone()
    done = _dispatch(machine, *args)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and done.stderr.startswith("error: ")
    assert done.stdout == "" and "Traceback" not in done.stderr
    _nothing_created(machine)


def test_task_and_task_file_together_are_refused(machine: Machine, tmp_path: Path) -> None:
    machine.clone()
    task_file = tmp_path / "t.txt"
    task_file.write_text("x")
    done = _dispatch(machine, *BASE, "--task-file", str(task_file))
    assert done.returncode == 2 and "exactly one of --task" in done.stderr


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read it"),
        (b"", "is blank"),
        (b"  \n\t", "is blank"),
        (b"ok \xff\xfe bad", "bad byte at offset 3"),
        (b"x" * (2**20 + 1), "larger than 1048576 bytes"),
    ],
    ids=["missing", "empty", "blank", "non-utf8", "oversize"],
)
def test_bad_task_files_are_usage_errors(machine: Machine, tmp_path: Path, content: bytes | None, message: str) -> None:
    machine.clone()
    task_file = tmp_path / "task.txt"
    if content is not None:
        task_file.write_bytes(content)
    done = _dispatch(machine, *BASE, task=("--task-file", str(task_file)))
    assert done.returncode == 2 and message in done.stderr, done.stderr
    _nothing_created(machine)


def test_task_file_dash_with_empty_stdin_is_refused_and_with_text_works(machine: Machine) -> None:
    machine.clone()
    done = _dispatch(machine, *BASE, task=("--task-file", "-"), input="")
    assert done.returncode == 2 and "the task from stdin is blank" in done.stderr
    done = _dispatch(machine, *BASE, task=("--task-file", "-"), input="scenario:complete\n")
    assert done.returncode == 0, done.stderr


def test_the_literal_task_dash_is_a_task(machine: Machine) -> None:
    machine.clone()
    assert _dispatch(machine, *BASE, task=("--task", "-")).returncode == 0


def test_a_missing_canonical_clone_names_the_path(machine: Machine) -> None:
    done = _dispatch(machine, *BASE)
    assert done.returncode == 1
    assert f"no canonical clone at {machine.projects / 'acme/widget'}; clone it there" in done.stderr
    _nothing_created(machine)


def test_an_unknown_base_is_a_finding(machine: Machine) -> None:
    machine.clone()
    done = _dispatch(machine, *BASE, "--base", "no-such-ref")
    assert done.returncode == 1 and '--base "no-such-ref" is not a commit' in done.stderr
    _nothing_created(machine)


def test_a_branch_that_exists_is_refused_and_nothing_is_made(machine: Machine) -> None:
    """git makes the branch before anything else and stops there (courier/runs/worktrees.py add_worktree):
    the refusal names the branch, and not even the worktrees' folder is left."""
    clone = machine.clone()
    git(clone, "branch", "taken")
    done = _dispatch(machine, *BASE, "--branch", "taken")
    assert done.returncode == 1, done.stderr
    assert f'error: branch "taken" already exists in {clone}; choose another with --branch' in done.stderr
    _nothing_created(machine)
    assert not (machine.projects / ".wb-worktrees").exists()
    assert git(clone, "worktree", "list", "--porcelain").count("worktree ") == 1


def test_repo_defaults_to_the_origin_of_the_current_checkout(machine: Machine) -> None:
    clone = machine.clone()
    done = machine.wb(
        "agent",
        "dispatch",
        "--new-worktree",
        "w1",
        "--profile",
        "fake",
        "--task",
        "scenario:complete",
        "--json",
        cwd=clone,
    )
    assert done.returncode == 0, done.stderr
    assert '"repository": "acme/widget"' in done.stdout
    outside = machine.wb(
        "agent", "dispatch", "--new-worktree", "w2", "--profile", "fake", "--task", "x", cwd=machine.root
    )
    assert outside.returncode == 2 and "pass --repo OWNER/REPO" in outside.stderr


def test_missing_credential_names_the_variable_not_a_value(machine: Machine) -> None:
    machine.clone()
    done = _dispatch(machine, *BASE, env={CREDENTIAL_ENV: ""})
    assert done.returncode == 1 and CREDENTIAL_ENV in done.stderr
    _nothing_created(machine)


def _file_provider_config(path: Path) -> str:
    return f"""\
agents:
  providers:
    mock:
      base_url: http://127.0.0.1:9/v1
      credential_file: {path}
  profiles:
    fake: {{harness: codex, provider: mock, model: gpt-5.5}}
"""


def _make_cred(kind: str, path: Path) -> None:
    path.parent.mkdir(mode=0o700, exist_ok=True)
    if kind == "symlink":
        real = path.parent / "real"
        real.write_text(CREDENTIAL_VALUE)
        real.chmod(0o600)
        path.symlink_to(real)
    elif kind == "fifo":
        os.mkfifo(path, 0o600)
    elif kind == "directory":
        path.mkdir(mode=0o700)
    else:
        odd = {"empty": "", "too-large": "x" * (64 * 1024 + 1), "too-short": " 1234567\n"}
        content = odd.get(kind, CREDENTIAL_VALUE)
        path.write_text(content)
        path.chmod(0o640 if kind == "group-readable" else 0o600)
        if kind == "wrong-owner":
            os.chown(path, 65534, 65534)


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("missing", "does not exist"),
        ("symlink", "is a symlink"),
        ("fifo", "is a FIFO"),
        ("directory", "not a regular file"),
        ("wrong-owner", "not owned by you"),
        ("group-readable", "readable or writable by group/others"),
        ("empty", "is empty"),
        ("too-large", "larger than 65536 bytes"),
        ("too-short", "holds a credential shorter than 8 bytes"),
    ],
)
def test_credential_file_refusals(machine: Machine, tmp_path: Path, kind: str, message: str) -> None:
    machine.clone()
    cred = tmp_path / "creds" / "key"
    if kind != "missing":
        _make_cred(kind, cred)
    else:
        cred.parent.mkdir(mode=0o700)
    machine.write_config(_file_provider_config(cred))
    done = _dispatch(machine, *BASE)
    assert done.returncode == 1, done.stderr
    assert message in done.stderr and CREDENTIAL_VALUE not in done.stderr
    assert f"credential_file {cred}" in done.stderr  # the source is named
    _nothing_created(machine)


def test_a_good_credential_file_reaches_the_worker_under_its_own_name(machine: Machine, tmp_path: Path) -> None:
    machine.clone()
    cred = tmp_path / "creds" / "key"
    _make_cred("good", cred)
    machine.write_config(_file_provider_config(cred))
    ref = machine.dispatch(task="scenario:env-dump")
    done = machine.wb("agent", "await", ref, "--json")
    assert done.returncode == 0 and '"state": "completed"' in done.stdout, done.stdout


def test_a_world_writable_wb_home_is_refused(machine: Machine) -> None:
    machine.clone()
    machine.home.mkdir(mode=0o700)
    machine.home.chmod(0o777)
    done = _dispatch(machine, *BASE)
    assert done.returncode == 2 and "writable by group or others" in done.stderr
    assert not (machine.home / "agents").exists()


PROFILE_M = "  profiles: {fake: {harness: codex, provider: mock, model: m}}\n"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            "agents:\n  profiles:\n    fake: {harness: codex, provider: mock, model: a}\n"
            "    fake: {harness: codex, provider: mock, model: b}\n",
            "duplicate key",
        ),
        ("agents: [1, 2]\n", "must be a mapping"),
        (
            "agents:\n  profiles: {fake: {harness: codex, provider: deepseek, model: sk-live123}}\n",
            "non-secret identifier",
        ),
        (
            "agents:\n  providers: {deepseek: {wire_api: chat}}\n"
            "  profiles: {fake: {harness: codex, provider: deepseek, model: m}}\n",
            "wire_api",
        ),
        (
            "agents:\n  providers: {mock: {base_url: 'http://example.com/v1', credential_env: K}}\n" + PROFILE_M,
            "base_url must be https://",
        ),
        (
            "agents:\n  profiles: {fake: {harness: cursor, provider: deepseek, model: m}}\n",
            'unsupported harness "cursor"',
        ),
        ("agents:\n  profiles: {fake: {harness: codex, provider: ghost, model: m}}\n", 'unknown provider "ghost"'),
        (
            "agents:\n  providers: {mock: {base_url: 'https://x', credential_env: WB_KEY}}\n" + PROFILE_M,
            "credential_env must not",
        ),
    ],
)
def test_config_refusals_name_file_key_and_rule(machine: Machine, config: str, message: str) -> None:
    machine.clone()
    machine.write_config(config)
    done = _dispatch(machine, *BASE)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"error: {machine.config_path}: "), done.stderr  # the file, then the key
    _nothing_created(machine)


def test_a_group_writable_config_file_is_refused(machine: Machine) -> None:
    machine.config_path.chmod(0o664)
    done = machine.wb("agent", "list")
    assert done.returncode == 2 and "writable by group or others" in done.stderr


def test_a_provider_named_openai_works_namespaced_for_codex(machine: Machine) -> None:
    machine.clone()
    machine.write_config(
        f"agents:\n  providers:\n    openai: {{base_url: 'http://127.0.0.1:9/v1', credential_env: {CREDENTIAL_ENV}}}\n"
        "  profiles:\n    fake: {harness: codex, provider: openai, model: gpt-5.5}\n"
    )
    ref = machine.dispatch()
    done = machine.wb("agent", "await", ref, "--json")
    assert done.returncode == 0 and '"state": "completed"' in done.stdout and '"provider": "openai"' in done.stdout


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("status", "agt-" + "0" * 32), 1, "unknown agent run agt-00000000000000000000000000000000"),
        (("status", "agt-XYZ"), 2, 'invalid agent run ID "agt-XYZ"'),
        (("await", "agt-" + "0" * 32, "--wait-timeout", "-1s"), 2, "must not be negative"),
        (("logs", "agt-" + "0" * 32, "--tail", "0"), 2, "--tail must be at least 1"),
        (("stop", "agt-" + "0" * 32), 1, "unknown agent run"),
        (("status", "m1:agt-" + "0" * 32, "--to", "m2"), 2, "disagree"),
        (("list", "--to", "m1", "--all"), 2, "either --to MACHINE or --all"),
        (("dispatch", "--bogus"), 2, "No such option"),
    ],
)
def test_bad_references_and_flags(machine: Machine, args: tuple[str, ...], code: int, message: str) -> None:
    done = machine.wb("agent", *args)
    assert done.returncode == code, done.stderr
    assert message in done.stderr and done.stdout == "" and "Traceback" not in done.stderr


def test_use_worktree_that_does_not_exist_or_is_ambiguous(machine: Machine) -> None:
    machine.clone()
    done = machine.wb("agent", "dispatch", "--use-worktree", "ghost", "--profile", "fake", "--task", "x")
    assert done.returncode == 1 and 'no registered worktree "ghost"' in done.stderr
    machine.clone("acme/other")
    for repo in ("acme/widget", "acme/other"):
        assert (
            machine.wb(
                "agent",
                "dispatch",
                "--new-worktree",
                "shared",
                "--profile",
                "fake",
                "--repo",
                repo,
                "--task",
                "scenario:complete",
            ).returncode
            == 0
        )
    done = machine.wb("agent", "dispatch", "--use-worktree", "shared", "--profile", "fake", "--task", "x")
    assert done.returncode == 1 and "several clones (acme/other, acme/widget)" in done.stderr


def test_a_wb_config_naming_a_missing_file_is_refused_naming_it(machine: Machine) -> None:
    missing = machine.root / "config" / "typo.yaml"
    done = machine.wb("agent", "list", env={"WB_CONFIG": str(missing)})
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == f"error: WB_CONFIG names {missing}, which does not exist; create it or unset WB_CONFIG\n"


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("agents:\n  profiles:\n    fake: [1\n  x: 2\n", "line 4, column 4: expected ',' or ']', but got ':'"),
        ("agents: {}\nagents: {}\n", "line 2, column 1: duplicate key 'agents'"),
        ("agents:\n\t- x\n", "line 2, column 1: found character '\\t' that cannot start any token"),
    ],
)
def test_invalid_yaml_is_one_error_line_naming_file_line_and_column(machine: Machine, text: str, where: str) -> None:
    machine.write_config(text)
    done = machine.wb("agent", "list")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"error: {machine.config_path}: invalid YAML at {where}"), done.stderr


@pytest.mark.parametrize("command", [(), ("agent",), ("agent", "list"), ("agent", "status"), ("machines",)])
def test_help_shows_flags_as_flags(machine: Machine, command: tuple[str, ...]) -> None:
    done = machine.wb(*command, "--help")
    assert done.returncode == 0, done.stderr
    assert "<bool>" not in done.stdout, done.stdout
    flags = [line.split()[0] for line in done.stdout.splitlines() if line.strip().startswith("--")]
    assert "--help" in flags
    for line in done.stdout.splitlines():
        words = line.split()
        if words[:1] in (["--json"], ["--version"], ["--help"], ["--all"]):
            assert not words[1].startswith(("<", "[", "{")), line  # the description follows at once
