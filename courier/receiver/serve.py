"""The receiver of `wb --wb-internal-agent-remote` (docs/protocol.md#the-receivers-rules): stdin → validate → operation
→ stdout.

Exactly one document is written and the exit status is 0 whatever happened. The hot path
of every remote call: protocol, the store and one operation, nothing heavier.
"""

from __future__ import annotations

import json
import os
import select
from collections.abc import Callable
from typing import TYPE_CHECKING

from courier import __version__, no_plugins
from courier.stage_trace import mark
from protocol import limits

if TYPE_CHECKING:
    from courier.config import Config
    from courier.executor import Executor
    from protocol.models import RemoteResponse

_READ_CHUNK = limits.READ_CHUNK_BYTES
_OPERATION_ECHO_MAX = 64


def _import_models() -> None:
    """Define the receiver's pydantic models without pydantic's plugin machinery (courier/no_plugins.py).

    The receiver is its own process, so the no-plugin loader holds for its whole life (a
    dispatched owner is a new interpreter and is not affected).
    """
    no_plugins.install()
    import courier.runs.store  # noqa: F401
    import protocol.models
    import protocol.validate  # noqa: F401


def read_request(fd: int) -> tuple[bytes, bool]:
    """At most REQUEST_MAX_BYTES of fd; beyond that, drain to EOF and report the overflow."""
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = os.read(fd, _READ_CHUNK)
        if not chunk:
            return b"".join(chunks), False
        size += len(chunk)
        if size > limits.REQUEST_MAX_BYTES:
            break
        chunks.append(chunk)
    chunks.clear()
    while os.read(fd, _READ_CHUNK):
        pass
    return b"", True


def _refusal(message: str, operation: str = "") -> RemoteResponse:
    from courier.executor.perform import now_rfc3339
    from protocol.models import RemoteResponse

    return RemoteResponse(
        schema_version=limits.SCHEMA_VERSION,
        operation=operation,
        # Whatever the message quotes, the reply must stay encodable UTF-8.
        failure=message.encode("utf-8", "backslashreplace").decode(),
        failure_kind="request",
        now=now_rfc3339(),
        wb_version=__version__,
    )


def _operation_of(data: bytes) -> str:
    """The request's operation when it can be parsed at all, for the echo; else ""."""
    try:
        document = json.loads(data)
    except (ValueError, RecursionError):
        return ""
    operation = document.get("operation") if isinstance(document, dict) else None
    if isinstance(operation, str) and len(operation) <= _OPERATION_ECHO_MAX and operation.isprintable():
        return operation
    return ""


def _head_executor() -> tuple[Executor, Config | None] | None:
    """The executor of a machine whose wb.yaml names one (a cluster's head) and the configuration it read,
    prepared before the request is read (`Executor.prepare`: a Ray head joins its cluster meanwhile); None
    for a machine's own store, and when it cannot be had now (the request's answer then says why)."""
    from courier.runs.context import configured_settings

    try:
        settings = configured_settings()
        if settings is None or settings.executor is None:
            return None
        from courier.executor.perform import executor_for
        from courier.runs.context import Context

        context = Context()
        executor = executor_for(context)
        executor.prepare()
    except Exception:  # e.g. a broken wb.yaml or a missing extra: `perform` refuses the request in band
        return None
    return executor, context.config


def answer(
    data: bytes,
    oversize: bool,
    client_gone: Callable[[], bool],
    *,
    fresh_login: bool = True,
    head: tuple[Executor, Config | None] | None = None,
) -> RemoteResponse:
    """The one reply to one request's bytes; every refusal is in-band. `fresh_login`: false in a serve
    session, whose environment is its login's (see `Context`). `head`: an executor prepared already, and
    the configuration it read."""
    if oversize:
        return _refusal(f"request exceeds {limits.REQUEST_MAX_BYTES} bytes")
    from courier.executor.perform import perform  # its registry installs the wire table decode_request reads
    from protocol.validate import RequestRefused, decode_request

    try:
        request = decode_request(data)
    except RequestRefused as exc:
        return _refusal(str(exc), _operation_of(data))
    executor, config = head or (None, None)
    return perform(request, client_gone=client_gone, fresh_login=fresh_login, executor=executor, config=config)


def _home_id(*, create: bool = True) -> str | None:
    try:
        from courier.runs.context import configured_home
        from courier.runs.store import Store, home_id, kept_home_id

        store = Store(configured_home())
        return home_id(store) if create else kept_home_id(store)
    except Exception:  # an unusable home is reported as null, never as a crash
        return None


def _now() -> str:
    from protocol.timestamps import rfc3339, utc_now  # the one RFC 3339 rule, even for the last-resort reply

    return rfc3339(utc_now())


def client_watch(reply_fd: int) -> Callable[[], bool]:
    """True once the session's stdout is gone (reader closed) or the parent sshd session died."""
    parent = os.getppid()
    poller = select.poll()
    poller.register(reply_fd, 0)  # POLLERR/POLLHUP/POLLNVAL are always reported

    def gone() -> bool:
        if os.getppid() != parent:
            return True
        return any(events & (select.POLLERR | select.POLLHUP | select.POLLNVAL) for _, events in poller.poll(0))

    return gone


def _detach_stdio() -> int:
    """Keep a private copy of the session's stdout and point fds 0-2 at /dev/null.

    A detached owner started by dispatch then never inherits the session's pipes, so the
    SSH session ends when this process writes its reply and exits.
    """
    reply_fd = os.dup(1)
    os.set_inheritable(reply_fd, False)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    if null > 2:
        os.close(null)
    return reply_fd


def internal_failure(exc: BaseException) -> bytes:
    """The last-resort reply document when building the real one failed: still one document, in band."""
    return (
        json.dumps(
            {
                "schema_version": limits.SCHEMA_VERSION,
                "operation": "",
                "failure": f"internal: {type(exc).__name__}: {str(exc)[:512]}",
                "failure_kind": "failed",
                "wb_version": __version__,
                "now": _now(),
                "home_id": None,
            },
            ensure_ascii=True,
        ).encode()
        + b"\n"
    )


def serve(argv: list[str]) -> int:
    """Answer one request from stdin on stdout; always exactly one document and exit 0."""
    del argv  # the receiver takes no options: everything travels in the request
    _import_models()
    mark("receiver.imported")  # docs/benchmarks.md#dispatch-latency
    try:
        request_fd = os.dup(0)  # not inheritable: a private copy
    except OSError:
        request_fd = -1  # read below, and refused with the reason
    reply_fd = _detach_stdio()  # before anything is started: nothing may hold the session's pipes
    head = _head_executor()
    try:
        data, oversize = read_request(request_fd)
        read_error = ""
        mark("receiver.read")
    except OSError as exc:
        data, oversize = b"", False
        read_error = f"cannot read the request: {exc.strerror or exc}"
    finally:
        if request_fd >= 0:
            os.close(request_fd)
    try:
        gone = client_watch(reply_fd)
        response = _refusal(read_error) if read_error else answer(data, oversize, gone, head=head)
        # Empty input asked nothing (a caller that started this receiver early and never used it,
        # courier/channels/exec_early.py): its refusal creates no home on a machine that has none.
        response.home_id = _home_id(create=bool(data) or oversize)
        body = response.encode()
    except Exception as exc:  # the contract wants one document, never a traceback
        body = internal_failure(exc)
    try:
        from courier.runs.store import write_all  # already loaded by _import_models

        write_all(reply_fd, body)
        mark("receiver.replied")
    except OSError:
        pass  # the caller is gone; nobody is left to tell
    finally:
        os.close(reply_fd)
    return 0
