"""The wire contract: round trips, refusals (docs/protocol.md#names-and-references; docs/protocol.md#the-request) and
golden schema-1 documents."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import limits
from protocol.models import RemoteRequest, RemoteResponse, Result
from protocol.refs import BadName, check_repository, check_worktree_name, split_reference
from protocol.validate import RequestRefused, decode_request, validate_request

RUN_ID = "agt-" + "0123456789abcdef" * 2
names = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_-]{0,20}", fullmatch=True)
texts = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=200).filter(lambda t: t.strip())
run_ids = st.from_regex(r"agt-[0-9a-f]{32}", fullmatch=True)


@st.composite
def valid_requests(draw: st.DrawFn) -> RemoteRequest:
    operation = draw(st.sampled_from(["dispatch", "status", "await", "list", "logs", "stop", "version"]))
    fields: dict[str, Any] = {}
    if operation == "dispatch":
        mode = draw(st.sampled_from(["new", "existing"]))
        fields.update(
            mode=mode,
            worktree=draw(names),
            profile=draw(names),
            task=draw(texts),
            timeout_ms=draw(st.integers(1, limits.TIMEOUT_MAX_MS)),
        )
        if mode == "new" or draw(st.booleans()):
            fields["repository"] = f"{draw(names).replace('_', '-')}/{draw(names)}"
        if mode == "new" and draw(st.booleans()):
            fields["branch"] = "wb/" + draw(names)
        if draw(st.booleans()):
            fields["base"] = draw(names)
        if draw(st.booleans()):
            fields["agent_id"] = draw(run_ids)
    elif operation in ("status", "await", "logs", "stop"):
        fields["agent_id"] = draw(run_ids)
        if operation == "await":
            fields["wait_timeout_ms"] = draw(st.integers(0, 10**9))
        if operation == "logs":
            fields.update(raw=draw(st.booleans()), tail=draw(st.integers(0, 1000)))
    return RemoteRequest(schema_version=1, operation=operation, **fields)


@given(valid_requests())
def test_every_valid_request_round_trips_unchanged(request: RemoteRequest) -> None:
    validate_request(request)
    assert decode_request(request.encode()) == request


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=6),
    max_leaves=20,
)
request_like = st.fixed_dictionaries(
    {
        "schema_version": st.one_of(st.just(1), json_values),
        "operation": st.one_of(
            st.sampled_from(["dispatch", "status", "await", "list", "logs", "stop", "version"]), json_values
        ),
    },
    optional={
        key: json_values | names | run_ids
        for key in (
            "mode",
            "worktree",
            "profile",
            "task",
            "repository",
            "branch",
            "base",
            "timeout_ms",
            "agent_id",
            "wait_timeout_ms",
            "raw",
            "tail",
        )
    },
)


@settings(max_examples=300)
@given(st.one_of(json_values, request_like))
def test_arbitrary_json_validates_or_is_refused_with_a_message(document: Any) -> None:
    data = json.dumps(document).encode()
    try:
        decode_request(data)
    except RequestRefused as exc:
        assert str(exc)


@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_raise_anything_but_a_refusal(data: bytes) -> None:
    try:
        decode_request(data)
    except RequestRefused as exc:
        assert str(exc)


def _dispatch(**overrides: Any) -> dict[str, Any]:
    body = {
        "schema_version": 1,
        "operation": "dispatch",
        "mode": "new",
        "worktree": "w1",
        "profile": "fast",
        "task": "do it",
        "repository": "acme/widget",
        "timeout_ms": 1000,
    }
    body.update(overrides)
    return {key: value for key, value in body.items() if value is not ...}


REFUSALS = [
    ({"schema_version": 2, "operation": "list"}, "newer"),
    ({"schema_version": 0, "operation": "list"}, "older"),
    ({"schema_version": "1", "operation": "list"}, "integer 1"),
    ({"operation": "list"}, "integer 1"),
    ({"schema_version": 1, "operation": "explode"}, 'unknown operation "explode"'),
    ({"schema_version": 1}, "unknown operation"),
    (_dispatch(worktree=...), "needs worktree"),
    (_dispatch(task=...), "task is blank"),
    (_dispatch(task="   \n"), "task is blank"),
    (_dispatch(task="x" * (limits.TASK_MAX_BYTES + 1)), "1 MiB"),
    (_dispatch(profile=...), "needs profile"),
    (_dispatch(timeout_ms=0), "timeout_ms must be > 0"),
    (_dispatch(timeout_ms=-5), "timeout_ms must be > 0"),
    (_dispatch(timeout_ms=limits.TIMEOUT_MAX_MS + 1), "168h"),
    (_dispatch(mode="sideways"), "mode"),
    (_dispatch(repository=...), "needs repository"),
    (_dispatch(repository="../x"), "invalid repository"),
    (_dispatch(repository="a/b/c"), "invalid repository"),
    (_dispatch(worktree="../x"), "invalid worktree name"),
    (_dispatch(worktree="a..b"), "invalid worktree name"),
    (_dispatch(worktree="x.lock"), "invalid worktree name"),
    (_dispatch(mode="existing", branch="b"), "branch applies only"),
    (_dispatch(base="--orphan"), 'must not start with "-"'),
    (_dispatch(agent_id="agt-XYZ"), "invalid agent run ID"),
    ({"schema_version": 1, "operation": "status"}, "needs agent_id"),
    ({"schema_version": 1, "operation": "await", "agent_id": RUN_ID, "wait_timeout_ms": -1}, "wait_timeout_ms"),
    ({"schema_version": 1, "operation": "logs", "agent_id": RUN_ID, "tail": -1}, "tail must be"),
    ({"schema_version": 1, "operation": "logs", "agent_id": RUN_ID, "follow": True, "follow_from": -1}, "2^63"),
    ({"schema_version": 1, "operation": "logs", "agent_id": RUN_ID, "follow": True, "follow_from": 2**63}, "2^63"),
    (
        {"schema_version": 1, "operation": "logs", "agent_id": RUN_ID, "follow": True, "follow_from": 10**20 - 1},
        "follow_from must be a byte offset of events.jsonl, 0 <= n < 2^63",
    ),
    ({"schema_version": 1, "operation": "stop", "agent_id": RUN_ID.upper()}, "invalid agent run ID"),
    ({"schema_version": 1, "operation": "status", "agent_id": RUN_ID + "0"}, "invalid agent run ID"),
    ({"schema_version": 1, "operation": "status", "agent_id": "agt-" + "g" * 32}, "invalid agent run ID"),
    ({"schema_version": 1, "operation": "list", "tail": "3"}, "invalid request"),
]


@pytest.mark.parametrize(("document", "message"), REFUSALS, ids=[m for _, m in REFUSALS])
def test_each_contract_refusal_names_what_was_wrong(document: dict[str, Any], message: str) -> None:
    with pytest.raises(RequestRefused, match=None) as caught:
        decode_request(json.dumps(document).encode())
    assert message in str(caught.value)


def test_the_largest_byte_offset_is_accepted() -> None:
    document = {"schema_version": 1, "operation": "logs", "agent_id": RUN_ID, "follow": True, "follow_from": 2**63 - 1}
    assert decode_request(json.dumps(document).encode()).follow_from == 2**63 - 1


def test_empty_and_non_json_requests_are_refused() -> None:
    for data in (b"", b"  \n", b"{", b"[1]", b"null"):
        with pytest.raises(RequestRefused):
            decode_request(data)


def test_oversize_request_is_refused_by_size() -> None:
    with pytest.raises(RequestRefused, match="request exceeds 8388608 bytes"):
        decode_request(b" " * (limits.REQUEST_MAX_BYTES + 1))


@pytest.mark.parametrize(
    "reference",
    [
        "",
        "agt-",
        "agt-123",
        "AGT-" + "0" * 32,
        ":" + RUN_ID,
        "m:",
        " : ",
        "m:agt-xyz",
        "bad name:" + RUN_ID,
        "-m:" + RUN_ID,
        RUN_ID + " trailing",
    ],
)
def test_malformed_references_are_refused(reference: str) -> None:
    with pytest.raises(BadName):
        split_reference(reference)


def test_references_split_at_the_first_colon() -> None:
    assert split_reference(RUN_ID) == ("", RUN_ID)
    assert split_reference(f"gpu-box:{RUN_ID}") == ("gpu-box", RUN_ID)
    assert split_reference(f" gpu-box : {RUN_ID} ") == ("gpu-box", RUN_ID)


@pytest.mark.parametrize("name", ["acme/widget", "a/b.c", "A-1/x_y"])
def test_valid_repositories(name: str) -> None:
    assert check_repository(name) == name


@pytest.mark.parametrize("name", ["acme", "acme/", "/x", "a/b/c", "acme/..", "acme/.", "acme/x.git", "-a/b", "a_b/c"])
def test_invalid_repositories(name: str) -> None:
    with pytest.raises(BadName):
        check_repository(name)


@pytest.mark.parametrize("name", ["../x", "a/b", ".hidden", "x..y", "y.lock", "", "a" * 64])
def test_invalid_worktree_names(name: str) -> None:
    with pytest.raises(BadName):
        check_worktree_name(name)


GOLDEN_REQUEST = (
    '{"schema_version":1,"operation":"dispatch","mode":"new","worktree":"fix-login","profile":"fast",'
    '"task":"Fix the login bug.\\n","repository":"acme/widget","branch":"wb/fix-login","base":"main",'
    '"timeout_ms":1800000,"agent_id":"agt-0123456789abcdef0123456789abcdef"}'
)

GOLDEN_RESULT: dict[str, Any] = {
    "agent_id": "agt-0123456789abcdef0123456789abcdef",
    "state": "completed",
    "terminal": True,
    "profile": "fast",
    "resolved": {
        "profile": "fast",
        "harness": "codex",
        "provider": "deepseek",
        "model": "deepseek-flash",
        "reasoning": "high",
        "routing": {
            "base_url": "https://api.deepseek.com",
            "credential_env": "DEEPSEEK_API_KEY",
            "wire_api": "responses",
        },
    },
    "repository": "acme/widget",
    "worktree_mode": "new",
    "worktree": "fix-login",
    "worktree_dir": "/home/ai/projects/.wb-worktrees/acme/widget/fix-login",
    "branch": "wb/fix-login",
    "base": "main",
    "base_sha": "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c",
    "started_at": "2026-11-29T10:00:00.123456789Z",
    "finished_at": "2026-11-29T10:05:00Z",
    "duration_ms": 300000,
    "owner_pid": 4242,
    "worker_pid": 4243,
    "owner_alive": False,
    "worker_alive": False,
    "exit_code": 0,
    "result": "Fixed it.",
    "tool_calls": 3,
    "usage": {"input_tokens": 3200, "cached_input_tokens": 1500, "output_tokens": 55},
    "changes": {"files_changed": 2, "files": ["a.py", "b.py"], "insertions": 10, "deletions": 2},
    "log_path": "/home/ai/.wb/agents/agt-0123456789abcdef0123456789abcdef/events.jsonl",
}


def test_golden_request_decodes_and_reencodes_identically() -> None:
    request = decode_request(GOLDEN_REQUEST.encode())
    assert request.mode == "new" and request.timeout_ms == 1_800_000 and request.task == "Fix the login bug.\n"
    assert json.loads(request.encode()) == json.loads(GOLDEN_REQUEST)


def test_golden_response_decodes_and_what_we_encode_decodes_back() -> None:
    reply = json.dumps({"schema_version": 1, "operation": "status", "result": GOLDEN_RESULT, "results": None})
    response = RemoteResponse.model_validate_json(reply)
    result = response.result_of()
    assert result.state == "completed" and result.terminal and result.usage and result.usage.output_tokens == 55
    assert result.changes and result.changes.files == ["a.py", "b.py"]
    assert result.to_wire() == GOLDEN_RESULT
    again = RemoteResponse.model_validate_json(response.encode())
    assert again.result_of() == result
    assert "results" not in json.loads(response.encode())


def test_go_peer_shapes_decode_zero_values_as_absent() -> None:
    go_result = {
        **GOLDEN_RESULT,
        "finished_at": "0001-01-01T00:00:00Z",
        "failure": "",
        "machine": "",
        "state": "running",
        "terminal": True,
    }
    response = RemoteResponse.model_validate(
        {"schema_version": 1, "operation": "list", "results": None, "result": None, "logs": "", "failure": ""}
    )
    assert response.results_of() == []
    result = Result.model_validate(go_result)
    assert result.finished_at is None and result.failure is None and result.machine is None
    assert result.terminal is False  # re-derived from state, never trusted from the wire


def test_list_reply_always_carries_results() -> None:
    response = RemoteResponse(schema_version=1, operation="list")
    assert json.loads(response.encode())["results"] == []


def test_stop_reply_decodes_with_its_own_shape() -> None:
    response = RemoteResponse.model_validate(
        {"schema_version": 1, "operation": "stop", "result": {"agent_id": RUN_ID, "worker_pid": 77, "state": "running"}}
    )
    stopped = response.stop_result_of()
    assert (stopped.agent_id, stopped.worker_pid, stopped.state) == (RUN_ID, 77, "running")


def test_unknown_fields_are_ignored_and_unknown_states_are_not_terminal() -> None:
    result = Result.model_validate({**GOLDEN_RESULT, "state": "paused", "future_field": {"x": 1}})
    assert result.state == "paused" and not result.terminal
