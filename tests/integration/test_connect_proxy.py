"""The owner's HTTP(S) proxy for `network: [HOST[:PORT], ...]` (courier/runs/connect_proxy.py), over real sockets.

The allowed target is a real local HTTP server reached by the name `localhost`; `127.0.0.1` (the same
server, by another name) stands for a host that is not on the list.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import stat
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from courier.runs.connect_proxy import ConnectProxy

pytestmark = pytest.mark.courier_independent  # in-process proxy, curl and http.client: no wb command


@dataclass
class Target:
    port: int
    release: threading.Event = field(default_factory=threading.Event)


def _handler(target: Target) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # quiet in tests
            pass

        def _record(self, body: bytes) -> dict[str, object]:
            return {"method": self.command, "path": self.path, "headers": dict(self.headers), "body": body.decode()}

        def do_GET(self) -> None:
            if self.path == "/stream":
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"first\n")
                self.wfile.flush()
                target.release.wait(30)  # the rest only once the client has read the first part
                self.wfile.write(b"second\n")
                return
            self._reply(self._record(b""))

        def do_POST(self) -> None:
            if self.headers.get("Transfer-Encoding") == "chunked":
                body = b""
                while size := int(self.rfile.readline().split(b";")[0], 16):
                    body += self.rfile.read(size)
                    self.rfile.readline()
                self.rfile.readline()
            else:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self._reply(self._record(body))

        def _reply(self, seen: dict[str, object]) -> None:
            payload = json.dumps(seen).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.send_header("Keep-Alive", "timeout=5")
            self.end_headers()
            self.wfile.write(payload)

    return Handler


@pytest.fixture
def target() -> Iterator[Target]:
    target = Target(0)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(target))
    target.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield target
    target.release.set()
    server.shutdown()
    server.server_close()


@dataclass
class Running:
    proxy: ConnectProxy
    url: str
    port: int
    refused: list[str]


@pytest.fixture
def proxy(target: Target) -> Iterator[Running]:
    refused: list[str] = []
    running = ConnectProxy([f"localhost:{target.port}"], refused.append)
    url = running.start_tcp()
    yield Running(running, url, int(url.rsplit(":", 1)[1]), refused)
    running.stop()


def _raw(port: int, request: bytes) -> bytes:
    """Send `request` to the proxy as it is and read its whole answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


