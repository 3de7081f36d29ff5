"""A loopback metering relay the run owner puts between the worker and its provider (docs/cli.md#budgets,
docs/cli.md#waiting-out-a-usage-limit).

Why a relay: a budget is checked after every model response, but Codex reports usage only at
the end of a turn, Gemini CLI only in its final `result`, and Claude Code's `assistant` lines
carry the usage of `message_start` (not the final output count). The provider's own responses
carry exact per-response usage in every wire format, so the owner reads them as they pass.
The relay also sees a usage-limit refusal (HTTP 429 and its `retry-after`) the moment it
happens, whatever the harness prints about it. See docs/harnesses.md.

It listens on 127.0.0.1 only and serves its own worker only (docs/cli.md#budgets; docs/security.md):
the worker holds a per-run placeholder (`wb-run-` + 32 hex digits) where the credential would be,
and the relay replaces it with the real credential in each request it forwards (a header such as
`Authorization: Bearer`, `x-api-key` or `x-goog-api-key`, or Gemini's `key=` query parameter). A
request without this run's placeholder, whoever sends it, is refused with 403: not forwarded, not
counted. The answer streams back as it comes while the relay parses it. Once the owner closes it
(a budget crossed), every later request is refused without being forwarded, so the provider
answers no more.
"""

from __future__ import annotations

import email.utils
import hmac
import http.client
import json
import os
import re
import secrets
import socketserver
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from courier.http_body import MAX_BODY_BYTES, read_body
from protocol import limits

_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "accept-encoding",
        "content-encoding",
    }
)
_UPSTREAM_TIMEOUT_S = 600.0
_CHUNK = limits.RELAY_READ_CHUNK_BYTES
# Response headers that say when a provider's limit resets (RFC 3339 or seconds), first found wins.
_RESET_HEADERS = (
    "anthropic-ratelimit-unified-reset",
    "anthropic-ratelimit-tokens-reset",
    "anthropic-ratelimit-requests-reset",
    "x-ratelimit-reset-tokens",
    "x-ratelimit-reset-requests",
)
PLACEHOLDER_PREFIX = "wb-run-"
_PLACEHOLDER = re.compile(rb"wb-run-[0-9a-f]{32}")


def new_placeholder() -> str:
    """A fresh per-run placeholder: `wb-run-` followed by 32 random hex digits (docs/harnesses.md, the relay)."""
    return PLACEHOLDER_PREFIX + secrets.token_hex(16)


@dataclass(frozen=True)
class ResponseUsage:
    """What one model response reported: input tokens (cache reads and writes included), output tokens, and how many
    of the input tokens were cache reads (priced at the cached rate, docs/config.md#price)."""

    input_tokens: int
    output_tokens: int
    cached_input_tokens: int = 0

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True)
class LimitRefusal:
    """A usage or rate limit the provider answered with: when it resets, if it said, and its message."""

    status: int
    reset_at: float | None  # epoch seconds: the provider's reset time, else now + its retry-after
    message: str


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def usage_in(wire_api: str, event: Any) -> tuple[ResponseUsage | None, bool]:
    """(usage so far, final) from one decoded event or JSON body of `wire_api`."""
    if not isinstance(event, dict):
        return None, False
    if wire_api == "responses":
        kind = event.get("type")
        response = event.get("response") if kind else event
        if kind not in (None, "response.completed", "response.incomplete", "response.failed"):
            return None, False
        usage = response.get("usage") if isinstance(response, dict) else None
        if not isinstance(usage, dict):
            return None, kind is not None
        details = usage.get("input_tokens_details")
        cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else 0
        return ResponseUsage(_count(usage.get("input_tokens")), _count(usage.get("output_tokens")), cached), True
    if wire_api == "anthropic":
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
        elif kind in ("message_delta", "message"):
            usage = event.get("usage")
        else:
            return None, kind == "message_stop"
        if not isinstance(usage, dict):
            return None, kind == "message"
        tokens_in = sum(
            _count(usage.get(key))
            for key in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
        )
        cached = _count(usage.get("cache_read_input_tokens"))
        return ResponseUsage(tokens_in, _count(usage.get("output_tokens")), cached), kind == "message"
    if wire_api == "gemini":
        usage = event.get("usageMetadata")
        candidates = event.get("candidates")
        final = isinstance(candidates, list) and any(
            isinstance(c, dict) and c.get("finishReason") for c in candidates
        )
        if not isinstance(usage, dict):
            return None, False
        output = _count(usage.get("candidatesTokenCount")) + _count(usage.get("thoughtsTokenCount"))
        cached = _count(usage.get("cachedContentTokenCount"))
        return ResponseUsage(_count(usage.get("promptTokenCount")), output, cached), final
    return None, False


