"""One registry of operations (courier/ops/): the wire table, the handlers, the MCP tools, the
documents the CLI prints and the tests' schema map all read it, so an operation is one module."""

from __future__ import annotations

import dataclasses
import pkgutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import courier.ops
from courier import cli, mcp_server, schemas
from courier.client.transport import MockTransport, Transport, overridden, transport_for
from courier.config import Config, load_config
from courier.errors import UsageError
from courier.ops import REGISTRY
from courier.ops.op import Arg, McpTool, Op, ToolCall, ref_arg
from courier.runs.context import Context
from protocol import operations
from protocol.models import RemoteRequest, RemoteResponse
from protocol.operations import TABLE, Operation
from tests.json_documents import schema_for

OP_MODULES = sorted(
    info.name for info in pkgutil.iter_modules(courier.ops.__path__) if info.name != "op"
)  # one per operation


def test_every_operation_of_the_wire_table_has_exactly_one_module() -> None:
    owners = {name: getattr(courier.ops, name).OP.name for name in OP_MODULES}
    assert sorted(owners.values()) == sorted(TABLE), owners
    assert all(REGISTRY[op].wire is TABLE[op] for op in TABLE)  # the table IS the modules' entries
    assert list(TABLE) == [
        "dispatch", "status", "await", "list", "logs", "stop", "version", "diff", "continue", "prune", "watch"
    ]  # fmt: skip


def test_the_mcp_tools_are_the_operations_with_a_tool_plus_machines() -> None:
    tools = {tool.name: tool for tool in mcp_server.available_tools()}
    with_tool = {name for name, op in REGISTRY.items() if op.mcp is not None}
    assert set(tools) == with_tool | {"machines"}
    for name in with_tool:
        described = REGISTRY[name].mcp
        assert described is not None
        assert (tools[name].description, tools[name].output, tools[name].read_only) == (
            described.description,
            described.output,
            described.read_only,
        )


def test_every_document_an_operation_names_is_a_published_schema() -> None:
    for op in REGISTRY.values():
        for name in (op.printed, op.printed_all, op.mcp.output if op.mcp else None):
            assert name is None or name in schemas.DOCUMENTS, (op.name, name)


def example_handler(request: RemoteRequest, response: RemoteResponse, context: Context) -> None:
    response.logs = f"example answered {request.agent_id}"


def _example_op() -> Op:
    wire = Operation("example", "none", ("agent_id",), needs_agent_id=True, capability="example")
    return Op(
        wire,
        f"{__name__}:example_handler",
        "head",
        printed="stopped",
        printed_all="fleet",
        mcp=McpTool("An example.", "result"),
    )


