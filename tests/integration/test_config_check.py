"""`wb config check` (docs/config.md#checking-the-file) through the installed command: every problem in one
pass, one line each naming its key, exit 2; a clean file exits 0; ignored sections stay ignored elsewhere."""

from __future__ import annotations

import json

from conftest import Machine

TYPOS = """\
profiels:
  fast: {harness: codex}
agents:
  idle: 3
  profiles:
    fast: {harness: codex, provider: openai, modle: gpt-5.5}
  providers:
    openai: {base_url: "ftp://example.com"}
courier:
  idle: 0
session_move:
  targets:
    gpu: {ssh: {host: "-oProxyCommand=x"}}
"""

CLEAN = """\
agents:
  profiles:
    fast: {harness: codex, provider: openai, model: gpt-5.5}
session_move:
  targets:
    gpu: {ssh: {host: gpu.example.com}}
"""


def test_every_problem_of_the_file_is_one_line_naming_its_key_and_the_exit_is_2(machine: Machine) -> None:
    machine.write_config(TYPOS)
    before = sorted(machine.root.rglob("*"))
    done = machine.wb("config", "check")
    assert done.returncode == 2 and done.stderr == "", done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"{machine.config_path}: 6 problems"
    assert lines[1:3] == [
        "profiels: unknown section (did you mean agents.profiles?)",
        "agents.idle: unknown key (did you mean courier.idle?)",
    ]
    assert lines[3] == 'courier.idle: must be a duration string above 0, such as "10m"'
    assert lines[4].startswith("agents.providers.openai.base_url: ")
    assert lines[5] == "agents.profiles.fast.modle: unknown key"
    assert lines[6].startswith("session_move.targets.gpu.ssh.host: ")
    assert sorted(machine.root.rglob("*")) == before  # a check creates nothing

    found = machine.wb("config", "check", "--json")  # checked against docs/schema/config-check.json
    assert found.returncode == 2
    document = json.loads(found.stdout)
    assert document["ok"] is False and document["path"] == str(machine.config_path)
    assert [p["key"] for p in document["problems"]] == [
        "profiels", "agents.idle", "courier.idle", "agents.providers.openai", "agents.profiles.fast",
        "session_move.targets.gpu",
    ]  # fmt: skip
    assert [p["message"] for p in document["problems"]] == lines[1:]


def test_a_clean_file_exits_0_and_its_ignored_sections_stay_ignored_by_every_other_command(machine: Machine) -> None:
    machine.write_config(CLEAN)
    done = machine.wb("config", "check")
    assert (done.returncode, done.stdout) == (0, f"{machine.config_path}: no problems\n"), done.stderr
    assert machine.wb_json("config", "check") == {
        "path": str(machine.config_path), "exists": True, "ok": True, "problems": [],
    }  # fmt: skip

    machine.write_config(CLEAN + "sesion_move: {targets: {}}\n")
    assert machine.wb("config", "check").stdout.splitlines()[1] == (
        "sesion_move: unknown section (did you mean session_move?)"
    )
    listed = machine.wb("machines")
    assert listed.returncode == 0 and listed.stdout.splitlines()[1].split()[0] == "gpu", listed.stderr


def test_a_file_wb_cannot_read_is_its_one_problem(machine: Machine) -> None:
    machine.write_config("agents: [\n")
    done = machine.wb("config", "check")
    assert done.returncode == 2 and done.stderr == ""
    assert done.stdout.splitlines()[1].startswith("invalid YAML at line 2, column 1: ")
    machine.config_path.chmod(0o666)
    unsafe = machine.wb("config", "check")
    assert unsafe.returncode == 2 and "writable by group or others" in unsafe.stdout
    missing = machine.wb("config", "check", env={"WB_CONFIG": str(machine.root / "absent.yaml")})
    assert missing.returncode == 2 and "WB_CONFIG names" in missing.stdout