def response_id_in(wire_api: str, event: Any) -> str | None:
    """The provider's ID of the response an event belongs to (Claude Code's stream names Anthropic's), if any."""
    if not isinstance(event, dict):
        return None
    if wire_api == "anthropic":
        message = event.get("message") if event.get("type") == "message_start" else event
        found = message.get("id") if isinstance(message, dict) else None
    elif wire_api == "responses":
        response = event.get("response") if event.get("type") else event
        found = response.get("id") if isinstance(response, dict) else None
    else:
        found = event.get("responseId")
    return found if isinstance(found, str) and 0 < len(found) <= 256 else None


def is_model_request(wire_api: str, method: str, path: str) -> bool:
    """A request answered by a model response (usage to count): not a probe, a model list or a token count."""
    if method != "POST":
        return False
    route = path.split("?", 1)[0].rstrip("/")
    if wire_api == "anthropic":
        return route.endswith("/messages")
    if wire_api == "responses":
        return route.endswith("/responses")
    return route.endswith((":generateContent", ":streamGenerateContent"))


def _merge(old: ResponseUsage | None, new: ResponseUsage) -> ResponseUsage:
    """Anthropic's message_delta counts are cumulative and may omit the input: keep the larger of each."""
    if old is None:
        return new
    return ResponseUsage(
        max(old.input_tokens, new.input_tokens),
        max(old.output_tokens, new.output_tokens),
        max(old.cached_input_tokens, new.cached_input_tokens),
    )


def reset_time(headers: http.client.HTTPMessage, now: float) -> float | None:
    """When the limit resets: a reset header the provider sends, else `retry-after`, else None."""
    for name in _RESET_HEADERS:
        value = headers.get(name)
        if value:
            found = _time_value(value.strip(), now)
            if found is not None:
                return found
    after = headers.get("retry-after")
    return _time_value(after.strip(), now) if after else None


def _time_value(text: str, now: float) -> float | None:
    """Seconds (`3`, `1.5`, `20s`), an RFC 3339 time or an HTTP date, as epoch seconds."""
    try:
        return now + max(0.0, float(text.removesuffix("s")))
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC).timestamp()
    except ValueError:
        pass
    try:
        return email.utils.parsedate_to_datetime(text).timestamp()
    except (TypeError, ValueError, IndexError):
        return None


def _limit_message(body: bytes) -> str:
    try:
        value = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace")[:200].strip()
    error = value.get("error") if isinstance(value, dict) else None
    if isinstance(value, list) and value and isinstance(value[0], dict):
        error = value[0].get("error")  # Gemini's streaming endpoint answers with a one-item list
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])[:200]
    return "rate limited"


