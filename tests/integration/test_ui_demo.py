"""`wb demo --ui` (docs/demo.md, docs/ui.md): the demo's run on the page, live from dispatch to completed, with its
diff, in a real headless browser; Ctrl-C then ends the demo with the run's status and removes the sandbox."""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import wait_for
from test_demo import _assert_clean, _bin_without_codex, _env, _leftovers
from ui_support import shared_browser, wait_until

pytestmark = pytest.mark.courier_independent  # `wb demo` always runs cold (courier/main.py COLD_COMMANDS)


@pytest.fixture
def driver() -> Any:
    return shared_browser()


@pytest.fixture
def base(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    for proc in _leftovers(str(tmp_path)):
        with contextlib.suppress(psutil.Error):
            proc.kill()


def test_demo_ui_shows_the_run_live_with_its_diff(base: Path, driver: Any) -> None:
    env = _env(base, str(_bin_without_codex(base)))
    demo = subprocess.Popen(
        [sys.executable, "-m", "courier.main", "demo", "--ui"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=env["HOME"],
    )
    lines: list[str] = []

    def read() -> None:
        assert demo.stdout is not None
        for line in demo.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    stayed_up = interrupted = 0.0
    try:
        assert wait_for(lambda: any(line.startswith("  page     http://127.0.0.1:") for line in lines), 60), lines
        url = next(line for line in lines if line.startswith("  page ")).split()[-1]
        driver.get(url)
        row = '#runs tr[data-ref^="demo:agt-"]'
        from selenium.webdriver.common.by import By

        assert wait_until(driver, lambda d: d.find_element(By.CSS_SELECTOR, row).get_attribute("data-state")
                          == "completed", 90), (lines, driver.page_source)  # fmt: skip
        ref = driver.find_element(By.CSS_SELECTOR, row).get_attribute("data-ref")
        assert wait_for(lambda: any("the page stays up" in line for line in lines), 60), lines
        stayed_up = time.monotonic()
        driver.find_element(By.CSS_SELECTOR, f"{row} a").click()
        assert wait_until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#diff section.file"))
        assert driver.find_element(By.CSS_SELECTOR, "#diff section.file h3").text.startswith("hello.txt")
        assert ref in driver.find_element(By.ID, "ref").text
        interrupted = time.monotonic()
        demo.send_signal(signal.SIGINT)
        assert demo.wait(60) == 0
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        reader.join(10)
        assert demo.stdout is not None and demo.stderr is not None
        demo.stdout.close()
        stderr = demo.stderr.read()
        demo.stderr.close()
    # The time printed is the real elapsed time: the minutes on the page count, and it says which part was the run's.
    (done,) = [line for line in lines if line.startswith("done in ")]
    found = re.match(r"done in ([0-9.]+)s: demo:agt-\S+ completed on demo after ([0-9.]+)s, then the page stayed up "
                     r"([0-9.]+)s; cleaning up the sandbox$", done.strip())  # fmt: skip
    assert found, (done, stderr)
    total, run, page = (float(found.group(n)) for n in (1, 2, 3))
    assert page >= interrupted - stayed_up - 0.1 and abs(total - run - page) <= 0.15, done
    _assert_clean(base, env)