def test_an_operation_registered_once_is_validated_answered_and_mapped(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """One registry line reaches the validator, `perform` over this machine's transport and the schema map."""
    op = _example_op()
    monkeypatch.setitem(REGISTRY, op.name, op)
    monkeypatch.setitem(TABLE, op.name, op.wire)
    monkeypatch.setenv("WB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("WB_CONFIG", str(tmp_path / "wb.yaml"))
    (tmp_path / "wb.yaml").write_text("agents: {}\n")
    (tmp_path / "wb.yaml").chmod(0o600)
    run_id = "agt-" + "0" * 32
    answer = transport_for(load_config(), "").ask(RemoteRequest.of("example", agent_id=run_id))
    assert (answer.failure, answer.logs) == ("", f"example answered {run_id}")
    with pytest.raises(UsageError, match="example needs agent_id"):
        transport_for(load_config(), "").ask(RemoteRequest.of("example"))
    assert schema_for(["agent", "example", "REF", "--json"]) == "stopped"
    assert schema_for(["agent", "example", "--all", "--json"]) == "fleet"
    from courier.capabilities import capabilities

    assert "example" in capabilities()


def test_an_operation_with_a_tool_is_an_mcp_tool_from_its_module_alone(
    monkeypatch: pytest.MonkeyPatch, here_env: Path
) -> None:
    """The tool's arguments (as data) and handler in the module reach tools/list and tools/call."""
    import anyio
    from mcp import types

    async def handler(call: ToolCall, args: Any) -> dict[str, Any]:
        client = await call.client()
        response = await call.blocking(lambda: client.ask("", RemoteRequest.of("example", agent_id=args.ref)))
        return {"said": response.logs, "loud": args.loud}

    arguments = (ref_arg(), Arg("loud", bool, "Shout.", False))
    op = dataclasses.replace(_example_op(), mcp=McpTool("An example.", "result", arguments=arguments, handler=handler))
    monkeypatch.setitem(REGISTRY, op.name, op)
    monkeypatch.setitem(TABLE, op.name, op.wire)
    mcp_server.available_tools.cache_clear()
    try:
        listed = {tool.name: tool for tool in mcp_server.tool_definitions()}
        schema = listed["example"].input_schema
        assert (schema["required"], list(schema["properties"]), schema["additionalProperties"]) == (
            ["ref"],
            ["ref", "loud"],
            False,
        )
        loud = {"default": False, "description": "Shout.", "title": "Loud", "type": "boolean"}
        assert schema["properties"]["loud"] == loud
        asked = types.CallToolRequestParams(name="example", arguments={"ref": RUN_ID, "loud": True})
        answer = anyio.run(mcp_server.call_tool, None, asked)
        assert answer.structured_content == {"said": f"example answered {RUN_ID}", "loud": True}, answer.content
    finally:
        mcp_server.available_tools.cache_clear()


def test_installing_a_second_entry_under_a_taken_name_is_refused() -> None:
    with pytest.raises(ValueError, match="status is installed twice"):
        operations.install([dataclasses.replace(TABLE["status"])])


RUN_ID = "agt-" + "0123456789abcdef" * 2


@pytest.fixture
def here_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    config = tmp_path / "wb.yaml"
    config.write_text("agents: {}\n")
    config.chmod(0o600)
    monkeypatch.setenv("WB_CONFIG", str(config))
    monkeypatch.setenv("WB_HOME", str(tmp_path / "home"))
    return tmp_path


def _this_machine(answer: Callable[[RemoteRequest], dict[str, object]]) -> Callable[[Config, str], Transport]:
    """Every machine, this one ("") included, answered by `answer` through a MockTransport."""

    def reply(request: RemoteRequest) -> RemoteResponse:
        return RemoteResponse.model_validate({"schema_version": 1, "operation": request.operation, **answer(request)})

    return lambda config, machine: MockTransport(machine, reply)


def test_this_machines_diff_goes_through_its_transport(here_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    asked: list[RemoteRequest] = []

    def answer(request: RemoteRequest) -> dict[str, object]:
        asked.append(request)
        diff = {"agent_id": request.agent_id, "base_sha": "a" * 40, "head_sha": "b" * 40, "files": []}
        return {"result": {**diff, "patch": "+from the transport\n"}}

    with overridden(_this_machine(answer)):
        code = cli.run(["agent", "diff", RUN_ID])
    out, err = capsys.readouterr()
    assert (code, out, err) == (0, "+from the transport\n", "")
    assert [(r.operation, r.agent_id, r.stat) for r in asked] == [("diff", RUN_ID, False)]


def test_this_machines_raw_logs_go_through_its_transport(here_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    asked: list[RemoteRequest] = []

    def answer(request: RemoteRequest) -> dict[str, object]:
        asked.append(request)
        return {"logs": "/far/events.jsonl\n{\"from\": \"the transport\"}\n"}

    with overridden(_this_machine(answer)):
        code = cli.run(["agent", "logs", RUN_ID, "--raw"])
    out, err = capsys.readouterr()
    assert (code, out, err) == (0, '/far/events.jsonl\n{"from": "the transport"}\n', "")
    assert [(r.operation, r.agent_id, r.raw) for r in asked] == [("logs", RUN_ID, True)]


def test_this_machines_await_is_sent_in_chunks_as_another_machines_is(
    here_env: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No caller forks on local or remote: `await` of this machine takes the chunked path too."""
    from tests_support import sample_record

    monkeypatch.setenv("WB_AWAIT_CHUNK_MS", "1000")
    # The bound counts from the command's start, which is this process's: the pytest process may
    # be older than the bound by the time this runs, so the command starts now here.
    monkeypatch.setattr("courier.runs.process.command_age_s", lambda: 0.0)
    asked: list[RemoteRequest] = []

    def answer(request: RemoteRequest) -> dict[str, object]:
        asked.append(request)
        state = "completed" if len(asked) == 3 else "running"
        record = sample_record(agent_id=RUN_ID, state=state, started_at="2026-11-30T10:00:00.000Z")
        return {"result": record.to_wire()}

    with overridden(_this_machine(answer)):
        code = cli.run(["agent", "await", RUN_ID, "--wait-timeout", "10m", "--json"])
    out, err = capsys.readouterr()
    assert (code, err) == (0, ""), err
    assert '"state": "completed"' in out
    assert [(r.operation, r.agent_id) for r in asked] == [("await", RUN_ID)] * 3
    assert all(0 < r.wait_timeout_ms <= 1000 for r in asked), [r.wait_timeout_ms for r in asked]


def test_this_machines_prune_worktrees_asks_its_capabilities_as_another_machines_is(
    here_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from courier.capabilities import PRUNE_WORKTREES

    asked: list[str] = []

    def answer(request: RemoteRequest) -> dict[str, object]:
        asked.append(request.operation)
        if request.operation == "version":
            return {"capabilities": [PRUNE_WORKTREES]}
        return {"result": {"dry_run": True, "removed": [], "kept_live": 0, "worktrees": []}}

    with overridden(_this_machine(answer)):
        code = cli.run(["agent", "prune", "--older-than", "1h", "--dry-run", "--worktrees"])
    out, err = capsys.readouterr()
    assert (code, out, err) == (0, "would remove 0 records and 0 worktrees\n", "")
    assert asked == ["version", "prune"]


def test_every_operation_says_how_every_executor_answers_it() -> None:
    """Its handler loads; a cluster executor knows how to answer it (forward: with what a run no node holds
    gets; fan_out: a reply kind that merges); the ones that start runs or list harnesses need a fresh login."""
    from typing import get_args

    from courier.ops.op import Cluster

    for op in REGISTRY.values():
        assert op.cluster in get_args(Cluster), op.name
        assert callable(op.handle()), op.name
        if op.cluster == "forward":
            assert op.before_start is not None, op.name
        if op.cluster == "fan_out":
            assert op.wire.reply in ("results", "prune"), op.name
        if op.cluster == "place":
            assert op.fresh_environment, op.name
    assert {op.name for op in REGISTRY.values() if op.fresh_environment} == {"dispatch", "continue", "version"}


def test_every_operation_is_a_command_of_the_cli() -> None:
    """`wb agent NAME` for each operation; `version` is what `wb machines --check` asks."""
    commands = {cli._command_name(info) for info in cli.agent_app.registered_commands}
    assert set(REGISTRY) - {"version"} <= commands, set(REGISTRY) - commands
