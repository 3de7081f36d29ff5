"""The gate in front of every path (docs/ui.md, "Security").

The token is a credential: it is minted per server, printed once in the address, never
logged. Browsers send a host's cookies to every port of that host (and SameSite counts every
port of 127.0.0.1 as one site), so a cookie alone would reach any other local user's server:
it cannot be the credential. The credential is instead the session root `/s/<key>/`, a path
prefix only this origin's pages hold (in their own links, forms and the live script's
requests, all rendered under it). The first request brings the token as `?token=`; the answer
redirects to the same address under the session root, without the token, and sets a cookie
(HttpOnly, SameSite=Strict, Path= the session root, so the browser sends it to no other path)
as a second factor. Every other request needs both, the root and the cookie: without them,
403 and no data, on every path, static files included. A request that changes something (any
method but GET and HEAD) must also come from the page itself: its Origin must be this
server's. A malformed request (a bad path encoding, a control character in the path) is
answered 400 with one line before anything else.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl, quote, unquote_to_bytes, urlencode

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

FORBIDDEN = b"forbidden: open the address wb ui printed (its ?token=...) in this browser\n"
CROSS_ORIGIN = b"forbidden: an action must come from this page (same origin)\n"
SESSION_PREFIX = "/s/"
_PATH_SAFE = "/:@!$&'()*+,;=-._~"  # what a path may hold unescaped (RFC 3986 pchar and "/")
_SAFE_METHODS = ("GET", "HEAD")
# Nothing but this server's own script and style; no inline script, no framing, forms only to itself.
POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = [
    (b"content-security-policy", POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),  # no-referrer would make a form's Origin "null"
    (b"cache-control", b"no-store"),
    (b"x-frame-options", b"DENY"),
]


def new_token() -> str:
    return secrets.token_urlsafe(32)


def cookie_name(port: int) -> str:
    return f"wb_ui_{port}"


def _cookies(scope: Scope) -> dict[str, str]:
    found: dict[str, str] = {}
    for name, value in scope.get("headers", []):
        if name == b"cookie":
            for part in value.decode("latin-1").split(";"):
                key, _, item = part.strip().partition("=")
                found.setdefault(key, item)
    return found


def _header(scope: Scope, wanted: bytes) -> str | None:
    for name, value in scope.get("headers", []):
        if name == wanted:
            return str(value.decode("latin-1"))
    return None


def malformed(scope: Scope) -> str | None:
    """Why the request's path cannot be taken (one line), or None: its encoding, a control character."""
    raw = scope.get("raw_path")
    try:
        path = unquote_to_bytes(raw).decode("utf-8") if raw else str(scope.get("path", "/"))
    except UnicodeDecodeError:
        return "error: the path is not UTF-8 once its %-escapes are decoded; ask for an address the page links to"
    if any(ord(char) < 0x20 or ord(char) == 0x7F for char in path):
        return "error: the path holds a control character (a line break, a tab, ...); no page has one"
    return None


class TokenGate:
    """ASGI middleware: the session root and its cookie on every request, the same origin on every action.

    The app behind it sees the session root as the ASGI `root_path` (where it is mounted), so
    Starlette's routes match the rest of the path and the pages render their links under it.
    """

    def __init__(self, app: App, token: str, port: int) -> None:
        self.app = app
        self.token = token
        self.cookie = cookie_name(port)
        self.root = SESSION_PREFIX + secrets.token_urlsafe(32)  # the credential the page's links carry
        self.cookie_value = secrets.token_urlsafe(32)

    @staticmethod
    def _matches(given: str | None, wanted: str) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), wanted.encode())

    def _session_path(self, path: str) -> bool:
        """`path` is under the session root (compared in constant time: the root is a credential)."""
        head = path[: len(self.root)]
        return self._matches(head, self.root) and path[len(self.root) : len(self.root) + 1] in ("", "/")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        problem = malformed(scope)
        if problem is not None:
            await refuse(send, (problem + "\n").encode(), 400)
            return
        path = str(scope.get("path", "/"))
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        given = [value for key, value in query if key == "token"]
        if given:
            if len(given) == 1 and self._matches(given[0], self.token) and scope["method"] in _SAFE_METHODS:
                rest = urlencode([(key, value) for key, value in query if key != "token"])
                inside = path[len(self.root) :] if self._session_path(path) else path
                await self._redirect(send, self.root + quote(inside, safe=_PATH_SAFE) + (f"?{rest}" if rest else ""))
            else:
                await refuse(send, FORBIDDEN)
            return
        if not self._session_path(path) or not self._matches(_cookies(scope).get(self.cookie), self.cookie_value):
            await refuse(send, FORBIDDEN)
            return
        if scope["method"] not in _SAFE_METHODS and not _same_origin(scope):
            await refuse(send, CROSS_ORIGIN)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *HEADERS]
            await send(message)

        if path == self.root:  # the session root itself is the fleet page
            scope = {**scope, "path": path + "/", "raw_path": (path + "/").encode()}
        await self.app({**scope, "root_path": self.root}, receive, with_headers)

    async def _redirect(self, send: Send, location: str) -> None:
        cookie = f"{self.cookie}={self.cookie_value}; Path={self.root}/; HttpOnly; SameSite=Strict"
        headers = [(b"location", location.encode("ascii")), (b"set-cookie", cookie.encode()), *HEADERS]
        await send({"type": "http.response.start", "status": 303, "headers": headers})
        await send({"type": "http.response.body", "body": b""})


def _same_origin(scope: Scope) -> bool:
    """The browser's Origin names this very host and port (and Fetch Metadata, when sent, agrees)."""
    origin, host = _header(scope, b"origin"), _header(scope, b"host")
    site = _header(scope, b"sec-fetch-site")
    if site is not None and site != "same-origin":
        return False
    return bool(origin and host and origin == f"http://{host}")


async def refuse(send: Send, body: bytes, status: int = 403) -> None:
    """One line of plain text: a 403 (no credential, another origin) or a 400 (a malformed request)."""
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()), *HEADERS]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
