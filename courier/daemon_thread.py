"""`await in_thread(work)`: blocking work on a thread of its own that ends with it.

Not `asyncio.to_thread`: its pool keeps idle threads for the life of the process, and it
holds up the interpreter's exit while a call to a silent machine is still pending. A server
that starts a call per open page (wb ui) must be back to its own threads once the pages close.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


async def in_thread(work: Callable[[], T], name: str = "wb call") -> T:
    """`work()` on a daemon thread; its value or its exception comes back to the awaiting task."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(value: T | None, error: BaseException | None) -> None:
        if done.done():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(value)  # type: ignore[arg-type]

    def run() -> None:
        try:
            value, error = work(), None
        except BaseException as exc:  # handed to the awaiting task, which shows it
            value, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody is waiting any more
            loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(target=run, daemon=True, name=name).start()
    return await done
