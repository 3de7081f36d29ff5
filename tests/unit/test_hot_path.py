"""The typer-free path of `wb agent list`, `status`, `dispatch` and `diff` (courier/hot.py) says exactly what typer's
says.

Each argv runs through `cli.run` (the hot path first, as `wb` runs it) and through
`cli.run_typer` (typer alone); stdout, stderr and the exit code must be the same. Good input
must be taken by the hot path; every kind of input it does not parse must reach typer.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from courier import cli, hot
from courier.runs.store import Store
from tests.tests_support import sample_record

DONE = "agt-" + "1" * 32
RUNNING = "agt-" + "2" * 32
UNKNOWN = "agt-" + "f" * 32
CONFIG = """\
session_move:
  targets:
    m1:
      host: 127.0.0.9
      user: nobody
      port: 9
"""


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("WB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    config = tmp_path / "wb.yaml"
    config.write_text(CONFIG)
    config.chmod(0o600)
    monkeypatch.setenv("WB_CONFIG", str(config))
    monkeypatch.setattr(cli, "_prepared", None)
    store = Store(tmp_path / "home").ensure()
    moment = "2026-11-30T10:00:00.000Z"
    done = sample_record(agent_id=DONE, state="completed", started_at=moment, finished_at=moment, exit_code=0)
    store.create(done, "the task")
    store.create(sample_record(agent_id=RUNNING, state="running", started_at=moment, worktree="w2"), "the task")
    return tmp_path


def _timings_masked(text: str) -> str:
    return re.sub(r'"elapsed_ms": \d+', '"elapsed_ms": N', text)  # a fleet row's own time differs per call


def _both(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.run(list(argv))
    hot_out, hot_err = map(_timings_masked, capsys.readouterr())
    typer_code = cli.run_typer(list(argv))
    typer_out, typer_err = map(_timings_masked, capsys.readouterr())
    assert (code, hot_out, hot_err) == (typer_code, typer_out, typer_err), argv
    return code, hot_out, hot_err


TAKEN = [
    # good input
    ["agent", "list"],
    ["agent", "list", "--json"],
    ["agent", "list", "--format", "json"],
    ["agent", "list", "--format=text"],
    ["agent", "list", "--stalled", "--json"],
    ["agent", "list", "--all", "--json", "--machine-timeout", "5s"],
    ["agent", "list", "--machine-timeout=2m"],
    ["agent", "status", DONE],
    ["agent", "status", DONE, "--json"],
    ["agent", "status", "--format", "json", RUNNING],
    ["agent", "status", "--machine-timeout", "10s", DONE],
    # well-formed argv, refused by the command itself (same error lines and exit codes)
    ["agent", "status", UNKNOWN],
    ["agent", "status", "agt-nope"],
    ["agent", "status", "m1:" + DONE, "--to", "m2"],
    ["agent", "status", DONE, "--to", "nosuch"],
    ["agent", "status", DONE, "--machine-timeout", "0s"],
    ["agent", "status", DONE, "--machine-timeout", "soon"],
    ["agent", "list", "--to", "nosuch"],
    ["agent", "list", "--to", "m1", "--all"],
    ["agent", "list", "--to", "Bad/Name"],
    # dispatch, refused before anything starts (a run would start twice: once per path)
    ["agent", "dispatch"],
    ["agent", "dispatch", "--new-worktree", "w", "--use-worktree", "v", "--profile", "p", "--task", "t"],
    ["agent", "dispatch", "--new-worktree", "w", "--profile", "nosuch", "--task", "t", "--repo", "acme/widget"],
    ["agent", "dispatch", "--new-worktree", "w", "--profile", "p", "--task", "t", "--max-tokens", "0"],
    ["agent", "dispatch", "--new-worktree", "w", "--profile", "p", "--task", "t", "--wait", "--follow"],
    ["agent", "dispatch", "--new-worktree", "w", "--profile", "p", "--task", "t", "--follow", "--json"],
    ["agent", "dispatch", "--new-worktree", "w", "--profile", "p", "--task", "t", "--wait-for-slot", "1m"],
    ["agent", "dispatch", "--new-worktree", "w", "--profile", "p", "--task", "t", "--timeout", "0s"],
    ["agent", "dispatch", "--new-worktree", "w", "--profile", "p", "--task", "t", "--to", "nosuch"],
    # diff: a record whose worktree is gone, an unknown run, a bad reference, a machine that is not configured
    ["agent", "diff", DONE],
    ["agent", "diff", DONE, "--stat"],
    ["agent", "diff", "--json", DONE],
    ["agent", "diff", "--format=json", "--stat", DONE],
    ["agent", "diff", UNKNOWN],
    ["agent", "diff", "agt-nope"],
    ["agent", "diff", DONE, "--to", "nosuch"],
    ["agent", "diff", "m1:" + DONE, "--to", "m2"],
]

HANDED_TO_TYPER = [
    ["agent", "list", "--help"],
    ["agent", "status", "--help"],
    ["agent", "status"],  # a missing argument
    ["agent", "status", DONE, RUNNING],  # an extra argument
    ["agent", "list", DONE],
    ["agent", "list", "--bogus"],  # an unknown option
    ["agent", "list", "--jso"],  # a prefix is not an option (typer suggests)
    ["agent", "list", "--to"],  # a missing value
    ["agent", "list", "--format", "xml"],  # a bad choice
    ["agent", "list", "--format", "JSON"],
    ["agent", "list", "--json=yes"],  # a flag given a value
    ["agent", "list", "--json", "--json"],  # repeated
    ["agent", "list", "--to", "m1", "--to", "m1"],
    ["agent", "list", "--to", "--json"],  # a value that looks like an option
    ["agent", "list", "--to="],
    ["agent", "list", "--machine-timeout", "-"],
    ["agent", "list", "--"],
    ["agent", "status", "--", DONE],
    ["agent", "status", "-"],
    ["agent", "status", DONE, "--all"],  # list's flag on status
    ["agent", "status", DONE, "--stalled"],
    ["agent", "dispatch", "--help"],
    ["agent", "dispatch", "extra"],
    ["agent", "dispatch", "--max-tokens", "lots"],
    ["agent", "dispatch", "--max-cost-usd", "cheap"],
    ["agent", "dispatch", "--wait=yes"],
    ["agent", "dispatch", "--task", "-x"],
    ["agent", "dispatch", "--new-worktree", "w", "--profile", "p", "--task", "t", "--max-cost-usd=-1"],
    ["agent", "dispatch", "--profile", "p", "--profile", "p"],
    ["agent", "diff", "--help"],
    ["agent", "diff"],
    ["agent", "diff", DONE, "--stat=yes"],
    ["agent", "diff", DONE, "--all"],
    ["agent", "diff", DONE, "--machine-timeout", "5s"],  # not one of diff's options
    ["agent", "lis"],
    ["agent"],
    ["--version"],
]


@pytest.mark.parametrize("argv", TAKEN, ids=" ".join)
def test_the_hot_path_takes_its_commands_and_answers_as_typer_does(
    argv: list[str], home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert hot.parse(argv) is not None
    _both(argv, capsys)


@pytest.mark.parametrize("argv", HANDED_TO_TYPER, ids=" ".join)
def test_what_the_hot_path_does_not_parse_reaches_typer(
    argv: list[str], home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert hot.parse(argv) is None
    assert hot.run(argv) is None
    _both(argv, capsys)


def test_the_outputs_compared_are_the_commands_real_ones(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A guard on the comparison itself: it compares listings, refusals and exit codes, not two empty strings."""
    code, out, err = _both(["agent", "list"], capsys)
    assert code == 0 and RUNNING in out and DONE in out and err == ""
    code, out, err = _both(["agent", "status", UNKNOWN], capsys)
    assert code == 1 and out == "" and err.startswith("error: ") and UNKNOWN in err
    code, out, err = _both(["agent", "list", "--to", "nosuch"], capsys)
    assert code == 2 and 'unknown machine "nosuch"' in err
    code, out, err = _both(["agent", "list", "--bogus"], capsys)
    assert code == 2 and "--bogus" in err
