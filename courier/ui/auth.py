"""The token gate in front of every path (docs/ui.md, "Security").

The token is a credential: it is minted per server, printed once in the address, never
logged. The first request brings it as `?token=`; the answer sets a cookie (HttpOnly,
SameSite=Strict, named after the port so two servers on one host do not overwrite each
other's) and redirects to the same address without it. Without token or cookie: 403 and no
data, on every path, static files included. A request that changes something (any method
but GET and HEAD) must also come from the page itself: its Origin must be this server's.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl, urlencode

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

FORBIDDEN = b"forbidden: open the address wb ui printed (its ?token=...) in this browser\n"
CROSS_ORIGIN = b"forbidden: an action must come from this page (same origin)\n"
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


class TokenGate:
    """ASGI middleware: the token or its cookie on every request, the same origin on every action."""

    def __init__(self, app: App, token: str, port: int) -> None:
        self.app = app
        self.token = token
        self.cookie = cookie_name(port)

    def _is_token(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.token.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        given = [value for key, value in query if key == "token"]
        if given:
            if len(given) == 1 and self._is_token(given[0]) and scope["method"] in _SAFE_METHODS:
                rest = urlencode([(key, value) for key, value in query if key != "token"])
                await self._redirect(send, scope.get("path", "/") + (f"?{rest}" if rest else ""))
            else:
                await _refuse(send, FORBIDDEN)
            return
        if not self._is_token(_cookies(scope).get(self.cookie)):
            await _refuse(send, FORBIDDEN)
            return
        if scope["method"] not in _SAFE_METHODS and not _same_origin(scope):
            await _refuse(send, CROSS_ORIGIN)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)

    async def _redirect(self, send: Send, location: str) -> None:
        cookie = f"{self.cookie}={self.token}; Path=/; HttpOnly; SameSite=Strict"
        headers = [(b"location", location.encode("latin-1")), (b"set-cookie", cookie.encode()), *HEADERS]
        await send({"type": "http.response.start", "status": 303, "headers": headers})
        await send({"type": "http.response.body", "body": b""})


def _same_origin(scope: Scope) -> bool:
    """The browser's Origin names this very host and port (and Fetch Metadata, when sent, agrees)."""
    origin, host = _header(scope, b"origin"), _header(scope, b"host")
    site = _header(scope, b"sec-fetch-site")
    if site is not None and site != "same-origin":
        return False
    return bool(origin and host and origin == f"http://{host}")


async def _refuse(send: Send, body: bytes) -> None:
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()), *HEADERS]
    await send({"type": "http.response.start", "status": 403, "headers": headers})
    await send({"type": "http.response.body", "body": body})
