"""Plumbing the scripted model servers share: a threaded loopback HTTP server, its recordings, and SSE."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, ClassVar, Generic, Self, TypeVar

from courier.http_body import MAX_BODY_BYTES, read_body

__all__ = ["MAX_BODY_BYTES", "FieldSum", "RecordedRequest", "ScriptedHandler", "ScriptedServer", "sse", "sum_usage"]


@dataclass(frozen=True)
class RecordedRequest:
    """One request the server received. `body` is the decoded JSON, or None when absent or not JSON."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: Any
    raw_body: bytes = field(repr=False, default=b"")


class FieldSum:
    """Adds a dataclass of counts field by field (a usage record's `+`)."""

    def __add__(self, other: Self) -> Self:
        mine: Any = self
        return type(self)(*(getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(mine)))


UsageT = TypeVar("UsageT", bound=FieldSum)
ServedT = TypeVar("ServedT")


def sum_usage(zero: UsageT, usages: Iterable[UsageT | None]) -> UsageT:
    """`zero` plus every usage that is not None."""
    total = zero
    for usage in usages:
        if usage is not None:
            total += usage
    return total


def sse(events: Iterable[Mapping[str, Any]], *, named: bool = True, newline: str = "\n") -> bytes:
    """Server-Sent Events: one `data:` JSON line per event, after an `event: <type>` line when `named`."""
    end = newline * 2
    if named:
        return "".join(f"event: {e['type']}{newline}data: {json.dumps(e)}{end}" for e in events).encode()
    return "".join(f"data: {json.dumps(e)}{end}" for e in events).encode()


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    owner: ScriptedServer[Any]


class ScriptedHandler(BaseHTTPRequestHandler):
    """Reads and records each request, then hands it to the owning server's `handle` hook."""

    protocol_version = "HTTP/1.1"
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:  # silence the per-request stderr line
        pass

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_HEAD(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        owner = self.server.owner
        if self.command not in owner.methods:  # what BaseHTTPRequestHandler answers for a method it lacks
            self.send_error(HTTPStatus.NOT_IMPLEMENTED, f"Unsupported method ({self.command!r})")
            return
        try:
            raw = self._read_body()
        except ValueError as exc:
            owner.refuse_body(self, str(exc))
            self.close_connection = True
            return
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = None
        headers = {k.lower(): v for k, v in self.headers.items()}
        owner._record(RecordedRequest(self.command, self.path, headers, body, raw))
        owner.handle(self, body)

    def _read_body(self) -> bytes:
        return read_body(self.rfile, self.headers)

    # -- for the servers' hooks

    def send(self, status: int, content_type: str, data: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def send_json(self, status: int, value: Any, headers: Mapping[str, str] | None = None) -> None:
        data = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        for key, header in (headers or {}).items():
            self.send_header(key, header)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def route(self) -> tuple[str, list[str]]:
        """The scenario (a known `/<scenario>` prefix, else the server's) and the path's other segments."""
        parts = self.path.split("?", 1)[0].strip("/").split("/")
        if parts and parts[0] in self.server.owner.scenarios:
            return parts[0], parts[1:]
        return self.server.owner.scenario, parts

    def api_path(self, version: str = "v1") -> tuple[str, str] | None:
        """(scenario, API path after /<version>) for `/<version>/...` or `/<scenario>/<version>/...`."""
        scenario, parts = self.route()
        if not parts or parts[0] != version:
            return None
        return scenario, "/" + "/".join(parts[1:])


class ScriptedServer(Generic[ServedT]):
    """A scripted model on 127.0.0.1. Use as a context manager, or call `start()` and `stop()`.

    A subclass names its `scenarios` and answers each recorded request in `handle`; `requests`
    and `served` are snapshots, safe to read while the server runs.
    """

    scenarios: ClassVar[tuple[str, ...]]  # the names a URL prefix selects
    methods: ClassVar[frozenset[str]] = frozenset({"GET", "POST"})
    api_root: ClassVar[str] = ""  # what `base_url` adds to the origin
    label: ClassVar[str] = "model server"  # for error messages
    thread_name: ClassVar[str] = "wb-model-server"

    def __init__(self, scenario: str = "write-file", *, host: str = "127.0.0.1", port: int = 0) -> None:
        self._check(scenario)
        self.scenario = scenario
        self._host = host
        self._port = port
        self._lock = threading.Lock()
        self._requests: list[RecordedRequest] = []
        self._served: list[ServedT] = []
        self._ids = 0
        self._server: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        # A usage limit to play (see `limit_at`): the step, how many answers are left, the retry-after.
        self._limit: tuple[int, int, str] | None = None
        self.limited = 0  # how many 429 answers were sent

    def limit_at(self, step: int, times: int, retry_after: str = "3") -> None:
        """Answer the next `times` requests at `step` with HTTP 429 and `retry-after` (a usage limit)."""
        with self._lock:
            self._limit = (step, times, retry_after)

    def take_limit(self, step: int) -> str | None:
        """The retry-after to answer this request with (HTTP 429), or None to answer it normally."""
        with self._lock:
            if self._limit is None or self._limit[0] != step or self._limit[1] <= 0:
                return None
            at, left, retry_after = self._limit
            self._limit = (at, left - 1, retry_after)
            self.limited += 1
            return retry_after

    def _check(self, scenario: str) -> None:
        if scenario not in self.scenarios:
            raise ValueError(f"unknown scenario {scenario!r}; known: {', '.join(self.scenarios)}")

    # -- the per-request hooks

    def handle(self, request: ScriptedHandler, body: Any) -> None:
        """Answer one request (already recorded); `body` is its decoded JSON or None."""
        raise NotImplementedError

    def refuse_body(self, request: ScriptedHandler, message: str) -> None:
        """Answer a request whose body could not be read (too large); it is not recorded."""
        request.send_json(400, {"error": {"message": message}})

    # -- lifecycle

    def start(self) -> None:
        if self._server is not None:
            raise RuntimeError(f"the {self.label} is already running")
        server = _HTTPServer((self._host, self._port), ScriptedHandler)
        server.owner = self
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name=self.thread_name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    # -- addresses

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError(f"the {self.label} is not running")
        return int(self._server.server_address[1])

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The provider base URL for the constructor's scenario."""
        return f"{self.origin}{self.api_root}"

    def base_url_for(self, scenario: str) -> str:
        """The provider base URL that plays `scenario` whatever the constructor said."""
        self._check(scenario)
        return f"{self.origin}/{scenario}{self.api_root}"

    # -- what happened

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    @property
    def served(self) -> list[ServedT]:
        with self._lock:
            return list(self._served)

    def clear(self) -> None:
        with self._lock:
            self._requests.clear()
            self._served.clear()

    # -- called from handler threads

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(request)

    def _serve(self, served: ServedT) -> None:
        with self._lock:
            self._served.append(served)

    def _next_id(self) -> int:
        with self._lock:
            self._ids += 1
            return self._ids
