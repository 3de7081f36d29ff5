"""`wb ui` itself (docs/ui.md): bind, print the address with its token, serve until Ctrl-C.

The socket is bound here, before uvicorn starts, so a taken port is one `error:` line and a
free port (`--port 0`, the default) is known before the address is printed. uvicorn logs
nothing of its own (no access log: an address can hold the token); Ctrl-C ends the server
and the command exits 130.
"""

from __future__ import annotations

import ipaddress
import socket
import sys
from collections.abc import Callable

from courier.config import Config
from courier.errors import UsageError
from courier.ui.asks import Scope
from courier.ui.opener import open_in_browser, remove

# How long open pages' streams may hold up Ctrl-C.
GRACEFUL_SHUTDOWN_S = 1


def require_libraries() -> None:
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise UsageError(
            f"wb ui needs starlette and uvicorn ({exc.name} is missing): pip install 'starlette>=1.0' 'uvicorn>=0.30'"
        ) from None


def bind(address: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((address, port))
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {address}:{port}: {exc.strerror or exc}; pass another --port") from None
    sock.listen(socket.SOMAXCONN)
    sock.set_inheritable(True)
    return sock


def is_loopback(address: str) -> bool:
    """127.0.0.0/8 or ::1: only this machine can reach it, so no exposure warning (a name is not trusted)."""
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def address_of(address: str, port: int) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}"


def serve(
    config: Config,
    scope: Scope,
    *,
    port: int,
    bind_address: str,
    open_browser: bool,
    write: Callable[[str], None],
    warn: Callable[[str], None],
) -> None:
    """Serve until Ctrl-C (which reaches the caller as KeyboardInterrupt: exit 130)."""
    require_libraries()
    import uvicorn

    from courier.ui.app import build_app
    from courier.ui.auth import new_token

    if not 0 <= port <= 65535:
        raise UsageError(f"--port must be 0-65535, not {port}")
    sock = bind(bind_address, port)
    port = sock.getsockname()[1]
    token = new_token()
    if not is_loopback(bind_address):
        warn(f"wb ui listens on {bind_address}: anyone who can reach it and learns the token sees and stops your runs")
    url = f"{address_of(bind_address, port)}/?token={token}"
    write(f"wb ui: {url}\n")
    opened = open_in_browser(config.home, port, url) if open_browser else None
    app = build_app(config, scope, token, port)
    settings = uvicorn.Config(
        app,
        log_config=None,
        log_level="critical",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        server_header=False,
    )
    server = uvicorn.Server(settings)
    interrupted = False
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        interrupted = True
    finally:
        sock.close()
        remove(opened)
    sys.stdout.flush()
    if interrupted or server.should_exit:
        raise KeyboardInterrupt