class Meter:
    """The relay: `start()` gives the base URL the worker is pointed at; `close()` refuses further requests.

    `on_response(usage, response_id)` is called once per model response answered (usage None when
    the response carried none); `admit()` is asked before each request is forwarded (False refuses it).
    """

    def __init__(
        self,
        upstream_base_url: str,
        wire_api: str,
        on_response: Callable[[ResponseUsage | None, str | None], None],
        on_limit: Callable[[LimitRefusal], None] | None = None,
        *,
        placeholder: str,
        credential: str,
        admit: Callable[[], bool] | None = None,
    ) -> None:
        parts = urlsplit(upstream_base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url {upstream_base_url!r} is not an http(s) URL the relay can forward to")
        if not _PLACEHOLDER.fullmatch(placeholder.encode()):
            raise ValueError("the relay's placeholder must be wb-run- followed by 32 hex digits")
        self._upstream = parts
        self._wire_api = wire_api
        self._placeholder = placeholder.encode()
        self._credential = credential
        self._admit = admit
        self._on_response = on_response
        self._on_limit = on_limit
        self._closed = threading.Event()
        self._paused = threading.Event()  # while the owner waits out a usage limit
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._handler: type[_RelayHandler] | None = None
        self._unix_server: socketserver.ThreadingUnixStreamServer | None = None
        self.answered = 0  # model responses forwarded
        self.refused_foreign = 0  # requests refused for not carrying this run's placeholder

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def close(self) -> None:
        """From now on every request is refused here, never forwarded."""
        self._closed.set()

    def pause(self) -> None:
        """Refuse requests until `reopen`: the worker is being stopped to wait out a usage limit."""
        self._paused.set()

    def reopen(self) -> None:
        self._paused.clear()

    @property
    def paused(self) -> bool:
        return self._paused.is_set()

    def start(self) -> str:
        meter = self

        class Handler(_RelayHandler):
            owner = meter

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        self._server = server
        self._handler = Handler
        self._thread = threading.Thread(target=server.serve_forever, name="wb-meter", daemon=True)
        self._thread.start()
        path = self._upstream.path.rstrip("/")
        return f"http://127.0.0.1:{server.server_address[1]}{path}"

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.server_address[1])

    def listen_unix(self, directory: Path, name: str) -> None:
        """Also serve on the Unix socket `directory/name`: a confined worker's forwarder reaches the relay there
        (docs/security.md#confined-runs). Bound through the directory's descriptor: a run's path may be longer than
        a socket address can hold."""
        assert self._handler is not None
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            server = _UnixRelayServer(f"/proc/self/fd/{fd}/{name}", self._handler)
        finally:
            os.close(fd)
        self._unix_server = server
        threading.Thread(target=server.serve_forever, name="wb-meter-unix", daemon=True).start()

    def stop(self) -> None:
        self.close()
        for server in (self._server, self._unix_server):
            if server is not None:
                server.shutdown()
                server.server_close()
        self._server = self._unix_server = None

    # -- called from handler threads

    def connection(self) -> http.client.HTTPConnection:
        parts = self._upstream
        if parts.scheme == "https":
            return http.client.HTTPSConnection(parts.hostname or "", parts.port, timeout=_UPSTREAM_TIMEOUT_S)
        return http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=_UPSTREAM_TIMEOUT_S)

    @property
    def upstream_host(self) -> str:
        return self._upstream.netloc.rpartition("@")[2]

    def usage_of(self, event: Any) -> tuple[ResponseUsage | None, bool]:
        return usage_in(self._wire_api, event)

    def response_id(self, event: Any) -> str | None:
        return response_id_in(self._wire_api, event)

    def is_model_request(self, method: str, path: str) -> bool:
        return is_model_request(self._wire_api, method, path)

    def carries_placeholder(self, values: list[str]) -> bool:
        """True when one of the request's header values or its path holds exactly this run's placeholder."""
        for value in values:
            for found in _PLACEHOLDER.findall(value.encode("latin-1", "replace")):
                if hmac.compare_digest(found, self._placeholder):
                    return True
        return False

    def with_credential(self, value: str) -> str:
        """`value` with this run's placeholder replaced by the real credential (the relay's side only)."""
        return value.replace(self._placeholder.decode(), self._credential)

    def admitted(self) -> bool:
        return self._admit is None or self._admit()

    def responded(self, usage: ResponseUsage | None, response_id: str | None) -> None:
        self.answered += 1
        self._on_response(usage, response_id)

    def limited(self, refusal: LimitRefusal) -> None:
        if self._on_limit is not None:
            self._on_limit(refusal)


class _UnixRelayServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True


