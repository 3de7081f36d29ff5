"""The remote session mode, `wb --wb-internal-agent-serve` (docs/courier.md): JSON lines, many requests.

Each stdin line is one request document (docs/protocol.md#the-request) carrying a `request_id`; each is
answered on its own thread, so a long await never holds up the others, and its reply
(docs/protocol.md#the-response) is written as one stdout line that starts with the same `request_id`.
The process ends when stdin closes, when the wb it runs was upgraded on disk, and when the
machine's login files changed (courier/stamp.py: its dispatches would no longer run with the
environment a new login gets; checked between requests and every few seconds, and by each
dispatch, which a changed login hands to a new login, docs/courier.md): in-flight requests then stop early
(an await returns its last observation, which the caller simply asks again) and are
answered before it exits. As light as the one-call receiver: no asyncssh, typer or yaml.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import threading

from courier.receiver.serve import (
    _detach_stdio,
    _home_id,
    _import_models,
    _operation_of,
    _refusal,
    answer,
    client_watch,
    internal_failure,
)
from courier.stage_trace import mark
from courier.stamp import login_changed, program_stamp, watch_login
from protocol import limits

_READ_CHUNK = 1 * limits.MIB
_UPGRADE_CHECK_S = 2.0
_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
_NO_REQUEST_ID = "the request has no valid request_id (1-64 of [A-Za-z0-9._-]); it was not executed"


class _Session:
    def __init__(self, reply_fd: int) -> None:
        self.reply_fd = reply_fd
        self.write_lock = threading.Lock()
        self.ending = threading.Event()
        self.threads: list[threading.Thread] = []
        self.watch = client_watch(reply_fd)

    def gone(self) -> bool:
        return self.ending.is_set() or self.watch()

    def handle(self, line: bytes) -> None:
        mark("session.request")  # docs/benchmarks.md#dispatch-latency
        request_id = _request_id(line)
        try:
            # Without a request_id the reply could not be matched to it, so the work must not happen.
            if request_id:
                response = answer(line, False, self.gone, fresh_login=False)
            else:
                response = _refusal(_NO_REQUEST_ID, _operation_of(line))
            response.home_id = _home_id()
            body = response.encode()
        except Exception as exc:  # one line, never a traceback
            body = internal_failure(exc)
        self.reply(request_id, body)

    def reply(self, request_id: str, body: bytes) -> None:
        body = body.strip()
        line = b'{"request_id":' + json.dumps(request_id).encode() + (b"," if body != b"{}" else b"") + body[1:] + b"\n"
        from courier.runs.store import write_all  # loaded by _import_models

        with self.write_lock:
            try:
                write_all(self.reply_fd, line)
            except OSError:
                self.ending.set()

    def start(self, line: bytes) -> None:
        thread = threading.Thread(target=self.handle, args=(line,), daemon=True)
        self.threads = [item for item in self.threads if item.is_alive()]
        self.threads.append(thread)
        thread.start()

    def oversize(self) -> None:
        self.reply("", _refusal(f"request exceeds {limits.REQUEST_MAX_BYTES} bytes").encode())

    def finish(self) -> None:
        self.ending.set()
        for thread in self.threads:
            thread.join()


def _request_id(line: bytes) -> str:
    try:
        document = json.loads(line)
    except (ValueError, RecursionError):
        return ""
    value = document.get("request_id") if isinstance(document, dict) else None
    return value if isinstance(value, str) and _REQUEST_ID.fullmatch(value) else ""


def _start_launcher() -> None:
    """The owner launcher, started before the first dispatch needs it: this process answers on threads, so a
    run's owner is a copy of the launcher, not of it (courier/runs/launcher.py)."""
    from courier.runs.launcher import process_launcher

    with contextlib.suppress(OSError):
        process_launcher().start()  # without one, an owner starts as a new interpreter


def serve_session(argv: list[str]) -> int:
    """Answer request lines until stdin closes or wb is upgraded; exit 0."""
    del argv
    stamp = program_stamp()
    watch_login()  # a dispatch here runs with this environment only while the login files stay as they are
    _import_models()
    request_fd = os.dup(0)
    os.set_inheritable(request_fd, False)
    session = _Session(_detach_stdio())
    _start_launcher()
    buffer = bytearray()
    skipping = False  # inside an oversize line: drop bytes up to its newline
    try:
        while True:
            ready, _, _ = select.select([request_fd], [], [], _UPGRADE_CHECK_S)
            if program_stamp() != stamp or login_changed():
                break  # the courier starts a new session, with the program and the environment as they are now
            if not ready:
                continue
            chunk = os.read(request_fd, _READ_CHUNK)
            if not chunk:
                break
            buffer += chunk
            while (end := buffer.find(b"\n")) >= 0:
                line = bytes(buffer[:end])
                del buffer[: end + 1]
                if skipping:
                    skipping = False
                    continue
                if line.strip():
                    session.start(line)
            if len(buffer) > limits.REQUEST_MAX_BYTES:
                buffer.clear()
                if not skipping:
                    skipping = True
                    session.oversize()
    except OSError:
        pass
    finally:
        session.finish()
        os.close(request_fd)
        os.close(session.reply_fd)
    return 0