def _curl(proxy: Running, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    return subprocess.run(
        ["curl", "-sS", "--max-time", "30", "--noproxy", "", "-x", proxy.url, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_connect_tunnels_to_an_allowed_host(proxy: Running, target: Target) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
    conn.set_tunnel("localhost", target.port)
    conn.request("GET", "/through-the-tunnel")
    answer = conn.getresponse()
    assert answer.status == 200
    assert json.loads(answer.read())["path"] == "/through-the-tunnel"
    conn.close()
    assert proxy.refused == []


def test_curl_reaches_an_allowed_host_with_connect_and_with_a_plain_get(proxy: Running, target: Target) -> None:
    tunnelled = _curl(proxy, "--proxytunnel", f"http://localhost:{target.port}/tunnel")
    assert tunnelled.returncode == 0, tunnelled.stderr
    assert json.loads(tunnelled.stdout)["path"] == "/tunnel"
    plain = _curl(proxy, f"http://LocalHost:{target.port}/plain?q=1")  # the host compares case-insensitively
    assert plain.returncode == 0, plain.stderr
    assert json.loads(plain.stdout)["path"] == "/plain?q=1"


def test_a_plain_get_goes_on_in_origin_form_without_hop_by_hop_headers(proxy: Running, target: Target) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
    headers = {
        "Proxy-Connection": "keep-alive",
        "Proxy-Authorization": "Basic c2VjcmV0",
        "Connection": "keep-alive, X-Private",
        "X-Private": "hop",
        "X-Kept": "end-to-end",
    }
    conn.request("GET", f"http://localhost:{target.port}/a/b?c=d#fragment", headers=headers)
    answer = conn.getresponse()
    body = json.loads(answer.read())
    assert answer.status == 200
    assert body["path"] == "/a/b?c=d"
    sent = {k.lower(): v for k, v in body["headers"].items()}
    assert sent["x-kept"] == "end-to-end"
    assert sent["host"] == f"localhost:{target.port}"
    assert sent["connection"] == "close"
    assert not {"proxy-connection", "proxy-authorization", "x-private"} & set(sent)
    assert answer.getheader("Keep-Alive") is None and answer.getheader("Connection") == "close"


def test_request_bodies_go_on_with_a_length_or_chunked(proxy: Running, target: Target) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
    conn.request("POST", f"http://localhost:{target.port}/sized", body=b"x" * 100_000)
    assert json.loads(conn.getresponse().read())["body"] == "x" * 100_000
    conn.close()
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
    conn.request("POST", f"http://localhost:{target.port}/chunked", body=iter([b"one,", b"two"]), encode_chunked=True)
    assert json.loads(conn.getresponse().read())["body"] == "one,two"
    sent = _curl(proxy, "-H", "Expect: 100-continue", "--data-binary", "@-", f"http://localhost:{target.port}/curl")
    assert sent.returncode == 0, sent.stderr


def test_a_response_is_streamed_not_buffered(proxy: Running, target: Target) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
    conn.request("GET", f"http://localhost:{target.port}/stream")
    answer = conn.getresponse()
    assert answer.readline() == b"first\n"  # arrives while the server still holds the rest
    target.release.set()
    assert answer.read() == b"second\n"


def test_a_host_not_on_the_list_gets_403_and_is_never_resolved_or_reached(proxy: Running) -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        refused = _raw(proxy.port, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        plain = _raw(proxy.port, f"GET http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        listening.setblocking(False)
        with pytest.raises(BlockingIOError):
            listening.accept()  # the proxy never connected
    for answer in (refused, plain):
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 403 ")
        assert body == b"wb: network refused: 127.0.0.1 (not in this run's network list)\n"
    # A name that does not resolve is refused as well, not reported unreachable: it was never looked up.
    unresolvable = _raw(proxy.port, b"CONNECT nowhere.invalid:443 HTTP/1.1\r\n\r\n")
    assert unresolvable.startswith(b"HTTP/1.1 403 ")
    assert proxy.refused == ["127.0.0.1", "127.0.0.1", "nowhere.invalid"]


def test_an_entry_without_a_port_allows_443_and_80_only(target: Target) -> None:
    refused: list[str] = []
    bare = ConnectProxy(["LocalHost", "example.org:8443", "[::1]", "10.0.0.1."], refused.append)
    assert bare.allows("localhost", 443) and bare.allows("localhost", 80)
    assert not bare.allows("localhost", 8080) and not bare.allows("www.localhost", 443)
    assert bare.allows("example.org", 8443) and not bare.allows("example.org", 443)
    assert bare.allows("::1", 80) and bare.allows("10.0.0.1", 443)
    url = bare.start_tcp()
    try:
        answer = _raw(int(url.rsplit(":", 1)[1]), f"CONNECT localhost:{target.port} HTTP/1.1\r\n\r\n".encode())
    finally:
        bare.stop()
    assert answer.startswith(b"HTTP/1.1 403 ") and refused == ["localhost"]
    with pytest.raises(ValueError, match="network entry"):
        ConnectProxy(["bad host"], refused.append)


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"garbage\r\n\r\n",
        b"CONNECT localhost HTTP/1.1\r\n\r\n",  # no port
        b"CONNECT localhost:99999 HTTP/1.1\r\n\r\n",
        b"CONNECT bad_host!:443 HTTP/1.1\r\n\r\n",
        b"GET /origin-form HTTP/1.1\r\nHost: localhost\r\n\r\n",
        b"GET https://localhost/ HTTP/1.1\r\n\r\n",
        b"GET http://user@localhost/ HTTP/1.1\r\n\r\n",
        b"GET http://localhost/ HTTP/2.0\r\n\r\n",
        b"GET http://localhost/ HTTP/1.1\r\nno colon here\r\n\r\n",
        b"POST http://localhost/ HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"POST http://localhost/ HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    ],
)
def test_a_malformed_request_gets_400_with_one_line(proxy: Running, request_bytes: bytes) -> None:
    head, _, body = _raw(proxy.port, request_bytes).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), head
    assert body.count(b"\n") == 1 and body.endswith(b"\n")
    assert proxy.refused == []


def test_a_header_block_past_the_bound_gets_431(proxy: Running) -> None:
    huge = b"GET http://localhost/ HTTP/1.1\r\n" + b"X-Big: " + b"a" * (70 * 1024) + b"\r\n\r\n"
    assert _raw(proxy.port, huge).startswith(b"HTTP/1.1 431 ")
    many = b"GET http://localhost/ HTTP/1.1\r\n" + b"X: y\r\n" * 101 + b"\r\n"
    assert _raw(proxy.port, many).startswith(b"HTTP/1.1 431 ")


def test_an_allowed_host_that_is_not_listening_gets_502() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]  # bound, never listening: connecting is refused
        closed = ConnectProxy([f"localhost:{port}"], lambda host: None)
        url = closed.start_tcp()
        try:
            answer = _raw(int(url.rsplit(":", 1)[1]), f"CONNECT localhost:{port} HTTP/1.1\r\n\r\n".encode())
        finally:
            closed.stop()
    assert answer.startswith(b"HTTP/1.1 502 ")


def _echo_server() -> tuple[socket.socket, list[socket.socket], threading.Event]:
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen()
    accepted: list[socket.socket] = []
    ready = threading.Event()

    def serve() -> None:
        conn, _ = listening.accept()
        accepted.append(conn)
        ready.set()
        while data := conn.recv(65536):
            conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    return listening, accepted, ready


def test_stop_closes_every_open_tunnel() -> None:
    listening, accepted, ready = _echo_server()
    port = listening.getsockname()[1]
    tunnels = ConnectProxy([f"localhost:{port}"], lambda host: None)
    url = tunnels.start_tcp()
    proxy_port = int(url.rsplit(":", 1)[1])
    client = socket.create_connection(("127.0.0.1", proxy_port), timeout=30)
    try:
        client.sendall(f"CONNECT localhost:{port} HTTP/1.1\r\n\r\n".encode())
        assert client.recv(1024) == b"HTTP/1.1 200 Connection established\r\n\r\n"
        client.sendall(b"ping")
        assert client.recv(1024) == b"ping"
        assert ready.wait(30)
        accepted[0].settimeout(30)
        tunnels.stop()
        assert client.recv(1024) == b""  # the tunnel is closed on the worker's side
        assert accepted[0].recv(1024) == b""  # and on the far side
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", proxy_port), timeout=30).recv(1)
    finally:
        client.close()
        listening.close()
        for conn in accepted:
            conn.close()


@contextlib.contextmanager
def _directory(path: Path) -> Iterator[int]:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield fd
    finally:
        os.close(fd)


def test_the_unix_listener_is_0600_and_tunnels(tmp_path: Path, target: Target) -> None:
    refused: list[str] = []
    unix = ConnectProxy([f"localhost:{target.port}"], refused.append)
    deep = tmp_path / ("d" * 60) / ("e" * 60)  # longer than a socket address holds (108 bytes)
    deep.mkdir(parents=True)
    path = deep / "proxy.sock"
    assert len(str(path)) > 108
    unix.start_unix(str(path))
    try:
        assert stat.S_ISSOCK(path.stat().st_mode) and stat.S_IMODE(path.stat().st_mode) == 0o600
        assert [p.name for p in deep.iterdir()] == ["proxy.sock"]
        with socket.socket(socket.AF_UNIX) as sock, _directory(deep) as fd:
            sock.settimeout(30)
            sock.connect(f"/proc/self/fd/{fd}/proxy.sock")
            sock.sendall(
                f"CONNECT localhost:{target.port} HTTP/1.1\r\n\r\n"
                f"GET /over-unix HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode()
            )
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 200 Connection established\r\n\r\nHTTP/1.0 200 ")
        assert json.loads(answer.rpartition(b"\r\n\r\n")[2])["path"] == "/over-unix"
        other = ConnectProxy([], refused.append)
        with pytest.raises(FileExistsError):
            other.start_unix(str(path))
        other.stop()
    finally:
        unix.stop()
    assert not path.exists()


def test_past_the_bound_of_open_connections_the_next_gets_503(proxy: Running) -> None:
    from protocol import limits

    bound = limits.PROXY_CONNECTIONS_MAX
    held = [socket.create_connection(("127.0.0.1", proxy.port), timeout=30) for _ in range(bound)]
    try:
        # Accepted in order: the first ones hold every place, each waiting for its header block.
        assert _raw(proxy.port, b"CONNECT localhost:1 HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 503 ")
    finally:
        for sock in held:
            sock.close()
