"""The three seams (transport, operation, harness) and an import graph without circles, tested without processes."""

from __future__ import annotations

import ast
import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from tests_support import sample_record

from courier import cli
from courier.client.transport import MockTransport, Transport, overridden
from courier.config import Config
from courier.errors import ConnectionLost, HostKeyUnknown, TransportError
from courier.runs.harness import REGISTRY, harness_for, spec_for
from courier.runs.harness.interface import Harness
from protocol import limits
from protocol.models import RemoteRequest, RemoteResponse
from protocol.operations import TABLE
from protocol.validate import RequestRefused, validate_request
from tests.json_documents import check_output

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def wb_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    config = tmp_path / "config" / "wb.yaml"
    config.parent.mkdir(mode=0o700)
    config.write_text("session_move:\n  targets:\n    m1: {ssh: {host: 127.0.0.2}}\n    m2: {ssh: {host: 127.0.0.3}}\n")
    config.chmod(0o600)
    monkeypatch.setenv("WB_CONFIG", str(config))
    monkeypatch.setenv("WB_HOME", str(tmp_path / "home"))
    return tmp_path


def _reply(request: RemoteRequest, **fields: object) -> RemoteResponse:
    return RemoteResponse.model_validate(
        {"schema_version": limits.SCHEMA_VERSION, "operation": request.operation, **fields}
    )


def _machines(answers: dict[str, Callable[[RemoteRequest], RemoteResponse]]) -> Callable[[Config, str], Transport]:
    def factory(config: Config, machine: str) -> Transport:
        return MockTransport(machine, answers[machine])

    return factory


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.run(argv)
    out, err = capsys.readouterr()
    check_output(argv, subprocess.CompletedProcess(argv, code, out, err))  # --json output follows its schema
    return code, out, err


def test_status_of_a_qualified_reference_goes_through_that_machines_transport(
    wb_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = sample_record(state="completed")
    seen: list[RemoteRequest] = []

    def m1(request: RemoteRequest) -> RemoteResponse:
        seen.append(request)
        result = record.model_copy(update={"machine": "m1"}).to_wire()
        return _reply(request, result=result)

    with overridden(_machines({"m1": m1})):
        code, out, err = _run(["agent", "status", f"m1:{record.agent_id}", "--json"], capsys)
    assert code == 0, err
    assert [r.operation for r in seen] == ["status"] and seen[0].agent_id == record.agent_id
    assert json.loads(out)["machine"] == "m1"


def test_a_refusal_with_failure_kind_request_exits_2_prefixed_with_the_machine(
    wb_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def m1(request: RemoteRequest) -> RemoteResponse:
        return _reply(request, failure="no such thing", failure_kind="request")

    with overridden(_machines({"m1": m1})):
        code, out, err = _run(["agent", "list", "--to", "m1"], capsys)
    assert (code, out) == (2, "") and err == "error: m1: no such thing\n"


@pytest.mark.parametrize(
    ("error", "names_the_reference"),
    [(ConnectionLost("m1: connection lost"), True), (HostKeyUnknown("m1: unknown host key"), False)],
)
def test_dispatch_names_the_intended_reference_only_when_the_request_may_have_been_sent(
    wb_env: Path, capsys: pytest.CaptureFixture[str], error: TransportError, names_the_reference: bool
) -> None:
    def m1(request: RemoteRequest) -> RemoteResponse:
        raise error

    argv = ["agent", "dispatch", "--to", "m1", "--repo", "acme/widget", "--new-worktree", "w", "--profile", "p"]
    with overridden(_machines({"m1": m1})):
        code, out, err = _run([*argv, "--task", "do it"], capsys)
    assert (code, out) == (255, "")
    assert ("the run may have started; ask for it with: wb agent status m1:agt-" in err) is names_the_reference


def test_the_fleet_fans_out_over_transports_with_one_row_logic(
    wb_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    local, remote = sample_record(state="completed"), sample_record(state="running")

    def here(request: RemoteRequest) -> RemoteResponse:
        return _reply(request, results=[local.to_wire()])

    def m1(request: RemoteRequest) -> RemoteResponse:
        return _reply(request, results=[remote.model_copy(update={"machine": "m1"}).to_wire()])

    def m2(request: RemoteRequest) -> RemoteResponse:
        raise ConnectionLost("m2: connection lost during the handshake")

    with overridden(_machines({"": here, "m1": m1, "m2": m2})):
        code, out, err = _run(["agent", "list", "--all", "--json"], capsys)
    assert code == 1
    fleet = json.loads(out)
    assert {(r.get("machine", ""), r["agent_id"]) for r in fleet["results"]} == {
        ("", local.agent_id),
        ("m1", remote.agent_id),
    }
    rows = {row["machine"]: row for row in fleet["machines"]}
    assert [rows[m]["ok"] for m in ("", "m1", "m2")] == [True, True, False]
    assert rows["m2"]["runs"] == 0 and "connection lost" in rows["m2"]["error"]
    assert "warning: m2: connection lost during the handshake" in err


def test_every_operation_in_the_table_has_a_handler_and_the_validator_reads_the_table() -> None:
    from courier.ops import REGISTRY

    for name in TABLE:
        assert callable(REGISTRY[name].handle()), name
    with pytest.raises(RequestRefused, match="expected one of " + ", ".join(TABLE)):
        validate_request(RemoteRequest(schema_version=1, operation="explode"))
    for name, entry in TABLE.items():
        if entry.needs_agent_id:
            with pytest.raises(RequestRefused, match=f"{name} needs agent_id"):
                validate_request(RemoteRequest(schema_version=1, operation=name))


def test_the_handler_registry_names_exactly_the_operations_of_the_table() -> None:
    from courier.ops import REGISTRY

    assert list(REGISTRY) == list(TABLE)


def test_every_registered_harness_implements_the_protocol() -> None:
    for name in REGISTRY:
        harness = harness_for(name)
        assert isinstance(harness, Harness) and harness.name == name == spec_for(name).name


def _package_modules() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for package in ("courier", "protocol"):
        for path in (REPO / package).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every package module one file imports: module level and inside functions alike (a lazy import
    hides a circle, it does not remove it); only `if TYPE_CHECKING:` blocks are left out. A name
    that is not a module (`from pkg.mod import function`) counts as its module."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in ast.walk(node)
    }
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    targets: list[str] = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            targets += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], *([base] if base else [])])
            targets += [base, *(f"{base}.{alias.name}" for alias in node.names)]
    found: set[str] = set()
    for target in targets:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)
    return found


