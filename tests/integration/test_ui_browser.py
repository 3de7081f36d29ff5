"""`wb ui` (docs/ui.md) in a real headless browser: the fleet page live, a run's page with its diff, stop,
continue, escaping of everything foreign, the token gate and the same-origin check.

One module-wide fleet: this machine, `box` (an exec machine with a home of its own, reached
through the exec channel like `docker exec -i`) and `down` (an exec machine that fails, its
error holding markup). One `wb ui --all` serves every test; one browser per session.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import FAKES, REMOTE_CONFIG, Machine, _kill_leftovers, make_clone, make_machine, wait_for
from ui_support import UiServer, open_stream, shared_browser, wait_until

WB = str(Path(sys.executable).parent / "wb")
HOSTILE = "<script>window.wbInjected = 1; document.title = 'pwned'</script><b id=injected>bold</b>"
DOWN = "#!/bin/sh\necho '<img id=injected-error src=x onerror=\"window.wbInjected=2\"> box is down' >&2\nexit 3\n"

# What is checked is what `wb ui` shows and does, and `wb ui` always runs cold, never through the
# courier (courier/main.py COLD_COMMANDS); the runs it shows are set up with wb commands, whose
# courier path the CLI suites check in both passes. So one pass: the courier one.
pytestmark = pytest.mark.courier_independent(
    because="`wb ui` always runs cold; the wb commands setting up its runs are checked in both passes elsewhere"
)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Machine, Machine]]:
    root = tmp_path_factory.mktemp("ui")
    caller = make_machine(root / "caller")
    caller.clone()
    box = make_machine(root / "box")
    make_clone(box.projects / "acme" / "widget")
    credential = box.root / "credential"
    credential.write_text("sk-test-box-credential-0d4f7c1e")
    credential.chmod(0o600)
    box.write_config(REMOTE_CONFIG.format(credential=credential))
    argv = [
        "env", f"WB_HOME={box.home}", f"WB_CONFIG={box.config_path}", f"WB_PROJECTS_ROOT={box.projects}",
        f"PATH={FAKES}:{Path(sys.executable).parent}:/usr/bin:/bin",
        f"PYTHONPATH={Path(__file__).resolve().parents[2]}",
    ]  # fmt: skip
    down = root / "down"
    down.write_text(DOWN)
    down.chmod(0o755)
    config = yaml.safe_load(caller.config_path.read_text())
    config["session_move"] = {
        "targets": {"box": {"exec": {"argv": argv, "wb_path": WB}}, "down": {"exec": {"argv": [str(down)]}}}
    }
    caller.write_config(yaml.safe_dump(config))
    yield caller, box
    _kill_leftovers(root)


@pytest.fixture(scope="module")
def ui(fleet: tuple[Machine, Machine]) -> Iterator[UiServer]:
    caller, _ = fleet
    server = UiServer.start(caller, "--all")
    yield server
    assert server.finish() == 130
    assert server.token not in "".join(server.stderr)  # a credential: never logged


@pytest.fixture
def driver() -> Any:
    return shared_browser()


def signed_in(driver: Any, ui: UiServer, path: str = "/") -> None:
    """Open the printed address once (its token becomes the cookie), then `path`."""
    driver.get(ui.url)
    assert "token=" not in driver.current_url  # redirected without it
    if path != "/":
        driver.get(ui.home + path)


def dispatch(machine: Machine, task: str, worktree: str, *to: str) -> str:
    done = machine.wb(
        "agent", "dispatch", *to, "--new-worktree", worktree, "--profile", "fake", "--repo", "acme/widget",
        "--task", task,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.split()[0]


def finished(machine: Machine, task: str, worktree: str, *to: str) -> str:
    """A run dispatched and awaited to its end: its reference."""
    ref = dispatch(machine, task, worktree, *to)
    assert machine.wb("agent", "await", ref, "--wait-timeout", "60s").returncode == 0
    return ref


def release(machine: Machine, run_id: str) -> None:
    """Let a `scenario:wait-release` run complete (the fake codex waits for this file in its home)."""
    home = machine.home / "agents" / run_id / "harness-home"
    assert wait_for((home / "ready").exists, 60)
    (home / "release").write_text("go\n")


def run_ids(machine: Machine) -> set[str]:
    return {result["agent_id"] for result in json.loads(machine.wb("agent", "list", "--json").stdout)}


def row(driver: Any, ref: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, f'#runs tr[data-ref="{ref}"]')


def text_of(driver: Any, css: str) -> str:
    from selenium.webdriver.common.by import By

    return str(driver.find_element(By.CSS_SELECTOR, css).text)


def count(driver: Any, css: str) -> int:
    from selenium.webdriver.common.by import By

    return len(driver.find_elements(By.CSS_SELECTOR, css))


# -- the token gate and the same-origin check (plain HTTP: no browser needed) -----------------------


def test_without_the_token_every_path_is_403_and_the_token_leads_to_the_session_root(ui: UiServer) -> None:
    root, cookie = ui.sign_in()
    paths = [("GET", "/"), ("GET", "/fleet"), ("GET", "/events"), ("GET", "/run/agt-x"), ("GET", "/static/ui.js"),
             ("GET", "/nothing-here"), ("POST", "/run/agt-x/stop")]  # fmt: skip
    for method, path in paths:
        # Neither credential; the cookie alone (what every other port of the host receives); the root alone.
        for sends_cookie, under_root in ((False, False), (True, False), (False, True)):
            status, _, body = ui.http(method, path, cookie=sends_cookie, root=under_root, headers={"Origin": ui.base})
            assert status == 403 and body.startswith("forbidden:"), (path, sends_cookie, under_root, status, body)
            assert "agt-" not in body and "<" not in body
    status, _, _ = ui.http("GET", "/?token=not-the-token", cookie=False, root=False)
    assert status == 403
    status, headers, _ = ui.http("GET", f"/?token={ui.token}&state=running", cookie=False, root=False)
    assert status == 303 and headers["location"] == f"{root}/?state=running"
    assert root.startswith("/s/") and len(root) > 40 and ui.token not in root
    set_cookie = headers["set-cookie"]
    assert set_cookie.startswith(f"wb_ui_{ui.port}=") and ui.token not in set_cookie
    assert "HttpOnly" in set_cookie and "SameSite=Strict" in set_cookie and f"Path={root}/" in set_cookie
    assert set_cookie.split(";", 1)[0] == cookie  # one session per server
    status, headers, body = ui.http("GET", "/")
    assert status == 200 and "script-src 'self'" in headers["content-security-policy"] and "<table id=machines" in body
    assert f'href="{root}/static/ui.css"' in body and f'data-live="{root}/events"' in body  # links carry the root


def test_an_action_from_another_origin_is_refused_and_a_refusal_shows_the_clis_message(
    fleet: tuple[Machine, Machine], ui: UiServer
) -> None:
    caller, _ = fleet
    ref = dispatch(caller, "scenario:hang", "origin")
    for headers in ({"Origin": "http://evil.example"}, {"Origin": ui.base, "Sec-Fetch-Site": "cross-site"}):
        status, text = ui.post(f"/run/{ref}/stop", "confirm=yes", **headers)
        assert status == 403 and text.startswith("forbidden: an action must come from this page"), text
    status, _, text = ui.http("POST", f"/run/{ref}/stop", headers={}, body="confirm=yes")  # no Origin at all
    assert status == 403
    status, text = ui.post(f"/run/{ref}/stop", "")  # without script: one more page asks first
    assert status == 200 and "<form id=stop-confirmed" in text and 'name=confirm value=yes' in text
    assert json.loads(caller.wb("agent", "status", ref, "--json").stdout)["state"] == "running"

    cli = caller.wb("agent", "continue", ref, "--task", "more")  # a running run cannot be continued
    assert cli.returncode != 0 and cli.stderr.startswith("error: ")
    status, text = ui.post(f"/run/{ref}/continue", "task=more")
    assert status == 409, text
    import html

    assert html.escape(cli.stderr.strip().splitlines()[0], quote=True) in text
    assert caller.wb("agent", "stop", ref).returncode == 0


def _receivers(machine: Machine, server: int) -> set[int]:
    """The far side's `wb --wb-internal-agent-remote` processes of `machine` (its WB_HOME) that the `wb ui` with
    pid `server` started (an exec channel's child: `wb ui` never goes through the courier): one per pending call."""
    import psutil

    found = set()
    for process in psutil.process_iter(["cmdline"]):
        try:
            if (
                "--wb-internal-agent-remote" in (process.info["cmdline"] or [])
                and process.environ().get("WB_HOME") == str(machine.home)
                and server in (parent.pid for parent in process.parents())
            ):
                found.add(process.pid)
        except psutil.Error:
            continue
    return found


@pytest.fixture
def unwatched(fleet: tuple[Machine, Machine]) -> Iterator[UiServer]:
    """A `wb ui --all` of its own, on which no fleet page has been opened."""
    server = UiServer.start(fleet[0], "--all")
    yield server
    assert server.finish() == 130
    assert server.token not in "".join(server.stderr)


def test_a_wb_ui_nobody_looks_at_asks_no_machine_and_its_first_fleet_page_starts_the_watch(
    fleet: tuple[Machine, Machine], unwatched: UiServer
) -> None:
    _, box = fleet
    assert unwatched.http("GET", "/")[0] == 200  # the page is fetched (its rows asked of each machine) ...
    assert wait_for(lambda: _receivers(box, unwatched.process.pid) == set(), 10)  # ... and nothing waits on box
    stream = open_stream(unwatched, "/events", first=b": watching")
    try:
        assert wait_for(lambda: len(_receivers(box, unwatched.process.pid)) == 1, 30)  # the watch's call on box
    finally:
        stream.close()


def test_closing_a_run_page_ends_its_follow_here_and_on_the_far_machine_within_5s(
    fleet: tuple[Machine, Machine], unwatched: UiServer
) -> None:
    import psutil

    caller, box = fleet
    local = dispatch(caller, "scenario:silent", "silent-here")
    remote = dispatch(caller, "scenario:silent", "silent-box", "--to", "box")
    server = psutil.Process(unwatched.process.pid)
    receivers = lambda: _receivers(box, server.pid)  # noqa: E731
    assert wait_for(lambda: json.loads(caller.wb("agent", "status", remote, "--json").stdout)["state"] == "running", 60)
    threads = server.num_threads()
    assert receivers() == set()  # no fleet page has been opened on this server: no watch of its own
    for _ in range(2):  # all open at once, then closed; twice
        streams = [open_stream(unwatched, f"/run/{ref}/actions") for ref in [local, remote] * 15]
        assert wait_for(lambda: len(receivers()) >= 15, 60)  # each box follow reached the far side
        assert server.num_threads() > threads
        for stream in streams:
            stream.close()
        ended = lambda: not receivers() and server.num_threads() <= threads  # noqa: E731
        assert wait_for(ended, 5), (server.num_threads(), threads, receivers())
    for _ in range(30):  # one at a time, each closed at once
        open_stream(unwatched, f"/run/{remote}/actions").close()
        open_stream(unwatched, f"/run/{local}/actions").close()
    assert wait_for(lambda: not receivers() and server.num_threads() <= threads, 5), (
        server.num_threads(), threads)  # fmt: skip
    for ref in (local, remote):
        assert caller.wb("agent", "stop", ref).returncode == 0


# -- the browser -------------------------------------------------------------------------------------


class _Recorder:
    """Another local user's server on another port of 127.0.0.1: it records every request the browser sends it."""

    def __init__(self) -> None:
        import http.server
        import threading

        self.seen: list[tuple[str, dict[str, str]]] = []
        seen = self.seen

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen.append((self.path, {name.lower(): value for name, value in self.headers.items()}))
                body = b"<!doctype html><title>elsewhere</title><p id=elsewhere>another server</p>"
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return None

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_another_port_of_the_host_receives_nothing_that_opens_the_page(
    fleet: tuple[Machine, Machine], ui: UiServer, driver: Any
) -> None:
    caller, _ = fleet
    ref = finished(caller, "scenario:complete", "elsewhere")
    signed_in(driver, ui, f"/run/{ref}")  # signed in: the browser holds whatever wb ui gave it
    assert wait_until(driver, lambda d: count(d, "form#continue") == 1)
    other = _Recorder()
    try:
        for path in ("/", "/run/" + ref, "/s/", "/static/ui.js"):
            driver.get(f"http://127.0.0.1:{other.port}{path}")
            assert wait_until(driver, lambda d: count(d, "#elsewhere") == 1)
    finally:
        other.close()
    assert len(other.seen) >= 4
    runs_before = run_ids(caller)
    for path, headers in other.seen:
        assert f"wb_ui_{ui.port}" not in headers.get("cookie", ""), (path, headers)
        sent = {"Cookie": headers["cookie"]} if "cookie" in headers else {}
        # Whatever it received, replayed against wb ui (with the page's own Origin): no data, no action.
        for method, where, body in (("GET", "/", ""), ("GET", "/fleet", ""), ("GET", f"/run/{ref}", ""),
                                    ("POST", f"/run/{ref}/continue", "task=scenario:complete")):  # fmt: skip
            status, _, text = ui.http(method, where, cookie=False, root=False, headers={**sent, "Origin": ui.base},
                                      body=body)  # fmt: skip
            assert status == 403 and ref not in text, (method, where, status, text)
    assert run_ids(caller) == runs_before  # no run was started
    # The page's own credential, as the browser holds it, is the session root of its links plus the cookie.
    driver.get(ui.home + f"/run/{ref}")
    assert wait_until(driver, lambda d: count(d, "form#continue") == 1)


def test_the_fleet_page_shows_a_dispatched_run_and_then_its_state_change_without_a_reload(
    fleet: tuple[Machine, Machine], ui: UiServer, driver: Any
) -> None:
    caller, _ = fleet
    signed_in(driver, ui)
    assert wait_until(driver, lambda d: count(d, "#machines tr.error[data-machine=down]") == 1)
    assert "box is down" in text_of(driver, "#machines tr[data-machine=down]")
    assert count(driver, "#machines tr.ok[data-machine=box]") == 1
    driver.execute_script("window.wbSamePage = 'yes'")  # gone if the page were reloaded
    ref = dispatch(caller, "scenario:wait-release", "live")
    assert wait_until(driver, lambda d: row(d, ref).get_attribute("data-state") == "running"), driver.page_source
    assert "fake" in row(driver, ref).text and "codex" in row(driver, ref).text
    release(caller, ref)
    assert wait_until(driver, lambda d: row(d, ref).get_attribute("data-state") == "completed"), driver.page_source
    assert driver.execute_script("return window.wbSamePage") == "yes"

    driver.get(ui.home + "/?state=completed")  # the filters: by state, by machine
    assert count(driver, f'#runs tr[data-ref="{ref}"]') == 1
    driver.get(ui.home + "/?machine=box")
    assert count(driver, f'#runs tr[data-ref="{ref}"]') == 0


def test_the_run_page_of_a_finished_remote_run_shows_its_diff_per_file_and_hunk(
    fleet: tuple[Machine, Machine], ui: UiServer, driver: Any
) -> None:
    caller, _ = fleet
    ref = dispatch(caller, "scenario:complete file:greeting.txt", "diffed", "--to", "box")
    assert ref.startswith("box:agt-")
    assert caller.wb("agent", "await", ref, "--wait-timeout", "60s").returncode == 0
    signed_in(driver, ui, f"/run/{ref}")
    assert wait_until(driver, lambda d: count(d, "#diff section.file") == 1), driver.page_source
    assert "greeting.txt" in text_of(driver, "#files") and "+1" in text_of(driver, "#files")
    assert text_of(driver, "#diff section.file h3").startswith("greeting.txt")
    assert text_of(driver, "#diff .line.add") == "+Hello from the fake codex."
    assert text_of(driver, "#diff .hunk-header").startswith("@@ -0,0 +1 @@")
    assert "completed" in text_of(driver, "#status")
    assert wait_until(driver, lambda d: "ls" in text_of(d, "#actions"))  # the worker actions
    # Each worker action with the time its line reached wb on box (events.times), not the page's clock.
    times = driver.execute_script("return [...document.querySelectorAll('#actions time')].map(t => t.dateTime)")
    assert times and all(times), times
    record = json.loads(caller.wb("agent", "status", ref, "--json").stdout)
    assert all(record["started_at"] <= at <= record["finished_at"] for at in times), (times, record)
    assert count(driver, "form#continue") == 1 and count(driver, "form#stop") == 0


def test_a_file_whose_path_git_quotes_shows_its_hunks_under_its_real_name(
    fleet: tuple[Machine, Machine], ui: UiServer
) -> None:
    import html

    caller, _ = fleet
    name = 'caf\u00e9 "quoted"\\.txt'.replace(" ", "_")  # the fake codex takes a name without spaces
    ref = finished(caller, f"scenario:complete file:{name}", "quoted", "--to", "box")
    status, _, body = ui.http("GET", f"/run/{ref}/diff")
    assert status == 200, body
    assert body.count("<section class=file") == 1
    assert f"<h3>{html.escape(name, quote=True)} " in body  # its real name, not git's quoted form
    at = html.escape(f"{name}:1", quote=True)  # where a comment on the line would point: the real name too
    assert f'<span class="line add" data-at="{at}"><span class=mark>+</span>Hello from the fake codex.</span>' in body


def test_the_run_page_follows_a_live_run_to_its_end_without_a_reload(
    fleet: tuple[Machine, Machine], ui: UiServer, driver: Any
) -> None:
    caller, _ = fleet
    ref = dispatch(caller, "scenario:wait-release message:Released now.", "followed")
    signed_in(driver, ui, f"/run/{ref}")
    assert wait_until(driver, lambda d: count(d, "#status[data-terminal=false]") == 1)
    assert count(driver, "form#stop") == 1
    driver.execute_script("window.wbSamePage = 'yes'")
    release(caller, ref)
    assert wait_until(driver, lambda d: f"{ref} completed" in text_of(d, "#actions")), driver.page_source
    assert wait_until(driver, lambda d: count(d, "#status[data-state=completed]") == 1), driver.page_source
    assert "Released now." in text_of(driver, "#status") and count(driver, "form#continue") == 1
    assert driver.execute_script("return window.wbSamePage") == "yes"


def test_stop_from_the_page_asks_first_and_then_stops_the_run(
    fleet: tuple[Machine, Machine], ui: UiServer, driver: Any
) -> None:
    from selenium.webdriver.common.by import By

    caller, _ = fleet
    ref = dispatch(caller, "scenario:hang", "stopped")
    signed_in(driver, ui, f"/run/{ref}")
    button = driver.find_element(By.CSS_SELECTOR, "form#stop button")
    button.click()
    driver.switch_to.alert.dismiss()  # not confirmed: nothing happens
    assert json.loads(caller.wb("agent", "status", ref, "--json").stdout)["state"] == "running"
    driver.find_element(By.CSS_SELECTOR, "form#stop button").click()
    driver.switch_to.alert.accept()
    assert wait_until(driver, lambda d: count(d, "#notice") == 1), driver.page_source
    assert text_of(driver, "#notice").startswith(f"stopping {ref} worker process ")
    assert wait_for(lambda: json.loads(caller.wb("agent", "status", ref, "--json").stdout)["terminal"], 60)


def test_continue_from_the_page_starts_the_follow_up_run(
    fleet: tuple[Machine, Machine], ui: UiServer, driver: Any
) -> None:
    from selenium.webdriver.common.by import By

    caller, _ = fleet
    ref = finished(caller, "scenario:complete", "continued")
    signed_in(driver, ui, f"/run/{ref}")
    driver.find_element(By.CSS_SELECTOR, "form#continue textarea").send_keys("scenario:complete file:again.txt")
    driver.find_element(By.CSS_SELECTOR, "form#continue button").click()
    assert wait_until(driver, lambda d: "/run/agt-" in d.current_url and ref not in d.current_url)
    new = driver.current_url.rsplit("/", 1)[1]
    assert json.loads(caller.wb("agent", "status", new, "--json").stdout)["parent_id"] == ref
    assert "scenario:complete" not in driver.page_source  # the task is never shown


def test_the_fleet_page_counts_each_kind_and_fits_a_400_pixel_window_with_every_column_reachable(
    fleet: tuple[Machine, Machine], ui: UiServer, driver: Any
) -> None:
    caller, _ = fleet
    ref = finished(caller, "scenario:complete", "counted")
    signed_in(driver, ui)
    assert wait_until(driver, lambda d: count(d, f'#runs tr[data-ref="{ref}"][data-kind=completed]') == 1)
    for kind in ("completed", "failed", "running"):
        shown = int(text_of(driver, f"#counts li[data-kind={kind}] b"))
        assert shown == count(driver, f"#runs tr[data-kind={kind}]"), kind  # under 100 runs: all on this page
    assert "counted" in row(driver, ref).text  # the worktree's name
    started = driver.find_element("css selector", f'#runs tr[data-ref="{ref}"] time')
    assert started.text.endswith(" ago") and started.get_attribute("title")[:2] == "20"
    colours = {kind: driver.execute_script(
        f"return getComputedStyle(document.querySelector('#counts li[data-kind={kind}]')).color") for kind in
        ("completed", "failed", "stopped", "running", "stalled", "queued", "waiting")}  # fmt: skip
    assert len(set(colours.values())) == 7, colours  # a colour of its own each

    size = driver.get_window_size()
    try:
        driver.set_window_size(400, 900)
        driver.get(ui.home + "/")
        assert wait_until(driver, lambda d: d.execute_script("return window.innerWidth") <= 400)
        page_width = driver.execute_script("return document.documentElement.scrollWidth")
        assert page_width <= driver.execute_script("return document.documentElement.clientWidth")  # no sideways page
        reach = driver.execute_script(
            "const box = document.getElementById('runs-box'); box.scrollLeft = box.scrollWidth;"
            "const last = document.querySelector('#runs th:last-child').getBoundingClientRect();"
            "const edge = box.getBoundingClientRect(); return [last.left >= edge.left, last.right <= edge.right + 1];"
        )
        assert reach == [True, True]  # the last column scrolled into its box
    finally:
        driver.set_window_size(size["width"], size["height"])


def test_comments_on_diff_lines_become_the_follow_up_task_in_file_order(
    fleet: tuple[Machine, Machine], ui: UiServer, driver: Any
) -> None:
    from selenium.webdriver.common.by import By

    caller, _ = fleet
    ref = finished(caller, "scenario:complete file:reviewed.txt", "reviewed")
    signed_in(driver, ui, f"/run/{ref}")
    assert wait_until(driver, lambda d: count(d, "form#review:not([hidden])") == 1 and count(d, "#diff .line.add") == 1)
    driver.find_element(By.CSS_SELECTOR, "#diff .line.add").click()
    driver.find_element(By.CSS_SELECTOR, "#diff .comment-box textarea").send_keys("say hello to everyone")
    driver.find_element(By.CSS_SELECTOR, "form#review textarea#review-task").send_keys("scenario:complete file:b.txt")
    driver.find_element(By.CSS_SELECTOR, "form#review button").click()
    assert wait_until(driver, lambda d: "/run/agt-" in d.current_url and ref not in d.current_url)
    new = driver.current_url.rsplit("/", 1)[1]
    assert json.loads(caller.wb("agent", "status", new, "--json").stdout)["parent_id"] == ref
    task = (caller.home / "agents" / new / "task").read_text()
    assert task == "reviewed.txt:1: say hello to everyone\n\nscenario:complete file:b.txt"


def test_the_patch_and_the_raw_log_are_links_of_the_run_page(fleet: tuple[Machine, Machine], ui: UiServer) -> None:
    import subprocess

    caller, _ = fleet
    ref = finished(caller, "scenario:complete file:patched.txt", "patched", "--to", "box")
    _, _, page_html = ui.http("GET", f"/run/{ref}")
    assert "id=patch-link" in page_html and "id=log-link" in page_html
    status, headers, patch = ui.http("GET", f"/run/{ref}/patch")
    assert status == 200 and headers["content-type"].startswith("text/x-diff"), headers
    assert patch == caller.wb("agent", "diff", ref).stdout  # what wb agent diff prints
    facts = json.loads(caller.wb("agent", "status", ref, "--json").stdout)
    base = caller.root / "at-base"  # the repository as the run found it: its base commit, checked out fresh
    clone = Path(facts["worktree_dir"]).parents[3] / "acme" / "widget"
    subprocess.run(["git", "clone", "-q", str(clone), str(base)], check=True, capture_output=True)
    subprocess.run(["git", "-C", str(base), "checkout", "-q", facts["base_sha"]], check=True, capture_output=True)
    checked = subprocess.run(["git", "apply", "--check"], input=patch, text=True, cwd=base, capture_output=True)
    assert checked.returncode == 0, checked.stderr  # it applies to the base
    status, headers, log = ui.http("GET", f"/run/{ref}/log")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    raw = caller.wb("agent", "logs", ref, "--raw").stdout
    assert log == raw.split("\n", 1)[1]  # the transcript, without its path line


def test_markup_from_a_run_or_a_machine_shows_as_text_and_no_script_runs(
    fleet: tuple[Machine, Machine], ui: UiServer, driver: Any
) -> None:
    caller, _ = fleet
    ref = finished(caller, f"scenario:complete file:<i>x.txt ran:<u>ls</u> message:{HOSTILE}", "hostile")
    signed_in(driver, ui, f"/run/{ref}")
    assert wait_until(driver, lambda d: count(d, "#diff section.file") == 1), driver.page_source
    assert HOSTILE in text_of(driver, "#status")  # the result, as text
    assert "<i>x.txt" in text_of(driver, "#files") and "ran: <u>ls</u>" in text_of(driver, "#actions")
    assert count(driver, "#injected") == 0 and count(driver, "main script") == 0
    assert count(driver, "i") == 0 and count(driver, "u") == 0
    driver.get(ui.home + "/")
    assert wait_until(driver, lambda d: "box is down" in text_of(d, "#machines tr[data-machine=down]"))
    assert "<img id=injected-error" in text_of(driver, "#machines tr[data-machine=down]")
    assert count(driver, "#injected-error") == 0
    assert driver.execute_script("return window.wbInjected") is None and driver.title != "pwned"


# -- the command's own errors ----------------------------------------------------------------------


def test_a_taken_port_and_both_scopes_are_one_error_line_each(fleet: tuple[Machine, Machine], ui: UiServer) -> None:
    caller, _ = fleet
    taken = caller.wb("ui", "--port", str(ui.port), timeout=60)
    assert taken.returncode == 2 and taken.stdout == ""
    assert taken.stderr.startswith(f"error: cannot listen on 127.0.0.1:{ui.port}: ") and taken.stderr.count("\n") == 1
    both = caller.wb("ui", "--all", "--to", "box", timeout=60)
    assert both.returncode == 2 and both.stderr == "error: pass either --to MACHINE or --all, not both\n"
    unknown = caller.wb("ui", "--to", "nosuch", timeout=60)
    assert unknown.returncode == 2 and not unknown.stdout
    assert unknown.stderr.startswith('error: unknown machine "nosuch"')


def test_another_address_is_warned_and_a_given_port_is_used(fleet: tuple[Machine, Machine]) -> None:
    caller, _ = fleet
    port = _free_port("127.0.0.1")
    server = UiServer.start(caller, "--bind", "0.0.0.0", "--port", str(port), "--to", "box", host="0.0.0.0")
    try:
        assert server.url.startswith(f"http://0.0.0.0:{port}/?token=")
        assert wait_for(lambda: any("wb ui listens on 0.0.0.0" in line for line in server.stderr), 30)
        assert all(line.startswith("warning: ") for line in server.stderr)
    finally:
        assert server.finish() == 130


@pytest.mark.parametrize("address", ["::1", "127.0.0.2"])
def test_a_loopback_address_is_not_warned(fleet: tuple[Machine, Machine], address: str) -> None:
    caller, _ = fleet
    host = f"[{address}]" if ":" in address else address
    server = UiServer.start(caller, "--bind", address, "--to", "box", host=host)
    try:
        status, _, body = server.http("GET", "/")
        assert status == 200 and "<table id=machines" in body
    finally:
        assert server.finish() == 130
    assert server.stderr == []


def _free_port(address: str) -> int:
    import socket

    with socket.socket() as probe:  # a port free now
        probe.bind((address, 0))
        return int(probe.getsockname()[1])


def _raw(server: UiServer, request: bytes) -> tuple[int, str]:
    """One request over a plain socket, as sent; the status and the body of what comes back."""
    import socket

    with socket.create_connection((server.host, server.port), timeout=30) as connection:
        connection.sendall(request)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 "), answer  # an answer, not a dropped connection
    return int(head.split(b" ")[1]), body.decode("utf-8", "replace")


def test_a_malformed_request_is_400_with_one_line(ui: UiServer) -> None:
    root, cookie = ui.sign_in()
    from courier.ui.actions import FORM_MAX_FIELDS

    fields = "&".join(f"f{n}=x" for n in range(FORM_MAX_FIELDS + 1))
    form = (f"POST {root}/run/agt-x/continue HTTP/1.1\r\nHost: {ui.base.removeprefix('http://')}\r\n"
            f"Cookie: {cookie}\r\nOrigin: {ui.base}\r\nContent-Type: application/x-www-form-urlencoded\r\n"
            f"Content-Length: {len(fields)}\r\nConnection: close\r\n\r\n{fields}")  # fmt: skip
    for request, says in [
        (form, f"error: the form has more than {FORM_MAX_FIELDS} fields"),
        (f"GET /%ff%fe?token={ui.token}", "error: the path is not UTF-8"),
        (f"GET {root}/run/%C3%28", "error: the path is not UTF-8"),
        (f"GET /%0D%0Aset-cookie:%20x=1?token={ui.token}", "error: the path holds a control character"),
        (f"GET {root}/run/a%00b", "error: the path holds a control character"),
        (f"GET /a\r\nb?token={ui.token}", ""),  # a line break in the request line itself: uvicorn's own 400
    ]:
        if not request.startswith("POST"):
            request += f" HTTP/1.1\r\nHost: x\r\nCookie: {cookie}\r\nConnection: close\r\n\r\n"
        status, body = _raw(ui, request.encode())
        assert status == 400 and body.startswith(says) and body.strip().count("\n") == 0, (request, status, body)
        assert ui.token not in body
    # A path that is well-formed, non-ASCII included, is no error: the sign-in redirect keeps it, escaped.
    status, headers, _ = ui.http("GET", f"/%E2%82%AC?token={ui.token}", cookie=False, root=False)
    assert status == 303 and headers["location"] == f"{root}/%E2%82%AC"
    status, _, _ = ui.http("GET", "/%E2%82%AC")
    assert status == 404


def test_open_hands_the_browser_a_private_redirect_file_never_the_token(
    fleet: tuple[Machine, Machine], tmp_path: Path
) -> None:
    caller, _ = fleet
    record = tmp_path / "browser-argv"
    browser = tmp_path / "browser"
    browser.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{record}.tmp" && mv "{record}.tmp" "{record}"\n')
    browser.chmod(0o755)
    machine = Machine(caller.root, {**caller.env, "BROWSER": str(browser)})
    server = UiServer.start(machine, "--open", "--to", "box")
    try:
        assert wait_for(record.exists, 30), server.stderr
        (argument,) = record.read_text().splitlines()
        assert server.token not in argument
        assert argument.startswith("file:///") and argument.endswith(f"/ui/open-{server.port}.html"), argument
        page = Path(argument.removeprefix("file://"))
        assert page.stat().st_mode & 0o777 == 0o600 and page.parent.stat().st_mode & 0o777 == 0o700
        assert f'content="0;url={server.url}"' in page.read_text()
        status, headers, _ = server.http("GET", server.url.removeprefix(server.base), cookie=False, root=False)
        assert status in (302, 303, 307) and "set-cookie" in headers  # the redirect's address signs in
    finally:
        assert server.finish() == 130
    assert not page.exists()  # removed with the server


def test_a_short_reference_in_the_address_leads_to_the_runs_own_page(
    fleet: tuple[Machine, Machine], ui: UiServer
) -> None:
    caller, _ = fleet
    ref = finished(caller, "scenario:complete file:short.txt", "shortref", "--to", "box")
    short = ref[: len("box:agt-") + 6]
    status, headers, _ = ui.http("GET", f"/run/{short}")
    assert status == 303 and headers["location"].endswith(f"/run/{ref}"), (status, headers)
    status, _, facts = ui.http("GET", f"/run/{short}/facts")
    assert status == 200 and ref in facts
    status, _, patch = ui.http("GET", f"/run/{short}/patch")
    assert status == 200 and "short.txt" in patch
    status, _, page_html = ui.http("GET", "/run/box:agt-ffffff")  # a prefix no run has: as an unknown run
    assert status == 404 and "unknown agent run" in page_html, page_html


def test_the_fleet_page_shows_100_runs_a_page_with_links_between_the_pages(tmp_path: Path, driver: Any) -> None:
    """Its own machine with 230 finished runs planted in its store, and a `wb ui` of its own."""
    from datetime import timedelta

    from tests_support import sample_record

    from courier.runs.store import Store
    from protocol.timestamps import rfc3339, utc_now

    machine = make_machine(tmp_path / "m")
    store = Store(machine.home).ensure()
    now = utc_now()
    for n in range(230):
        at = rfc3339(now - timedelta(minutes=n))
        record = sample_record(state="completed", started_at=at, finished_at=at, exit_code=0, worktree=f"w{n}")
        store.create(record, "a planted run")
    server = UiServer.start(machine)
    try:
        signed_in(driver, server)
        # The page fetches its rows again when its live stream opens: read and click through script, at once.
        shown = (
            "const q = (css) => document.querySelector(css);"
            "return [document.querySelectorAll('#runs tr[data-ref]').length, q('#pager span').textContent,"
            " q('#counts li[data-kind=completed] b').textContent, q('#runs tr[data-ref]').dataset.ref,"
            " !!q('#pager a[rel=prev]'), !!q('#pager a[rel=next]'), q('#runs').textContent.includes('w229')]"
        )
        assert wait_until(driver, lambda d: d.execute_script(shown)[:3] == [100, "page 1 of 3", "230"])
        first = driver.execute_script(shown)[3]
        assert driver.execute_script(shown)[4:6] == [False, True]  # the counts above are of every page
        driver.execute_script("document.querySelector('#pager a[rel=next]').click()")
        assert wait_until(driver, lambda d: d.execute_script(shown)[:2] == [100, "page 2 of 3"])
        assert driver.execute_script(shown)[3] != first and driver.execute_script(shown)[4:6] == [True, True]
        driver.execute_script("document.querySelector('#pager a[rel=next]').click()")
        assert wait_until(driver, lambda d: d.execute_script(shown)[:2] == [30, "page 3 of 3"])  # the oldest 30
        assert driver.execute_script(shown)[5:] == [False, True]
    finally:
        driver.get("about:blank")
        assert server.finish() == 130

