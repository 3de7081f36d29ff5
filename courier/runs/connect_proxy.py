"""The HTTP(S) proxy the owner runs outside a confined worker for a profile's `network: [HOST[:PORT], ...]`.

A confined worker has no network of its own (docs/security.md#confined-runs). When its profile names
hosts, the owner runs this proxy outside the sandbox and the worker's `HTTPS_PROXY` and `HTTP_PROXY`
point at it. It serves:

- `CONNECT host:port`: after `200 Connection established`, bytes flow both ways unchanged (TLS
  included: the proxy never sees inside it);
- a plain-HTTP proxy request (`GET http://host[:port]/path`, as HTTP_PROXY clients send them): sent
  on with the URL rewritten to origin form (`GET /path`), hop-by-hop headers dropped, one request per
  connection (`Connection: close` both ways), the response streamed as it comes.

Only the listed hosts are reached: a host is compared exactly (case-insensitively, one trailing dot
ignored, an IP address in its canonical form), with no wildcard and no resolution first, so a name
that resolves to an allowed address is still refused. An entry without a port allows 443 and 80. Any
other host gets 403 with one line, `on_refused(host)` is called once for the request, and that host is
never resolved or connected to. A malformed request gets 400, a header block past
`limits.PROXY_HEADER_MAX_BYTES` 431, an unreachable allowed host 502.

Threads, one per client connection (and one more per open tunnel): the owner is a synchronous program
with threads, and a worker opens few connections at once (`limits.PROXY_CONNECTIONS_MAX`, then 503).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import secrets
import selectors
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from protocol import limits

_PORTS_WITHOUT_ONE = (443, 80)
# Hop-by-hop headers (RFC 9110, section 7.6.1) plus the proxy's own, never sent on. Transfer-Encoding stays:
# the body's framing passes through unchanged, so its header must too.
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization"}
    | {"te", "trailer", "upgrade"}
)
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
_HOSTNAME = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*$")
_HOSTNAME_MAX_CHARS = 253
_CONTROL = re.compile(r"[\x00-\x20\x7f]")
_CHUNK_LINE_MAX_BYTES = 4 * limits.KIB
_LINGER_S = 1.0
_PORT_MAX = 65535


class _Answer(Exception):
    """Answer the client with this status and one line, then close."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


def _bad(message: str) -> _Answer:
    return _Answer(400, "Bad Request", message)


def normalize_host(text: str) -> str:
    """The host as compared with the allowed list; `_Answer(400)` for anything not a DNS name or IP."""
    host = text.lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            return str(ipaddress.IPv6Address(host))
        except ValueError:
            raise _bad(f"not an IPv6 address: {text[:100]!r}") from None
    if host.endswith("."):
        host = host[:-1]
    try:
        return str(ipaddress.IPv4Address(host))
    except ValueError:
        pass
    if len(host) > _HOSTNAME_MAX_CHARS or not _HOSTNAME.match(host):
        raise _bad(f"not a host name: {text[:100]!r}")
    return host


def split_authority(text: str, default_port: int | None) -> tuple[str, int | None]:
    """`HOST`, `HOST:PORT`, `[V6]` or `[V6]:PORT` as (normalized host, port or `default_port`)."""
    if text.startswith("["):
        end = text.find("]")
        host, rest = text[: end + 1], text[end + 1 :]
        if end < 0 or (rest and not rest.startswith(":")):
            raise _bad(f"not HOST:PORT: {text[:100]!r}")
        port_text = rest[1:] if rest else None
    elif ":" in text:
        host, _, port_text = text.rpartition(":")
    else:
        host, port_text = text, None
    if port_text is None:
        return normalize_host(host), default_port
    if not port_text.isascii() or not port_text.isdigit() or not 0 < int(port_text) <= _PORT_MAX:
        raise _bad(f"not a port: {port_text[:20]!r}")
    return normalize_host(host), int(port_text)


@dataclass(frozen=True)
class _Head:
    """A request line (or a status line) and its headers, as received."""

    first: str
    headers: list[tuple[str, str]]

    def values(self, name: str) -> list[str]:
        return [value for key, value in self.headers if key.lower() == name]


class _Closed(Exception):
    """The peer closed before a complete header block; nothing to answer."""


