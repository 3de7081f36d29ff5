"""Store files read while their writer replaces them (docs/runs.md#the-store)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from courier.runs.store import open_private, write_private


def test_a_store_file_replaced_while_it_is_opened_is_read_not_refused(tmp_path: Path) -> None:
    # The owner rewrites run.json by rename: a reader that opened the old file sees it with no
    # link left (it was replaced, not linked from elsewhere), and must read it, not refuse it.
    path = tmp_path / "run.json"
    write_private(path, b'{"n": 0}')
    stop = threading.Event()

    def rewrite() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            write_private(path, b'{"n": %d}' % n)

    writer = threading.Thread(target=rewrite)
    writer.start()
    try:
        for _ in range(3000):
            fd, info = open_private(path)
            os.close(fd)
            assert info.st_nlink in (0, 1)
    finally:
        stop.set()
        writer.join()


def test_a_second_link_is_still_refused(tmp_path: Path) -> None:
    import pytest

    from courier.runs.store import UnsafeStoreFile

    path = tmp_path / "run.json"
    write_private(path, b"{}")
    os.link(path, tmp_path / "elsewhere")
    with pytest.raises(UnsafeStoreFile, match="has 2 hard links"):
        open_private(path)