class _RelayHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    owner: Meter
    model_request = False

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def address_string(self) -> str:  # a Unix socket's peer has no address
        return str(self.client_address[0]) if self.client_address else "unix"

    def do_GET(self) -> None:
        self._relay()

    def do_POST(self) -> None:
        self._relay()

    def do_HEAD(self) -> None:  # Claude Code probes its base URL
        self._relay()

    def _refuse(self, status: int, message: str) -> None:
        data = json.dumps({"error": {"message": message, "type": "wb_meter"}}).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.send_header("connection", "close")
        self.end_headers()
        self.wfile.write(data)
        self.close_connection = True

    def _body(self) -> bytes:
        return read_body(self.rfile, self.headers)

    def _relay(self) -> None:
        meter = self.owner
        try:
            body = self._body()
        except ValueError as exc:
            self._refuse(413, str(exc))
            return
        if not meter.carries_placeholder([self.path, *self.headers.values()]):
            meter.refused_foreign += 1
            self._refuse(403, "this relay serves its own run only: the request does not carry the run's placeholder")
            return
        if meter.closed:
            self._refuse(503, "wb stopped this run (its budget is spent); the request was not sent")
            return
        if meter.paused:
            self._refuse(503, "wb is waiting out the provider's usage limit; the request was not sent")
            return
        if not meter.admitted():
            self._refuse(503, "wb stopped this run: a model response reported no usage; the request was not sent")
            return
        headers = {k: meter.with_credential(v) for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        headers["Host"] = meter.upstream_host
        headers["Accept-Encoding"] = "identity"  # the relay reads what passes
        self.model_request = meter.is_model_request(self.command, self.path)
        upstream = meter.connection()
        try:
            payload = body if body or self.command == "POST" else None
            upstream.request(self.command, meter.with_credential(self.path), body=payload, headers=headers)
            response = upstream.getresponse()
        except OSError as exc:
            upstream.close()
            self._refuse(502, f"wb's metering relay could not reach the provider: {exc}")
            return
        try:
            self._answer(response)
        finally:
            upstream.close()

    def _answer(self, response: http.client.HTTPResponse) -> None:
        meter = self.owner
        streaming = "event-stream" in (response.getheader("content-type") or "")
        if response.status == 429:
            data = response.read(MAX_BODY_BYTES)
            meter.limited(LimitRefusal(429, reset_time(response.headers, time.time()), _limit_message(data)))
            self._head(response, len(data))
            self.wfile.write(data)
            return
        if not streaming:
            data = response.read(MAX_BODY_BYTES)
            if response.status == 200 and self.model_request:
                try:
                    value = json.loads(data)
                except ValueError:
                    value = None
                usage, _ = meter.usage_of(value)
                meter.responded(usage, meter.response_id(value))
            self._head(response, len(data))
            self.wfile.write(data)
            return
        self._head(response, None)
        self._stream(response)

    def _head(self, response: http.client.HTTPResponse, length: int | None) -> None:
        self.send_response(response.status, response.reason)
        for key, value in response.getheaders():
            if key.lower() not in _HOP_BY_HOP:
                self.send_header(key, value)
        if length is not None:
            self.send_header("content-length", str(length))
        self.send_header("connection", "close")  # a streamed body ends when the connection does
        self.end_headers()
        self.close_connection = True

    def _stream(self, response: http.client.HTTPResponse) -> None:
        """Forward an SSE body as it comes; a response's usage is taken before the bytes that complete it are sent."""
        meter = self.owner
        pending = b""
        usage: ResponseUsage | None = None
        response_id: str | None = None
        counted = not (self.model_request and response.status == 200)
        while True:
            chunk = response.read1(_CHUNK)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                text = line.strip()
                if not text.startswith(b"data:"):
                    continue
                try:
                    event = json.loads(text[5:])
                except ValueError:
                    continue
                found, final = meter.usage_of(event)
                response_id = response_id or meter.response_id(event)
                if found is not None:
                    usage = _merge(usage, found)
                if final and usage is not None and not counted:
                    counted = True
                    meter.responded(usage, response_id)
            try:
                self.wfile.write(chunk)
                self.wfile.flush()
            except OSError:
                break
        if not counted:
            meter.responded(usage, response_id)  # usage None: the response reported none