class _Stream:
    """A socket with what was already read past the point the caller has consumed."""

    def __init__(self, sock: socket.socket, status_if_bad: int = 400) -> None:
        self.sock = sock
        self.buffer = bytearray()
        self._status_if_bad = status_if_bad

    def _fill(self) -> bool:
        chunk = self.sock.recv(limits.PROXY_READ_CHUNK_BYTES)
        self.buffer += chunk
        return bool(chunk)

    def _refuse(self, status: int, reason: str, message: str) -> _Answer:
        if self._status_if_bad == 502:  # the upstream's fault, not the client's
            return _Answer(502, "Bad Gateway", f"the upstream answered badly: {message}")
        return _Answer(status, reason, message)

    def read_head(self) -> _Head:
        searched = 0
        while (end := self.buffer.find(b"\r\n\r\n", max(0, searched - 3))) < 0:
            if len(self.buffer) > limits.PROXY_HEADER_MAX_BYTES:
                raise self._refuse(431, "Request Header Fields Too Large", "the header block is too large")
            searched = len(self.buffer)
            if not self._fill():
                if not self.buffer:
                    raise _Closed
                raise self._refuse(400, "Bad Request", "the header block ended early")
        if end + 4 > limits.PROXY_HEADER_MAX_BYTES:
            raise self._refuse(431, "Request Header Fields Too Large", "the header block is too large")
        lines = self.buffer[:end].decode("latin-1").split("\r\n")
        del self.buffer[: end + 4]
        if len(lines) - 1 > limits.PROXY_HEADER_LINES_MAX:
            raise self._refuse(431, "Request Header Fields Too Large", "too many header lines")
        headers = []
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon or not _TOKEN.match(name):
                raise self._refuse(400, "Bad Request", f"not a header line: {line[:100]!r}")
            headers.append((name, value.strip(" \t")))
        return _Head(lines[0], headers)

    def read_line(self) -> bytes:
        while (end := self.buffer.find(b"\r\n")) < 0:
            if len(self.buffer) > _CHUNK_LINE_MAX_BYTES:
                raise _bad("a chunk-size line is too long")
            if not self._fill():
                raise _Closed
        line = bytes(self.buffer[: end + 2])
        del self.buffer[: end + 2]
        return line

    def read_exactly(self, count: int) -> Iterator[bytes]:
        while count > 0:
            if not self.buffer and not self._fill():
                raise _Closed
            piece = bytes(self.buffer[:count])
            del self.buffer[: len(piece)]
            count -= len(piece)
            yield piece


def _parse_request_line(line: str) -> tuple[str, str]:
    parts = line.split(" ")
    if len(parts) != 3 or not _TOKEN.match(parts[0]) or parts[2] not in ("HTTP/1.1", "HTTP/1.0"):
        raise _bad(f"not an HTTP/1 request line: {line[:100]!r}")
    if _CONTROL.search(parts[1]) or not parts[1]:
        raise _bad("the request target holds a control character")
    return parts[0], parts[1]