def _import_graph() -> dict[str, set[str]]:
    modules = _package_modules()
    return {name: _imports_of(name, path, modules) for name, path in modules.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def strong(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        for target in sorted(graph[name]):
            if target not in index:
                strong(target)
                low[name] = min(low[name], low[target])
            elif target in stack:
                low[name] = min(low[name], index[target])
        if low[name] == index[name]:
            component = []
            while (member := stack.pop()) != name:
                component.append(member)
            component.append(name)
            if len(component) > 1:
                found.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            strong(name)
    return found


def test_the_import_graph_sees_imports_inside_functions_but_not_type_checking_blocks(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    files = {
        "pkg/__init__.py": "",
        "pkg/a.py": "def f():\n    from pkg.b import g\n",
        "pkg/b.py": "from . import a\n",
        "pkg/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n",
    }
    for relative, text in files.items():
        (tmp_path / relative).write_text(text)
    modules = {name: tmp_path / f"{name.replace('.', '/')}.py" for name in ("pkg.a", "pkg.b", "pkg.c")}
    graph = {name: _imports_of(name, path, modules) for name, path in modules.items()}
    assert graph == {"pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}, "pkg.c": set()}
    assert _circles(graph) == [["pkg.a", "pkg.b"]]


def test_the_package_import_graph_has_no_circle() -> None:
    circles = _circles(_import_graph())
    assert not circles, "import circles: " + "; ".join(" <-> ".join(circle) for circle in circles)


def test_neither_the_courier_nor_the_remote_caller_imports_the_cli() -> None:
    """warm/ and remote/ sit below the CLI: an arrow from them up to courier.cli (at any depth) is refused."""
    graph = _import_graph()
    upward = sorted(
        f"{name} -> courier.cli"
        for name, targets in graph.items()
        if name.split(".")[:2] in (["courier", "warm"], ["courier", "remote"]) and "courier.cli" in targets
    )
    assert not upward, upward


def test_protocol_is_a_leaf_that_names_no_courier_module() -> None:
    """protocol/ imports nothing of courier, and no string in it (a handler path, say) names a courier module."""
    graph = _import_graph()
    modules = _package_modules()
    assert not {
        f"{name} -> {target}"
        for name, targets in graph.items()
        if name.startswith("protocol")
        for target in targets
        if not target.startswith("protocol")
    }
    courier_modules = {name for name in modules if name.startswith("courier")}
    named = set()
    for name, path in modules.items():
        if not name.startswith("protocol"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for word in re.findall(r"(?<![\w.])courier(?:\.\w+)+", node.value):
                    module = word  # "courier.runs.service" or "courier.runs.service.status_op"
                    while module and module not in courier_modules:
                        module = module.rpartition(".")[0]
                    if module:
                        named.add(f"{name}: {word}")
    assert not named, named


def test_a_remote_result_is_validated_once_on_its_way_to_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    from courier.call.decode import decode_response
    from protocol.models import Result

    calls: list[object] = []
    original = Result.model_validate.__func__  # type: ignore[attr-defined]

    def counting(cls: type[Result], obj: object, **kwargs: object) -> Result:
        calls.append(obj)
        return original(cls, obj, **kwargs)  # type: ignore[no-any-return]

    records = [sample_record(state="completed").to_wire() for _ in range(3)]
    monkeypatch.setattr(Result, "model_validate", classmethod(counting))
    request = RemoteRequest(schema_version=1, operation="list")
    response = decode_response("m1", request, {"schema_version": 1, "operation": "list", "results": records})
    results = response.results_of()
    status = decode_response(
        "m1",
        RemoteRequest(schema_version=1, operation="status", agent_id=records[0]["agent_id"]),
        {"schema_version": 1, "operation": "status", "result": records[0]},
    ).result_of()
    assert [r.machine for r in results] == ["m1"] * 3 and status.machine == "m1"
    assert len(calls) == 4
