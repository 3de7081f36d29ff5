"""`wb mcp` driven by the official MCP SDK's own client over stdio, here and through a loopback sshd.

The client is the SDK's (mcp.client.stdio + ClientSession), talking to `wb mcp` run as a
subprocess; it validates every structured result against the tool's output schema itself.
We check the same documents against docs/schema/ as well.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import Machine, make_machine, prepare_remote, wait_for
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from tests_support import sample_record

from courier.mcp_server import available_tools, output_schema
from courier.runs.process import start_token
from courier.runs.store import Store
from tests import json_documents
from tests.integration.sshd import SshdFactory, SshdServer, free_port, sshd_unavailable_reason

ALL_TOOLS = {"dispatch", "status", "await", "list", "logs", "diff", "stop", "continue", "machines", "watch"}


@contextlib.asynccontextmanager
async def mcp_session(env: dict[str, str], cwd: Path) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "courier.main", "mcp"], env=env, cwd=str(cwd)
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def run_session(machine_env: dict[str, str], cwd: Path, body: Callable[[ClientSession], Awaitable[None]]) -> None:
    async def main() -> None:
        with anyio.fail_after(180):
            async with mcp_session(machine_env, cwd) as session:
                await body(session)

    anyio.run(main)


async def call_ok(session: ClientSession, tool: str, arguments: dict[str, Any], schema: str) -> dict[str, Any]:
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, result.content
    document = result.structured_content
    assert isinstance(document, dict)
    # An array document (machines) travels wrapped in an object under its name: MCP wants objects.
    json_documents.check(schema, document[schema] if schema == "machines" else document)
    # The text block carries the same document, for clients without structured content.
    assert json.loads(result.content[0].text) == document  # type: ignore[union-attr]
    return document


async def call_error(session: ClientSession, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    result = await session.call_tool(tool, arguments)
    assert result.is_error, result.structured_content
    # The error document is the text: structured content would be checked against the tool's output schema.
    assert result.structured_content is None and len(result.content) == 1
    document = json.loads(result.content[0].text)  # type: ignore[union-attr]
    json_documents.check("error", document)
    return document


# -- this machine -------------------------------------------------------------------------


def test_the_tools_are_listed_with_input_and_output_schemas(machine: Machine) -> None:
    async def body(session: ClientSession) -> None:
        listed = (await session.list_tools()).tools
        names = {tool.name for tool in listed}
        assert names == {tool.name for tool in available_tools()} == ALL_TOOLS
        for tool in listed:
            assert tool.description and tool.input_schema["type"] == "object"
            assert tool.output_schema is not None and tool.output_schema["type"] == "object", tool.name
        by_name = {tool.name: tool for tool in listed}
        assert by_name["dispatch"].output_schema == output_schema("result")
        assert by_name["list"].output_schema == output_schema("fleet")
        assert by_name["diff"].output_schema == output_schema("diff")
        assert by_name["continue"].output_schema == output_schema("result")
        assert set(by_name["dispatch"].input_schema["required"]) == {"task", "profile"}
        assert "all" in by_name["list"].input_schema["properties"]

    run_session(machine.env, machine.root, body)


def test_dispatch_await_status_list_logs_and_stop_here(machine: Machine) -> None:
    machine.clone()
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, total, message))

    async def body(session: ClientSession) -> None:
        started = await call_ok(
            session,
            "dispatch",
            {"task": "scenario:slow sleep:2", "profile": "fake", "new_worktree": "m1", "repo": "acme/widget"},
            "result",
        )
        ref = started["agent_id"]
        assert started["state"] == "running" and started["worktree"] == "m1"
        awaited = await session.call_tool("await", {"ref": ref}, progress_callback=on_progress)
        assert not awaited.is_error, awaited.content
        document = awaited.structured_content
        assert isinstance(document, dict)
        json_documents.check("result", document)
        assert document["state"] == "completed" and document["terminal"] is True
        assert document["result"] == "Finished slowly."
        status = await call_ok(session, "status", {"ref": ref}, "result")
        assert status["state"] == "completed" and status["agent_id"] == ref
        listed = await call_ok(session, "list", {}, "fleet")
        assert [r["agent_id"] for r in listed["results"]] == [ref]
        assert listed["machines"] == [
            {"machine": "", "ok": True, "runs": 1, "error": None, "elapsed_ms": listed["machines"][0]["elapsed_ms"]}
        ]
        logs = await call_ok(session, "logs", {"ref": ref, "tail": 3}, "logs")
        assert logs["agent_id"] == ref and logs["logs"].splitlines()[0].endswith("events.jsonl")
        short = ref[:10]  # a short reference (docs/cli.md#short-references): the documents name the whole ID
        assert (await call_ok(session, "status", {"ref": short}, "result"))["agent_id"] == ref
        assert (await call_ok(session, "logs", {"ref": short, "tail": 3}, "logs"))["agent_id"] == ref
        refused = await call_error(session, "stop", {"ref": ref})
        assert refused["class"] == "finding" and refused["exit_code"] == 1
        assert refused["message"] == f"agent run {ref} is already completed"

    run_session({**machine.env, "WB_MCP_PROGRESS_MS": "300"}, machine.root, body)
    assert progress, "await sent no progress while the run was going"
    assert all(total == 45 for _, total, _ in progress)  # seconds waited out of the bound (default 45s)
    assert "is running" in (progress[0][2] or "")
    assert [value for value, _, _ in progress] == sorted(value for value, _, _ in progress)


def test_watch_returns_the_events_within_its_wait_and_a_cursor_to_go_on_from(machine: Machine) -> None:
    machine.clone()
    first = machine.dispatch(task="scenario:wait-release", worktree="w1")
    second = machine.dispatch(task="scenario:wait-release", worktree="w2")

    def release(ref: str) -> None:
        home = machine.home / "agents" / ref / "harness-home"
        assert wait_for((home / "ready").exists, 60)
        (home / "release").write_text("go\n")

    async def body(session: ClientSession) -> None:
        opened = await call_ok(session, "watch", {}, "watch")
        assert {event["ref"] for event in opened["events"]} == {first, second} and opened["idle"] is False
        assert {event["event"] for event in opened["events"]} <= {"running", "queued"}
        cursor = opened["cursor"]
        finished: dict[str, dict[str, Any]] = {}
        for ref in (first, second):
            release(ref)
            while ref not in finished:  # each call answers soon after its first event
                answer = await call_ok(session, "watch", {"cursor": cursor, "wait_timeout": "20s"}, "watch")
                cursor = answer["cursor"]
                finished.update({e["ref"]: e for e in answer["events"] if e["event"] == "finished"})
        assert finished[first]["result"]["agent_id"] == first and finished[second]["state"] == "completed"
        last = await call_ok(session, "watch", {"cursor": cursor, "wait_timeout": "20s"}, "watch")
        assert last["events"] == [] and last["idle"] is True  # nothing live: it answers at once
        refused = await call_error(session, "watch", {"cursor": "not-a-cursor"})
        assert refused["class"] == "usage" and "cursor is not one a watch call returned" in refused["message"]

    run_session(machine.env, machine.root, body)


def test_diff_and_continue_here(machine: Machine) -> None:
    machine.clone()

    async def body(session: ClientSession) -> None:
        # A run still going is not continued (it waits for a file the test writes afterwards).
        waiting = {"task": "scenario:wait-release", "profile": "fake", "new_worktree": "d0", "repo": "acme/widget"}
        held = (await call_ok(session, "dispatch", waiting, "result"))["agent_id"]
        refused = await call_error(session, "continue", {"ref": held, "task": "scenario:complete file:second.txt"})
        assert refused["class"] == "finding" and "running" in refused["message"]
        home = machine.home / "agents" / held / "harness-home"
        assert wait_for((home / "ready").exists, 60)
        (home / "release").write_text("go\n")
        task = "scenario:complete file:first.txt"
        arguments = {"task": task, "profile": "fake", "new_worktree": "d1", "repo": "acme/widget"}
        started = await call_ok(session, "dispatch", arguments, "result")
        ref = started["agent_id"]
        first = await call_ok(session, "await", {"ref": ref}, "result")
        assert first["state"] == "completed"
        diff = await call_ok(session, "diff", {"ref": ref}, "diff")
        assert [f["path"] for f in diff["files"]] == ["first.txt"] and diff["base_sha"] == first["base_sha"]
        assert "+Hello from the fake codex." in diff["patch"]
        stat = await call_ok(session, "diff", {"ref": ref, "stat": True}, "diff")
        assert "patch" not in stat and stat["files"] == diff["files"]
        followed = await call_ok(
            session, "continue", {"ref": ref, "task": "scenario:complete file:second.txt"}, "result"
        )
        assert followed["parent_id"] == ref and followed["agent_id"] != ref
        assert followed["worktree"] == "d1" and followed["profile"] == "fake"
        second = await call_ok(session, "await", {"ref": followed["agent_id"]}, "result")
        assert second["state"] == "completed"
        both = await call_ok(session, "diff", {"ref": followed["agent_id"], "stat": True}, "diff")
        assert sorted(f["path"] for f in both["files"]) == ["first.txt", "second.txt"]
        blank = await call_error(session, "continue", {"ref": ref, "task": " "})
        assert blank["class"] == "usage" and "blank" in blank["message"]

    run_session(machine.env, machine.root, body)


def test_a_patch_that_is_not_utf8_is_refused_naming_the_cli(machine: Machine) -> None:
    machine.clone()
    ref = machine.dispatch(task="scenario:complete file:plain.txt", worktree="latin")
    assert machine.wb("agent", "await", ref).returncode == 0
    worktree = Path(machine.wb_json("agent", "status", ref)["worktree_dir"])  # type: ignore[index]
    (worktree / "latin1.txt").write_bytes(b"caf\xe9\n")  # text to git (no NUL), not UTF-8

    async def body(session: ClientSession) -> None:
        refused = await call_error(session, "diff", {"ref": ref})
        assert refused["class"] == "finding"
        assert refused["message"].endswith(f"pass stat, or read it with: wb agent diff {ref}")
        stat = await call_ok(session, "diff", {"ref": ref, "stat": True}, "diff")
        assert sorted(f["path"] for f in stat["files"]) == ["latin1.txt", "plain.txt"]

    run_session(machine.env, machine.root, body)
    assert b"+caf\xe9" in subprocess.run(
        [sys.executable, "-m", "courier.main", "agent", "diff", ref], capture_output=True, env=machine.env, check=True
    ).stdout


def test_refusals_are_tool_errors_with_the_clis_message_and_class(machine: Machine) -> None:
    bad_ref = "agt-nothex"
    unknown = "agt-" + "0" * 32
    cli_usage = machine.wb("agent", "status", bad_ref)
    cli_finding = machine.wb("agent", "status", unknown)
    cli_blank = machine.wb(
        "agent", "dispatch", "--new-worktree", "w", "--profile", "fake", "--repo", "acme/widget", "--task", "  "
    )

    async def body(session: ClientSession) -> None:
        usage = await call_error(session, "status", {"ref": bad_ref})
        assert (usage["class"], usage["exit_code"]) == ("usage", cli_usage.returncode) == ("usage", 2)
        assert cli_usage.stderr == f"error: {usage['message']}\n"
        finding = await call_error(session, "status", {"ref": unknown})
        assert (finding["class"], finding["exit_code"]) == ("finding", cli_finding.returncode) == ("finding", 1)
        assert cli_finding.stderr == f"error: {finding['message']}\n"
        blank = await call_error(
            session, "dispatch", {"task": "  ", "profile": "fake", "new_worktree": "w", "repo": "acme/widget"}
        )
        assert cli_blank.stderr == f"error: {blank['message']}\n" and blank["class"] == "usage"
        both = await call_error(session, "list", {"to": "box", "all": True})
        assert both["message"] == "pass either --to MACHINE or --all, not both"
        typo = await call_error(session, "status", {"ref": unknown, "verbose": True})
        assert typo["class"] == "usage" and "verbose" in typo["message"]
        wrong_type = await call_error(session, "logs", {"ref": unknown, "tail": "many"})
        assert wrong_type["class"] == "usage" and "tail" in wrong_type["message"]
        missing = await call_error(session, "dispatch", {"profile": "fake", "new_worktree": "w"})
        assert missing["class"] == "usage" and "task" in missing["message"]
        nowhere = await call_error(session, "status", {"ref": f"ghost:{unknown}"})
        assert nowhere["class"] == "usage" and "ghost" in nowhere["message"]

    run_session(machine.env, machine.root, body)
    assert not (machine.home / "agents").exists() or not any((machine.home / "agents").iterdir())


def test_a_machine_that_cannot_be_reached_is_a_transport_error(machine: Machine) -> None:
    port = free_port("127.0.0.1")
    targets = f"session_move:\n  targets:\n    gone:\n      ssh: {{host: 127.0.0.1, port: {port}}}\n"
    machine.write_config(machine.config_path.read_text() + targets)
    unknown = "agt-" + "1" * 32
    cli = machine.wb("agent", "status", f"gone:{unknown}")

    async def body(session: ClientSession) -> None:
        error = await call_error(session, "status", {"ref": unknown, "to": "gone"})
        assert (error["class"], error["exit_code"]) == ("transport", cli.returncode) == ("transport", 255)
        assert cli.stderr == f"error: {error['message']}\n"
        machines = await call_ok(session, "machines", {"check": True, "machine_timeout": "5s"}, "machines")
        [row] = machines["machines"]
        assert row["machine"] == "gone" and row["ok"] is False and "refused" in row["error"]
        fleet = await call_ok(session, "list", {"all": True, "machine_timeout": "5s"}, "fleet")
        assert [row["machine"] for row in fleet["machines"]] == ["", "gone"]
        assert fleet["machines"][1]["ok"] is False

    run_session(machine.env, machine.root, body)


def test_a_cancelled_await_returns_and_the_run_goes_on(machine: Machine) -> None:
    machine.clone()

    async def body(session: ClientSession) -> None:
        started = await call_ok(
            session,
            "dispatch",
            {"task": "scenario:hang", "profile": "fake", "new_worktree": "c1", "repo": "acme/widget"},
            "result",
        )
        ref = started["agent_id"]
        first_progress = anyio.Event()

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            first_progress.set()

        async with anyio.create_task_group() as group:

            async def waiting() -> None:
                await session.call_tool("await", {"ref": ref, "wait_timeout": "10m"}, progress_callback=on_progress)
                raise AssertionError("await returned although the run hangs")

            group.start_soon(waiting)
            with anyio.fail_after(60):
                await first_progress.wait()
            group.cancel_scope.cancel()  # the client abandons the call: notifications/cancelled
        # The server is still serving, and the run still running.
        status = await call_ok(session, "status", {"ref": ref}, "result")
        with anyio.fail_after(60):
            while not status.get("worker_pid"):  # under load the owner may still be starting
                await anyio.sleep(0.05)
                status = await call_ok(session, "status", {"ref": ref}, "result")
        assert status["state"] == "running" and status["owner_alive"] is True and status["worker_alive"] is True
        stopped = await call_ok(session, "stop", {"ref": ref}, "stop")
        assert stopped["agent_id"] == ref and stopped["worker_pid"] == status["worker_pid"]
        ended = await call_ok(session, "await", {"ref": ref, "wait_timeout": "60s"}, "result")
        assert ended["state"] == "failed" and "stopped on request" in ended["failure"]

    run_session({**machine.env, "WB_MCP_PROGRESS_MS": "200"}, machine.root, body)


def test_await_past_its_bound_returns_the_run_as_observed(machine: Machine) -> None:
    """docs/mcp.md: not an error, `terminal: false`, and the description says to call again."""
    machine.clone()
    ref = machine.dispatch(task="scenario:hang")

    async def body(session: ClientSession) -> None:
        began = time.monotonic()
        observed = await call_ok(session, "await", {"ref": ref, "wait_timeout": "1s"}, "result")
        assert time.monotonic() - began < 30
        assert observed["agent_id"] == ref and observed["state"] == "running" and observed["terminal"] is False
        [tool] = [tool for tool in (await session.list_tools()).tools if tool.name == "await"]
        assert "call await again" in (tool.description or "")
        assert "45s" in tool.input_schema["properties"]["wait_timeout"]["description"]
        assert tool.input_schema["properties"]["wait_timeout"]["default"] == "45s"
        await call_ok(session, "stop", {"ref": ref}, "stop")

    run_session({**machine.env, "WB_MCP_PROGRESS_MS": "300"}, machine.root, body)


async def _first_progress_total(session: ClientSession, ref: str, wait_timeout: str) -> float | None:
    """The total (the bound in force, in seconds) of a waiting await's first progress; the call then cancelled."""
    totals: list[float | None] = []
    first_progress = anyio.Event()

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        totals.append(total)
        first_progress.set()

    async def waiting() -> None:
        await session.call_tool("await", {"ref": ref, "wait_timeout": wait_timeout}, progress_callback=on_progress)

    async with anyio.create_task_group() as group:
        group.start_soon(waiting)
        with anyio.fail_after(60):
            await first_progress.wait()
        group.cancel_scope.cancel()
    return totals[0]


