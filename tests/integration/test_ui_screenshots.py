"""The screenshots of docs/ui.md (docs/ui/fleet.png, docs/ui/run.png), taken from a realistic fleet in the real browser.

The fleet: this machine, two exec machines (`gpu-box`, `build-1`, each a wb home of its own
behind `env WB_HOME=… wb`, as `docker exec -i` would reach a container) and `old-laptop`, a
machine that does not answer (its exec command fails as ssh does when the host is down). Runs
in several states: completed, failed, stopped on request, running. No test markup anywhere.
With WB_UI_SCREENSHOTS=DIR the PNGs go to DIR (`WB_UI_SCREENSHOTS=docs/ui` retakes the docs'
ones); without it, to a temporary directory, so the suite checks the pictures can be taken.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import FAKES, REMOTE_CONFIG, Machine, _kill_leftovers, make_clone, make_machine, wait_for
from ui_support import UiServer, shared_browser, wait_until

WB = str(Path(sys.executable).parent / "wb")
# What OpenSSH prints when a host is off the network: the page shows a machine's error as wb reports it.
UNREACHABLE = "#!/bin/sh\necho 'ssh: connect to host old-laptop.lan port 22: No route to host' >&2\nexit 255\n"
PROFILES = {
    "codex-high": {"harness": "codex", "provider": "mock", "model": "gpt-5.5", "reasoning": "high"},
    "codex-fast": {"harness": "codex", "provider": "mock", "model": "gpt-5.5-mini"},
}

pytestmark = pytest.mark.courier_independent(
    because="`wb ui` always runs cold; the wb commands setting up its runs are checked in both passes elsewhere"
)


def _exec_machine(root: Path, name: str) -> tuple[Machine, dict[str, Any]]:
    """A machine with a home of its own and the acme/widget clone; its exec target."""
    machine = make_machine(root / name)
    make_clone(machine.projects / "acme" / "widget")
    credential = machine.root / "credential"
    credential.write_text(f"sk-test-{name}-credential")
    credential.chmod(0o600)
    config = yaml.safe_load(REMOTE_CONFIG.format(credential=credential))
    config["agents"]["profiles"].update(PROFILES)
    machine.write_config(yaml.safe_dump(config))
    argv = [
        "env", f"WB_HOME={machine.home}", f"WB_CONFIG={machine.config_path}", f"WB_PROJECTS_ROOT={machine.projects}",
        f"PATH={FAKES}:{Path(sys.executable).parent}:/usr/bin:/bin",
        f"PYTHONPATH={Path(__file__).resolve().parents[2]}",
    ]  # fmt: skip
    return machine, {"exec": {"argv": argv, "wb_path": WB}}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Machine]:
    root = tmp_path_factory.mktemp("ui-shots")
    caller = make_machine(root / "caller")
    caller.clone()
    targets: dict[str, Any] = {}
    for name in ("gpu-box", "build-1"):
        _, targets[name] = _exec_machine(root, name)
    # `ssh old-laptop.lan` through an `ssh` of the test's own on the page server's PATH (_with_ssh).
    (root / "bin").mkdir()
    (root / "bin" / "ssh").write_text(UNREACHABLE)
    (root / "bin" / "ssh").chmod(0o755)
    targets["old-laptop"] = {"exec": {"argv": ["ssh", "-T", "old-laptop.lan"]}}
    config = yaml.safe_load(caller.config_path.read_text())
    config["agents"]["profiles"].update(PROFILES)
    config["session_move"] = {"targets": targets}
    caller.write_config(yaml.safe_dump(config))
    yield caller
    _kill_leftovers(root)


def _dispatch(caller: Machine, profile: str, worktree: str, task: str, *to: str) -> str:
    done = caller.wb(
        "agent", "dispatch", *to, "--new-worktree", worktree, "--profile", profile, "--repo", "acme/widget",
        "--task", task,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.split()[0]


def _status(caller: Machine, ref: str) -> dict[str, Any]:
    return dict(json.loads(caller.wb("agent", "status", ref, "--json").stdout))


def _await(caller: Machine, ref: str) -> None:
    assert caller.wb("agent", "await", ref, "--wait-timeout", "60s").returncode in (0, 1)


def _full_page(driver: Any, path: Path, width: int = 1280) -> None:
    """The whole page, however long, at `width` pixels."""
    metrics = {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False}
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    height = min(int(driver.execute_script("return document.documentElement.scrollHeight")), 2400)
    metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    try:
        driver.save_screenshot(str(path))
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_screenshots_of_both_pages_from_a_realistic_fleet(fleet: Machine, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    caller = fleet
    # The run the run page shows: finished on gpu-box, then continued in the same worktree.
    shown = _dispatch(caller, "codex-high", "notes", "scenario:complete file:NOTES.md "
                      "message:Added NOTES.md with the release checklist.", "--to", "gpu-box")  # fmt: skip
    _await(caller, shown)
    worktree = Path(_status(caller, shown)["worktree_dir"])
    # A reviewer's edit in the run's worktree, so the diff also shows a modified file (removed and added lines).
    (worktree / "README.md").write_text("# Widget\n\nA small widget library.\nSee NOTES.md before a release.\n")
    finished = [
        _dispatch(caller, "codex-fast", "lint-fix", "scenario:complete file:lint.cfg", "--to", "build-1"),
        _dispatch(caller, "codex-high", "api-docs", "scenario:complete file:API.md message:Documented the API."),
        _dispatch(caller, "codex-fast", "flaky-test", "scenario:fail"),
    ]
    stopped = _dispatch(caller, "codex-high", "refactor", "scenario:hang")
    running = [
        _dispatch(caller, "codex-high", "perf", "scenario:hang", "--to", "gpu-box"),
        _dispatch(caller, "codex-fast", "deps", "scenario:hang", "--to", "build-1"),
        _dispatch(caller, "codex-high", "search", "scenario:hang"),
    ]
    for ref in finished:
        _await(caller, ref)
    assert wait_for(lambda: _status(caller, stopped)["state"] == "running", 60)
    assert caller.wb("agent", "stop", stopped).returncode == 0
    assert wait_for(lambda: _status(caller, stopped)["terminal"], 60)

    into = Path(os.environ.get("WB_UI_SCREENSHOTS") or tmp_path)
    into.mkdir(parents=True, exist_ok=True)
    ssh_on_path = {**caller.env, "PATH": f"{caller.root.parent / 'bin'}:{caller.env['PATH']}"}
    ui = UiServer.start(Machine(caller.root, ssh_on_path), "--all")
    driver = shared_browser()
    try:
        driver.get(ui.url)
        rows = "#runs tr[data-ref]"
        assert wait_until(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, rows)) == 8), driver.page_source
        assert wait_until(driver, lambda d: all(
            d.find_element(By.CSS_SELECTOR, f'#runs tr[data-ref="{ref}"]').get_attribute("data-state") == "running"
            for ref in running))  # fmt: skip
        assert "No route to host" in driver.find_element(By.CSS_SELECTOR, "#machines tr[data-machine=old-laptop]").text
        states = {row.get_attribute("data-state") for row in driver.find_elements(By.CSS_SELECTOR, rows)}
        assert {"completed", "failed", "running"} <= states, states
        _full_page(driver, into / "fleet.png")
        _full_page(driver, into / "fleet-400px.png", width=400)  # a narrow window: the table scrolls in its box

        driver.get(ui.home + f"/run/{shown}")
        assert wait_until(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#diff section.file")) == 2)
        assert wait_until(driver, lambda d: f"{shown} completed" in d.find_element(By.ID, "actions").text)
        assert wait_until(driver, lambda d: d.find_element(By.ID, "review").is_displayed())
        driver.find_element(By.CSS_SELECTOR, "#diff .line.add").click()  # a comment on a line of the diff
        driver.find_element(By.CSS_SELECTOR, "#diff .comment-box textarea").send_keys("Link the checklist here.")
        _full_page(driver, into / "run.png")
        driver.get("about:blank")
    finally:
        assert ui.finish() == 130
        for ref in running:
            caller.wb("agent", "stop", ref)
