"""What the `wb ui` tests share (docs/ui.md): a running `wb ui`, a headless Chromium driven by Selenium, plain HTTP.

The browser is Debian's `chromium` with its `chromedriver` (scripts/install-chromium.sh); one
per test session. Without them the browser tests skip on a developer machine and fail in CI.
"""

from __future__ import annotations

import atexit
import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from conftest import Machine, unavailable, wait_for

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


@dataclass
class UiServer:
    """A running `wb ui …` (cold: it is one of the commands that never go through the courier)."""

    process: subprocess.Popen[str]
    url: str  # the printed address, with its ?token=
    stderr: list[str] = field(default_factory=list)
    _session: tuple[str, str] | None = None
    _drainer: threading.Thread | None = None

    @classmethod
    def start(cls, machine: Machine, *args: str, cwd: Path | None = None, host: str = "127.0.0.1") -> UiServer:
        process = subprocess.Popen(
            [sys.executable, "-m", "courier.main", "ui", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=machine.env,
            cwd=cwd or machine.root,
        )
        assert process.stdout is not None
        line = process.stdout.readline()
        server = cls(process, line.split(" ")[-1].strip())
        server._drainer = threading.Thread(target=server._drain, daemon=True)
        server._drainer.start()
        assert line.startswith(f"wb ui: http://{host}:") and "/?token=" in line, (line, server.finish())
        return server

    def _drain(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.stderr.append(line)

    @property
    def base(self) -> str:
        return self.url.split("/?", 1)[0]

    @property
    def host(self) -> str:
        return str(urlsplit(self.base).hostname)

    @property
    def token(self) -> str:
        return self.url.split("?token=", 1)[1]

    @property
    def port(self) -> int:
        return int(urlsplit(self.base).port or 0)

    def sign_in(self) -> tuple[str, str]:
        """(the session root, the cookie `name=value`) the printed address hands a browser (docs/ui.md, Security)."""
        if not self._session:
            status, headers, _ = self.http("GET", "/?token=" + self.token, cookie=False, root=False)
            assert status == 303, (status, headers)
            root = headers["location"].rstrip("/")
            self._session = (root, headers["set-cookie"].split(";", 1)[0])
        return self._session

    @property
    def home(self) -> str:
        """The fleet page's address once signed in (the session root: links under it carry the credential)."""
        return self.base + self.sign_in()[0]

    def finish(self) -> int:
        """Ctrl-C, as a user ends it; the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._drainer is not None:
            self._drainer.join(10)  # every line it wrote is in `stderr`
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()
        return self.process.returncode

    def http(
        self,
        method: str,
        path: str,
        *,
        cookie: bool = True,
        root: bool = True,
        headers: dict[str, str] | None = None,
        body: str = "",
    ) -> tuple[int, dict[str, str], str]:
        """One plain HTTP request (no browser): status, headers (lower-case names), body.

        `cookie` sends the session cookie, `root` puts `path` under the session root: both, as a
        signed-in page's own requests do, unless told otherwise.
        """
        sent = dict(headers or {})
        if cookie:
            sent["Cookie"] = self.sign_in()[1]
        if root:
            path = self.sign_in()[0] + path
        connection = http.client.HTTPConnection(self.host, self.port, timeout=30)
        if body:
            sent.setdefault("Content-Type", "application/x-www-form-urlencoded")
        try:
            connection.request(method, path, body=body.encode() if body else None, headers=sent)
            answer = connection.getresponse()
            text = answer.read().decode("utf-8", "replace")
            return answer.status, {k.lower(): v for k, v in answer.getheaders()}, text
        finally:
            connection.close()

    def post(self, path: str, body: str, **headers: str) -> tuple[int, str]:
        origin = {"Origin": self.base} if "Origin" not in headers else {}
        status, _, text = self.http("POST", path, headers={**origin, **headers}, body=body)
        return status, text


def browser() -> Any:
    """A headless Chromium under chromedriver (Selenium); the caller quits it."""
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        unavailable("chromium and chromium-driver are not installed (bash scripts/install-chromium.sh)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900",
                     "--disable-gpu", "--no-first-run", "--disable-extensions"):  # fmt: skip
        options.add_argument(argument)
    # Chromium makes its profile's socket directory in TMPDIR and leaves it when it is ended rather than
    # closed: a directory of its own, removed at exit, keeps the machine's /tmp free of them (every
    # directory there with a socket is one more mount in each confined run's sandbox).
    scratch = tempfile.mkdtemp(prefix="wb-tests-chromium-")
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)
    service = Service(CHROMEDRIVER, env={**os.environ, "TMPDIR": scratch})
    return webdriver.Chrome(service=service, options=options)


_SHARED: list[Any] = []


def shared_browser() -> Any:
    """The one browser of the test session (each UI module's `driver` fixture hands it out); quit at exit."""
    if not _SHARED:
        chrome = browser()
        _SHARED.append(chrome)
        atexit.register(chrome.quit)
    return _SHARED[0]


def wait_until(driver: Any, predicate: Any, timeout: float = 60) -> bool:
    """Wait on a condition of the page (never a sleep); a stale element is asked again."""
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException

    def holds() -> bool:
        try:
            return bool(predicate(driver))
        except (StaleElementReferenceException, WebDriverException):
            return False

    return wait_for(holds, timeout, interval=0.1)


def open_stream(ui: UiServer, path: str, first: bytes = b": following") -> socket.socket:
    """A page's live stream, open: the socket, once the stream's first comment (`first`) arrived."""
    root, cookie = ui.sign_in()
    connection = socket.create_connection((ui.host, ui.port), timeout=60)
    connection.sendall(f"GET {root}{path} HTTP/1.1\r\nHost: x\r\nCookie: {cookie}\r\n\r\n".encode())
    seen = b""
    while first not in seen:
        chunk = connection.recv(65536)
        assert chunk, seen
        seen += chunk
    return connection