def test_await_waits_at_most_50s_whatever_wait_timeout_says(machine: Machine) -> None:
    """`0` (no bound on the command line) or a longer value is taken as 50s, below the client's 60 s
    request timeout; the progress notifications carry the bound in force as their total."""
    machine.clone()
    ref = machine.dispatch(task="scenario:hang")

    async def body(session: ClientSession) -> None:
        [tool] = [tool for tool in (await session.list_tools()).tools if tool.name == "await"]
        described = tool.input_schema["properties"]["wait_timeout"]["description"]
        assert "at most 50s: 0 or a longer value is taken as 50s" in described
        assert "at most 50s: 0 or a longer value is taken as 50s" in (tool.description or "")
        for asked in ("0", "10m", "51s"):
            assert await _first_progress_total(session, ref, asked) == 50, asked
        await call_ok(session, "stop", {"ref": ref}, "stop")

    run_session({**machine.env, "WB_MCP_PROGRESS_MS": "200"}, machine.root, body)


def test_many_waiting_awaits_do_not_hold_up_other_tools(machine: Machine) -> None:
    """150 awaits on running runs at once (issue 21: a status then took 31 s): a status still answers at once."""
    store = Store(machine.home).ensure()
    refs = []
    for _ in range(150):
        # "Owned" by this test process, which stays alive: running for as long as the test takes.
        record = sample_record(owner_pid=os.getpid(), owner_token=start_token(os.getpid()))
        store.create(record, "task")
        refs.append(record.agent_id)
    elapsed: list[float] = []
    states: list[str] = []

    async def body(session: ClientSession) -> None:
        async with anyio.create_task_group() as group:
            for ref in refs:
                group.start_soon(session.call_tool, "await", {"ref": ref, "wait_timeout": "50s"})
            await anyio.wait_all_tasks_blocked()  # every await sent and waiting for its answer
            began = time.monotonic()
            status = await call_ok(session, "status", {"ref": refs[0]}, "result")
            elapsed.append(time.monotonic() - began)
            states.append(status["state"])
            group.cancel_scope.cancel()

    run_session(machine.env, machine.root, body)
    assert elapsed[0] < 10, f"status took {elapsed[0]:.1f}s behind 150 waiting awaits"
    assert states == ["running"]


