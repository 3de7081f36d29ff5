"""A machine that never got a slot before the shared deadline is reported as not attempted
(docs/cli.md, wb agent list)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from courier.client.fleet import _ask_all
from courier.config import Config, Target


def test_machines_reached_after_the_deadline_are_not_attempted(tmp_path: Path) -> None:
    config = Config(path=tmp_path / "wb.yaml", home=tmp_path / "home", projects_root=tmp_path / "projects")
    config.targets = {f"m{i}": Target(host=f"127.0.0.{i + 2}", port=9) for i in range(3)}
    answers = asyncio.run(_ask_all(config, sorted(config.targets), "list", time.monotonic() - 1))
    assert sorted(answers) == ["m0", "m1", "m2"]
    for answer in answers.values():
        assert answer.response is None and getattr(answer.error, "cause", "") == "not attempted"
        assert "not attempted before the deadline" in str(answer.error)
