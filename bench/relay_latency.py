"""The metering relay's cost per streamed chunk (docs/benchmarks.md#metering-relay; docs/cli.md#budgets).

An in-suite streaming server (courier/demo/scripted_http.py's server, with a handler that writes
one Server-Sent Event at a time and flushes it) sends `CHUNKS` events a few milliseconds apart,
each carrying the time it was written (`time.perf_counter_ns`, one clock: everything runs in this
process). A client reads them line by line, directly from the server and through the installed
relay (`courier.runs.meter.Meter`, as the owner starts it), interleaved. Per chunk: the time from
the server's write to the client's read. The relay's added latency is the through-relay figure
less the direct one, at p50 and p99.

No buffering: the server writes the first event, then waits `HOLD_S` before the next; the first
event must reach the client through the relay within 2 ms of its write (it would wait for the
rest of the body if the relay buffered).

    python bench/relay_latency.py [--streams N] [--chunks N]

With WB_BENCH_TREE set to another checkout's tree (e.g. `git archive` of an older commit), that
tree's relay is measured instead, for a before/after figure (bench/common.py).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
if os.environ.get("WB_BENCH_TREE"):
    sys.path.insert(0, os.environ["WB_BENCH_TREE"])

from courier.demo.scripted_http import ScriptedHandler, ScriptedServer
from courier.runs import meter as meter_module

CHUNKS = 200
STREAMS = 20
GAP_S = 0.002  # between two events of a stream
HOLD_S = 0.2  # after the first event of a first-byte stream
WIRE_API = "responses"


class StreamingServer(ScriptedServer[None]):
    """`POST /v1/responses` answered with timestamped SSE events, written and flushed one by one."""

    scenarios = ("stream", "first-byte")
    api_root = "/v1"
    thread_name = "wb-bench-stream"

    def __init__(self, chunks: int) -> None:
        super().__init__("stream")
        self.chunks = chunks

    def handle(self, request: ScriptedHandler, body: Any) -> None:
        scenario, _ = request.route()
        request.send_response(200)
        request.send_header("content-type", "text/event-stream")
        request.send_header("connection", "close")
        request.end_headers()
        request.close_connection = True
        request.wfile.flush()
        count = 2 if scenario == "first-byte" else self.chunks
        for index in range(count):
            last = index == count - 1
            event: dict[str, Any] = {"type": "response.output_text.delta", "delta": "x" * 40}
            if last:
                usage = {"input_tokens": 300, "output_tokens": 100}
                event = {"type": "response.completed", "response": {"id": "resp_bench", "usage": usage}}
            event["sent_ns"] = time.perf_counter_ns()
            request.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            request.wfile.flush()
            time.sleep(HOLD_S if scenario == "first-byte" and index == 0 else GAP_S)


def _relay(upstream: str) -> tuple[Any, str, dict[str, str]]:
    """The installed relay in front of `upstream`: (its handle, its base URL, the headers a worker sends)."""
    counted: list[Any] = []
    new_placeholder = getattr(meter_module, "new_placeholder", None)
    if new_placeholder is None:  # a tree from before the placeholder (for a before/after figure)
        relay = meter_module.Meter(upstream, WIRE_API, counted.append)
        return relay, relay.start(), {"authorization": "Bearer sk-bench-credential"}
    placeholder = new_placeholder()
    relay = meter_module.Meter(
        upstream, WIRE_API, lambda usage, response_id: counted.append(usage),
        placeholder=placeholder, credential="sk-bench-credential",
    )  # fmt: skip
    return relay, relay.start(), {"authorization": f"Bearer {placeholder}"}


def _stream(base_url: str, headers: dict[str, str], scenario: str = "") -> list[tuple[int, int]]:
    """(sent_ns, received_ns) of each event of one streamed response."""
    parts = urlsplit(base_url)
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
    prefix = parts.path.rstrip("/")
    if scenario:  # the scenario goes before the API root: /first-byte/v1/responses
        prefix = f"/{scenario}{prefix}"
    body = json.dumps({"model": "m", "input": [], "stream": True})
    headers = {"content-type": "application/json", **headers}
    connection.request("POST", f"{prefix}/responses", body=body, headers=headers)
    response = connection.getresponse()
    seen: list[tuple[int, int]] = []
    while True:
        line = response.fp.readline()
        received = time.perf_counter_ns()
        if not line:
            break
        if line.startswith(b"data:"):
            seen.append((json.loads(line[5:])["sent_ns"], received))
    connection.close()
    return seen


def _first(events: list[tuple[int, int]]) -> float:
    sent, received = events[0]
    return (received - sent) / 1e6


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--streams", type=int, default=STREAMS)
    parser.add_argument("--chunks", type=int, default=CHUNKS)
    args = parser.parse_args(argv)
    with StreamingServer(args.chunks) as server:
        relay, relay_url, headers = _relay(server.base_url)
        try:
            direct: list[float] = []
            relayed: list[float] = []
            first_direct: list[float] = []
            first_relayed: list[float] = []
            for _ in range(args.streams):  # interleaved, so a loaded machine's noise falls on both
                direct += [(r - s) / 1e6 for s, r in _stream(server.base_url, headers)]
                relayed += [(r - s) / 1e6 for s, r in _stream(relay_url, headers)]
                first_direct.append(_first(_stream(server.base_url, headers, "first-byte")))
                first_relayed.append(_first(_stream(relay_url, headers, "first-byte")))
        finally:
            relay.stop()
    rows = [
        ("per chunk, direct", direct),
        ("per chunk, through the relay", relayed),
        ("first event, direct", first_direct),
        ("first event, through the relay", first_relayed),
    ]
    print(f"{'ms from the server write to the client read':<46} {'p50':>8} {'p99':>8} {'max':>8}  n")
    for label, values in rows:
        p50, p99 = statistics.median(values), _percentile(values, 0.99)
        print(f"{label:<46} {p50:8.3f} {p99:8.3f} {max(values):8.3f}  {len(values)}")
    added_p50 = statistics.median(relayed) - statistics.median(direct)
    added_p99 = _percentile(relayed, 0.99) - _percentile(direct, 0.99)
    first_p99 = _percentile(first_relayed, 0.99)
    print(
        f"relay's added latency per chunk: p50 {added_p50:.3f} ms, p99 {added_p99:+.3f} ms; through the relay, "
        f"write to read: p99 {_percentile(relayed, 0.99):.3f} ms (target: the relay adds <= 2 ms at p99)"
    )
    print(
        f"first event through the relay: p99 {first_p99:.3f} ms after its write, "
        f"the next event {HOLD_S * 1000:.0f} ms later (no buffering: target <= 2 ms)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