def test_nothing_but_json_rpc_reaches_stdout(machine: Machine) -> None:
    """A raw session over pipes: every stdout line is one JSON-RPC 2.0 message, whatever the tools did."""
    machine.clone()
    unknown = "agt-" + "2" * 32
    dispatch = {"task": "scenario:complete", "profile": "fake", "new_worktree": "p1", "repo": "acme/widget"}
    calls: list[tuple[str, dict[str, Any]]] = [
        ("dispatch", dispatch),
        ("list", {"all": True}),
        ("machines", {"check": True}),
        ("status", {"ref": unknown}),
        ("status", {"ref": "bad"}),
        ("nope", {}),
    ]
    lines = [
        {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "raw-test", "version": "1"},
            },
        },
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        *(
            {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
            for n, (name, arguments) in enumerate(calls, start=2)
        ),
    ]
    process = subprocess.Popen(
        [sys.executable, "-m", "courier.main", "mcp"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=machine.env,
        cwd=machine.root,
        text=True,
    )
    try:
        assert process.stdin is not None and process.stdout is not None
        answered: dict[int, dict[str, Any]] = {}
        process.stdin.write(json.dumps(lines[0]) + "\n")
        process.stdin.flush()
        answered[0] = json.loads(process.stdout.readline())
        for line in lines[1:]:
            process.stdin.write(json.dumps(line) + "\n")
            process.stdin.flush()
            if "id" in line:
                # One request at a time, so every answer is read before the next call.
                message = json.loads(process.stdout.readline())
                assert message["jsonrpc"] == "2.0" and message["id"] == line["id"], message
                answered[message["id"]] = message
        rest, stderr = process.communicate(timeout=60)  # closes stdin: the server ends
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert rest == "", rest
    assert process.returncode == 0, stderr
    assert answered[0]["result"]["serverInfo"]["name"] == "wb"
    assert len(answered[1]["result"]["tools"]) == len(available_tools())
    dispatched = answered[2]["result"]
    assert dispatched["isError"] is False and dispatched["structuredContent"]["state"] == "running"
    assert answered[3]["result"]["isError"] is False and answered[4]["result"]["isError"] is False
    assert json.loads(answered[5]["result"]["content"][0]["text"])["class"] == "finding"
    assert json.loads(answered[6]["result"]["content"][0]["text"])["class"] == "usage"
    assert answered[7]["result"]["isError"] is True
    assert "Traceback" not in stderr


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw-test", "version": "1"}},
}


