"""The owner's metering relay (courier/runs/meter.py) between a client and a scripted provider (docs/cli.md#budgets,
docs/cli.md#waiting-out-a-usage-limit)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from courier.demo.model_server import ModelServer
from courier.runs.meter import LimitRefusal, Meter, ResponseUsage

pytestmark = pytest.mark.courier_independent(cold=True)  # the metering relay in this process: no wb command

SECRET = "sk-relay-test-0123456789"


def _post(url: str, body: dict[str, Any]) -> tuple[int, bytes]:
    request = urllib.request.Request(
        f"{url}/responses",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "authorization": f"Bearer {SECRET}"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_the_relay_counts_each_response_and_answers_nothing_once_closed() -> None:
    seen: list[ResponseUsage] = []
    with ModelServer("endless") as server:
        meter = Meter(server.base_url, "responses", seen.append)
        url = meter.start()
        try:
            assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
            status, data = _post(url, {"model": "m", "input": [], "stream": True})
            assert status == 200 and b"response.completed" in data  # the stream passes through whole
            assert seen == [ResponseUsage(300, 100)]
            forwarded = server.requests[-1]
            assert forwarded.headers["authorization"] == f"Bearer {SECRET}"  # the worker's own header, as sent

            meter.close()
            status, data = _post(url, {"model": "m", "input": [], "stream": True})
            assert status == 503 and b"budget" in data
            assert len(server.requests) == 1  # refused here, never forwarded
        finally:
            meter.stop()


def test_a_429_is_reported_with_its_retry_after_and_later_requests_wait_for_reopen() -> None:
    limits: list[LimitRefusal] = []
    with ModelServer("endless") as server:
        server.limit_at(0, 1, "3")
        meter = Meter(server.base_url, "responses", lambda usage: None, limits.append)
        url = meter.start()
        try:
            before = time.time()
            status, data = _post(url, {"model": "m", "input": [], "stream": True})
            assert status == 429 and b"Rate limit reached" in data
            [limit] = limits
            assert limit.status == 429 and limit.reset_at is not None
            assert before + 2.5 <= limit.reset_at <= time.time() + 3.5
            assert "Rate limit reached" in limit.message

            meter.pause()
            assert _post(url, {"model": "m", "input": []})[0] == 503
            assert len(server.requests) == 1
            meter.reopen()
            assert _post(url, {"model": "m", "input": [], "stream": True})[0] == 200
        finally:
            meter.stop()