def _answer(sock: socket.socket, answer: _Answer) -> None:
    body = f"{answer.message}\n".encode()
    head = (
        f"HTTP/1.1 {answer.status} {answer.reason}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    with contextlib.suppress(OSError):
        sock.sendall(head.encode() + body)


def _linger(sock: socket.socket) -> None:
    """Read (and drop) what the client is still sending, a little, before closing: a socket closed with
    unread input resets the connection, and the client could lose the answer it has not read yet."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(_LINGER_S)
        left = limits.PROXY_HEADER_MAX_BYTES
        while left > 0 and (chunk := sock.recv(limits.PROXY_READ_CHUNK_BYTES)):
            left -= len(chunk)


def _turn_away(client: socket.socket) -> None:
    """503 for a connection past the bound (its own short thread: the answer lingers, the listener does not)."""
    try:
        _answer(client, _Answer(503, "Service Unavailable", "too many connections to the proxy"))
        _linger(client)
    finally:
        client.close()


def _kept_headers(head: _Head) -> list[tuple[str, str]]:
    """The headers a proxy sends on: neither hop-by-hop nor named by Connection."""
    named = {token.strip().lower() for value in head.values("connection") for token in value.split(",")}
    return [(k, v) for k, v in head.headers if k.lower() not in _HOP_BY_HOP and k.lower() not in named]


def _encode_head(first: str, headers: list[tuple[str, str]]) -> bytes:
    return "".join([f"{first}\r\n", *(f"{k}: {v}\r\n" for k, v in headers), "\r\n"]).encode("latin-1")


class ConnectProxy:
    """Tunnels and forwards to the allowed hosts only; see the module's docstring."""

    def __init__(self, allowed: Sequence[str], on_refused: Callable[[str], None]) -> None:
        entries: set[tuple[str, int | None]] = set()
        for entry in allowed:
            try:
                entries.add(split_authority(entry.strip(), None))
            except _Answer as exc:
                raise ValueError(f"network entry {entry[:100]!r}: {exc.message}") from None
        self._allowed = frozenset(entries)
        self._on_refused = on_refused
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._clients = 0
        self._listeners: list[socket.socket] = []
        self._unix_paths: list[str] = []
        self._accepters: list[threading.Thread] = []
        self._wake_read, self._wake_write = os.pipe()
        self._stopped = False

    def allows(self, host: str, port: int) -> bool:
        """Whether `host` (already normalized) at `port` is on the list."""
        return (host, port) in self._allowed or ((host, None) in self._allowed and port in _PORTS_WITHOUT_ONE)

    # -- listening -------------------------------------------------------------------------------

    def start_unix(self, path: str) -> None:
        """Listen on a Unix socket at `path` (mode 0600; refused if `path` exists; any length)."""
        # Bound under a random name beside it, made 0600, then linked to `path`: the socket is
        # never reachable at `path` with looser permissions, and an existing file is not replaced.
        # All through the directory's descriptor: a run's path may be longer than a socket address holds.
        directory, name = os.path.split(os.path.abspath(path))
        staging = f".wb-proxy-{secrets.token_hex(6)}"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            listener.bind(f"/proc/self/fd/{fd}/{staging}")
            try:
                os.chmod(staging, 0o600, dir_fd=fd)
                os.link(staging, name, src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
            finally:
                os.unlink(staging, dir_fd=fd)
        except BaseException:
            listener.close()
            raise
        finally:
            os.close(fd)
        self._unix_paths.append(path)
        self._listen(listener)

    def start_tcp(self) -> str:
        """Listen on 127.0.0.1 at a free port; returns `http://127.0.0.1:PORT`."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        self._listen(listener)
        return f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        """Close the listeners and every open connection and tunnel; waits for the listeners' threads."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            open_sockets = list(self._open)
        os.close(self._wake_write)  # every listener's selector sees the pipe's end
        for thread in self._accepters:
            thread.join()
        os.close(self._wake_read)
        for listener in self._listeners:
            listener.close()
        for path in self._unix_paths:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        for sock in open_sockets:
            _shut(sock)

    def _listen(self, listener: socket.socket) -> None:
        with self._lock:
            if self._stopped:
                listener.close()
                raise RuntimeError("the proxy was stopped")
            listener.listen()
            self._listeners.append(listener)
            thread = threading.Thread(target=self._accept_loop, args=(listener,), name="wb-proxy-accept", daemon=True)
            self._accepters.append(thread)
        thread.start()

    def _accept_loop(self, listener: socket.socket) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(listener, selectors.EVENT_READ)
            selector.register(self._wake_read, selectors.EVENT_READ)
            while True:
                ready = [key.fileobj for key, _ in selector.select()]
                if self._wake_read in ready:
                    return
                try:
                    client, _ = listener.accept()
                except OSError:
                    continue
                if not self._admit(client):
                    threading.Thread(target=_turn_away, args=(client,), name="wb-proxy-busy", daemon=True).start()
                    continue
                threading.Thread(target=self._serve, args=(client,), name="wb-proxy-client", daemon=True).start()

    # -- bookkeeping of open sockets (stop() closes them all) -------------------------------------

    def _admit(self, client: socket.socket) -> bool:
        with self._lock:
            if self._stopped or self._clients >= limits.PROXY_CONNECTIONS_MAX:
                return False
            self._clients += 1
            self._open.add(client)
            return True

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            if self._stopped:
                sock.close()
                raise OSError("the proxy was stopped")
            self._open.add(sock)

    def _forget(self, sock: socket.socket, *, client: bool = False) -> None:
        with self._lock:
            self._open.discard(sock)
            if client:
                self._clients -= 1
        sock.close()

    # -- one client connection --------------------------------------------------------------------

    def _serve(self, client: socket.socket) -> None:
        try:
            client.settimeout(limits.PROXY_HEADER_WAIT_S)
            stream = _Stream(client)
            head = stream.read_head()
            method, target = _parse_request_line(head.first)
            client.settimeout(None)
            if method == "CONNECT":
                self._tunnel(stream, target)
            else:
                self._forward(stream, head, method, target)
        except _Answer as answer:
            _answer(client, answer)
            _linger(client)
        except (_Closed, OSError):
            pass
        finally:
            self._forget(client, client=True)

    def _check(self, host: str, port: int) -> None:
        if self.allows(host, port):
            return
        with contextlib.suppress(Exception):  # the owner's record of it must not break the answer
            self._on_refused(host)
        raise _Answer(403, "Forbidden", f"wb: network refused: {host} (not in this run's network list)")

    def _connect(self, host: str, port: int) -> socket.socket:
        try:
            upstream = socket.create_connection((host, port), timeout=limits.PROXY_CONNECT_TIMEOUT_S)
        except OSError as exc:
            raise _Answer(502, "Bad Gateway", f"cannot reach {host}:{port}: {exc.strerror or exc}") from None
        self._track(upstream)
        upstream.settimeout(None)
        return upstream

    def _tunnel(self, stream: _Stream, target: str) -> None:
        host, port = split_authority(target, None)
        if port is None:
            raise _bad(f"CONNECT needs HOST:PORT, not {target[:100]!r}")
        self._check(host, port)
        upstream = self._connect(host, port)
        try:
            stream.sock.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            if stream.buffer:
                upstream.sendall(stream.buffer)
            _pump_both_ways(stream.sock, upstream)
        finally:
            self._forget(upstream)

    def _forward(self, stream: _Stream, head: _Head, method: str, target: str) -> None:
        if target.startswith("/"):
            raise _bad("not a proxy request: send an absolute URL (http://host/path) or CONNECT")
        scheme, sep, remainder = target.partition("://")
        if not sep or scheme.lower() != "http":
            raise _bad(f"only http:// URLs are forwarded (use CONNECT for {scheme.lower()}://)")
        split = min((i for i in (remainder.find(c) for c in "/?#") if i >= 0), default=len(remainder))
        authority, path = remainder[:split], remainder[split:].partition("#")[0]
        if "@" in authority or not authority:
            raise _bad("the URL's host is missing or carries credentials")
        host, port = split_authority(authority, 80)
        assert port is not None
        body = _body_framing(head)
        self._check(host, port)
        upstream = self._connect(host, port)
        try:
            origin_form = path if path.startswith("/") else f"/{path}"
            headers = [(k, v) for k, v in _kept_headers(head) if k.lower() not in ("host", "expect")]
            headers = [("Host", authority), *headers, ("Connection", "close")]
            upstream.sendall(_encode_head(f"{method} {origin_form} {head.first.rsplit(' ', 1)[1]}", headers))
            if any(value.lower() == "100-continue" for value in head.values("expect")):
                stream.sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")  # it waits for this before its body
            _copy_body(stream, upstream, body)
            self._relay_response(_Stream(upstream, status_if_bad=502), stream.sock)
        finally:
            self._forget(upstream)

    def _relay_response(self, upstream: _Stream, client: socket.socket) -> None:
        while True:
            head = upstream.read_head()
            status = head.first.split(" ", 2)
            if len(status) < 2 or not status[0].startswith("HTTP/1.") or not status[1].isdigit():
                raise _Answer(502, "Bad Gateway", "the upstream answered badly: not an HTTP/1 status line")
            interim = status[1].startswith("1") and status[1] != "101"
            headers = _kept_headers(head) + ([] if interim else [("Connection", "close")])
            client.sendall(_encode_head(head.first, headers))
            if not interim:
                break
        if upstream.buffer:
            client.sendall(upstream.buffer)
        # Connection: close upstream, so the response ends where the upstream closes.
        while chunk := upstream.sock.recv(limits.PROXY_READ_CHUNK_BYTES):
            client.sendall(chunk)


_NO_BODY = -1
_CHUNKED = -2


def _body_framing(head: _Head) -> int:
    """The request body's length, `_CHUNKED`, or `_NO_BODY`; 400 for framing a proxy cannot trust."""
    encodings = [token.strip().lower() for value in head.values("transfer-encoding") for token in value.split(",")]
    lengths = {value.strip() for value in head.values("content-length")}
    if encodings and lengths:
        raise _bad("both Transfer-Encoding and Content-Length")
    if encodings:
        if encodings != ["chunked"]:
            raise _bad(f"unsupported Transfer-Encoding {', '.join(encodings)[:100]!r}")
        return _CHUNKED
    if not lengths:
        return _NO_BODY
    if len(lengths) > 1 or not all(value.isascii() and value.isdigit() for value in lengths):
        raise _bad("not one Content-Length")
    return int(lengths.pop())


def _copy_body(stream: _Stream, upstream: socket.socket, framing: int) -> None:
    if framing >= 0:
        for piece in stream.read_exactly(framing):
            upstream.sendall(piece)
        return
    if framing == _NO_BODY:
        return
    while True:  # chunked, passed on with its framing
        line = stream.read_line()
        size_text = line.split(b";", 1)[0].strip()
        if not size_text or not all(c in b"0123456789abcdefABCDEF" for c in size_text):
            raise _bad("not a chunk-size line")
        upstream.sendall(line)
        size = int(size_text, 16)
        if size == 0:
            while (trailer := stream.read_line()) != b"\r\n":
                upstream.sendall(trailer)
            upstream.sendall(b"\r\n")
            return
        for piece in stream.read_exactly(size + 2):
            upstream.sendall(piece)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _pump_both_ways(client: socket.socket, upstream: socket.socket) -> None:
    """Copy bytes both ways until both sides have finished; a broken side ends both."""
    other = threading.Thread(target=_pump, args=(client, upstream), name="wb-proxy-tunnel", daemon=True)
    other.start()
    _pump(upstream, client)
    other.join()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while chunk := source.recv(limits.PROXY_READ_CHUNK_BYTES):
            sink.sendall(chunk)
    except OSError:
        _shut(source)  # a reset or a stop: the other direction must not wait on a dead tunnel
        _shut(sink)
        return
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)