def test_every_line_gets_an_answer(machine: Machine) -> None:
    """docs/mcp.md: invalid JSON gets -32700 (id null), an invalid request -32600, and a request with an id
    always an answer, a lone surrogate included (before, such lines were dropped and the client hung)."""
    unknown = "agt-" + "3" * 32
    surrogate_call = (
        '{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"status","arguments":{"ref":"agt-\\ud800"}}}'
    )
    lines: list[tuple[str, int | str | None, int | None]] = [  # (line, id answered, error code or None)
        ("{nope", None, -32700),
        ("", None, -32700),
        ("[1, 2]", None, -32600),
        ("5", None, -32600),
        (surrogate_call, 3, -32600),
        ('{"jsonrpc":"2.0","id":"four","method":"tools/call","params":{"name":"st\\udc00atus"}}', "four", -32600),
        ('{"jsonrpc":"2.0","id":5}', 5, -32600),
        ('{"id":6,"method":"tools/list"}', 6, -32600),
        ('{"jsonrpc":"2.0","method":"notifications/\\ud800"}', None, -32600),
        (json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                     "params": {"name": "status", "arguments": {"ref": unknown}}}), 7, None),
    ]  # fmt: skip
    process = subprocess.Popen(
        [sys.executable, "-m", "courier.main", "mcp"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=machine.env,
        cwd=machine.root,
        text=True,
    )
    try:
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(json.dumps(INITIALIZE) + "\n" + '{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        process.stdin.flush()
        answers: queue.Queue[str] = queue.Queue()
        reader = threading.Thread(target=lambda: [answers.put(out) for out in process.stdout], daemon=True)  # type: ignore[union-attr]
        reader.start()
        assert json.loads(answers.get(timeout=60))["id"] == 0
        for line, request_id, code in lines:
            process.stdin.write(line + "\n")
            process.stdin.flush()
            # One line at a time: a line left unanswered fails here instead of hanging the client.
            try:
                answer = json.loads(answers.get(timeout=30))
            except queue.Empty:
                raise AssertionError(f"no answer to {line!r}") from None
            assert answer["jsonrpc"] == "2.0" and answer["id"] == request_id, (line, answer)
            if code is None:
                assert answer["result"]["isError"] is True  # a tool error: the unknown run
                assert json.loads(answer["result"]["content"][0]["text"])["class"] == "finding"
            else:
                assert answer["error"]["code"] == code, (line, answer)
                assert answer["error"]["message"], answer
        process.stdin.close()
        assert process.wait(timeout=60) == 0
        reader.join(timeout=30)
        assert answers.empty()
        stderr = process.stderr.read()  # type: ignore[union-attr]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()
    assert "Traceback" not in stderr


def test_machines_names_the_wb_yaml_it_read(machine: Machine, tmp_path: Path) -> None:
    """docs/mcp.md: a client that passes no environment sees which wb.yaml it got."""
    targets = "session_move:\n  targets:\n    box:\n      ssh: {host: 127.0.0.1, port: 2222}\n"
    machine.write_config(machine.config_path.read_text() + targets)

    async def body(session: ClientSession) -> None:
        document = await call_ok(session, "machines", {}, "machines")
        assert document["config"] == str(machine.config_path)
        assert [row["machine"] for row in document["machines"]] == ["box"]
        [tool] = [tool for tool in (await session.list_tools()).tools if tool.name == "machines"]
        assert tool.output_schema is not None and "config" in tool.output_schema["required"]

    run_session(machine.env, machine.root, body)
    bare = {key: value for key, value in machine.env.items() if key not in ("WB_CONFIG", "WB_HOME")}

    async def defaults(session: ClientSession) -> None:
        document = await call_ok(session, "machines", {}, "machines")
        assert document == {"machines": [], "config": str(Path(bare["HOME"]) / ".config" / "wb" / "wb.yaml")}

    run_session(bare, machine.root, defaults)


# -- another machine, through a real sshd ---------------------------------------------------

remote = pytest.mark.skipif(sshd_unavailable_reason() is not None, reason=str(sshd_unavailable_reason()))


@pytest.fixture(scope="module")
def box(sshd: SshdFactory) -> SshdServer:
    server = sshd.start("127.0.0.3")
    prepare_remote(server)
    return server


@pytest.fixture
def supervisor(sshd: SshdFactory, box: SshdServer, tmp_path: Path) -> Machine:
    caller = make_machine(tmp_path / "caller")
    config = sshd.write_wb_config(f"mcp-{tmp_path.name}", {"box": sshd.target(box)})
    caller.env["WB_CONFIG"] = str(config)
    caller.env["WB_SSH_CONFIG"] = str(sshd.client_config)
    return caller


@remote
def test_dispatch_await_status_and_list_on_a_loopback_machine(supervisor: Machine, box: SshdServer) -> None:
    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    async def body(session: ClientSession) -> None:
        started = await call_ok(
            session,
            "dispatch",
            {
                "task": "scenario:slow sleep:2",
                "profile": "fake",
                "new_worktree": "mr1",
                "repo": "acme/widget",
                "to": "box",
            },
            "result",
        )
        assert started["machine"] == "box" and started["state"] == "running"
        ref = f"box:{started['agent_id']}"
        assert (box.wb_home / "agents" / started["agent_id"]).is_dir()
        awaited = await session.call_tool("await", {"ref": ref}, progress_callback=on_progress)
        assert not awaited.is_error, awaited.content
        assert isinstance(awaited.structured_content, dict)
        json_documents.check("result", awaited.structured_content)
        assert awaited.structured_content["state"] == "completed"
        status = await call_ok(session, "status", {"ref": started["agent_id"], "to": "box"}, "result")
        assert status["machine"] == "box" and status["state"] == "completed"
        listed = await call_ok(session, "list", {"to": "box"}, "fleet")
        assert started["agent_id"] in [r["agent_id"] for r in listed["results"]]
        assert listed["machines"][0]["machine"] == "box" and listed["machines"][0]["ok"] is True
        fleet = await call_ok(session, "list", {"all": True}, "fleet")
        assert [row["machine"] for row in fleet["machines"]] == ["", "box"]
        diff = await call_ok(session, "diff", {"ref": ref, "stat": True}, "diff")
        assert diff["machine"] == "box" and diff["base_sha"] == status["base_sha"] and diff["files"] == []
        logs = await call_ok(session, "logs", {"ref": ref}, "logs")
        first = logs["logs"].splitlines()[0]
        assert logs["machine"] == "box" and first == str(box.wb_home / "agents" / started["agent_id"] / "events.jsonl")
        machines = await call_ok(session, "machines", {"check": True}, "machines")
        assert machines["machines"][0]["ok"] is True and machines["machines"][0]["schema_version"] == 1

    run_session({**supervisor.env, "WB_MCP_PROGRESS_MS": "500"}, supervisor.root, body)
    assert progress
