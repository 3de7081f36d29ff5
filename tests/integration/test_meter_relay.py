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
from courier.runs.meter import LimitRefusal, Meter, ResponseUsage, new_placeholder

pytestmark = pytest.mark.courier_independent(cold=True)  # the metering relay in this process: no wb command

SECRET = "sk-relay-test-0123456789"
PLACEHOLDER = new_placeholder()


def _relay(server: ModelServer, on_response: Any, on_limit: Any = None) -> Meter:
    return Meter(server.base_url, "responses", on_response, on_limit, placeholder=PLACEHOLDER, credential=SECRET)


def _post(url: str, body: dict[str, Any], token: str | None = PLACEHOLDER) -> tuple[int, bytes]:
    headers = {"content-type": "application/json"}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    request = urllib.request.Request(f"{url}/responses", data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_the_relay_counts_each_response_and_answers_nothing_once_closed() -> None:
    seen: list[ResponseUsage | None] = []
    with ModelServer("endless") as server:
        meter = _relay(server, lambda usage, response_id: seen.append(usage))
        url = meter.start()
        try:
            assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
            status, data = _post(url, {"model": "m", "input": [], "stream": True})
            assert status == 200 and b"response.completed" in data  # the stream passes through whole
            assert seen == [ResponseUsage(300, 100)]
            forwarded = server.requests[-1]
            assert forwarded.headers["authorization"] == f"Bearer {SECRET}"  # the placeholder replaced, outside

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
        meter = _relay(server, lambda usage, response_id: None, limits.append)
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


@pytest.mark.parametrize(
    "token",
    [None, SECRET, new_placeholder(), PLACEHOLDER[:-1] + ("0" if PLACEHOLDER[-1] != "0" else "1")],
    ids=["no credential", "the real credential", "another run's placeholder", "a near miss"],
)
def test_a_request_without_the_runs_placeholder_is_refused_403_and_reaches_no_provider(token: str | None) -> None:
    seen: list[ResponseUsage | None] = []
    with ModelServer("endless") as server:
        meter = _relay(server, lambda usage, response_id: seen.append(usage))
        url = meter.start()
        try:
            for _ in range(12):
                status, data = _post(url, {"model": "m", "input": [], "stream": True}, token=token)
                assert status == 403 and b"placeholder" in data
            assert server.requests == [] and seen == []  # not forwarded, not counted
            assert meter.refused_foreign == 12
        finally:
            meter.stop()


def test_the_placeholder_is_replaced_wherever_the_harness_puts_it() -> None:
    """x-api-key (Claude Code), x-goog-api-key or Gemini's key= query: the provider sees the credential only."""
    with ModelServer("endless") as server:
        meter = _relay(server, lambda usage, response_id: None)
        url = meter.start()
        try:
            for headers, query in (({"x-api-key": PLACEHOLDER}, ""), ({"x-goog-api-key": PLACEHOLDER}, ""),
                                   ({}, f"?alt=sse&key={PLACEHOLDER}")):  # fmt: skip
                request = urllib.request.Request(
                    f"{url}/responses{query}", data=b'{"model": "m", "input": []}', method="POST",
                    headers={"content-type": "application/json", **headers},
                )  # fmt: skip
                with urllib.request.urlopen(request, timeout=30) as answer:
                    assert answer.status == 200
                forwarded = server.requests[-1]
                assert PLACEHOLDER not in forwarded.path and PLACEHOLDER not in str(dict(forwarded.headers))
                for name in headers:
                    assert forwarded.headers[name] == SECRET
                if query:
                    assert forwarded.path.endswith(f"key={SECRET}")
        finally:
            meter.stop()


def test_a_model_response_without_usage_is_reported_as_such() -> None:
    seen: list[tuple[ResponseUsage | None, str | None]] = []
    with ModelServer("endless-unmetered") as server:
        meter = _relay(server, lambda usage, response_id: seen.append((usage, response_id)))
        url = meter.start()
        try:
            status, data = _post(url, {"model": "m", "input": [], "stream": True})
            assert status == 200 and b"response.completed" in data
            [(usage, response_id)] = seen
            assert usage is None and response_id
        finally:
            meter.stop()
