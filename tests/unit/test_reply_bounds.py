"""A list reply's size in objects and results is bounded before any model is built; a repeated ID is refused."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from test_reply import RUN_ID, result

from courier.call.decode import decode_response
from courier.errors import ReplyUntrusted
from protocol import limits
from protocol.models import RemoteRequest
from protocol.reply import BadReply, find_reply

LIST = RemoteRequest(schema_version=1, operation="list")
OTHER_ID = "agt-" + "fedcba9876543210" * 2


def list_reply(**fields: Any) -> dict[str, Any]:
    return {"schema_version": 1, "operation": "list", **fields}


def test_a_reply_of_too_many_tiny_objects_is_refused_before_decoding() -> None:
    count = limits.REPLY_CONTAINERS_MAX + 1
    data = ('{"schema_version":1,"operation":"list","results":[' + ",".join(["{}"] * count) + "]}\n").encode()
    with pytest.raises(BadReply, match=f"it holds more than {limits.REPLY_CONTAINERS_MAX} JSON objects and arrays"):
        find_reply(data)


def test_braces_inside_strings_are_not_counted() -> None:
    text = "{[" * limits.REPLY_CONTAINERS_MAX
    data = json.dumps(list_reply(failure=text, results=[])).encode()
    assert find_reply(data)["failure"] == text


def test_more_results_than_a_real_reply_can_carry_are_refused_before_validation() -> None:
    count = limits.REPLY_RESULTS_MAX + 1
    started = time.monotonic()
    with pytest.raises(ReplyUntrusted) as caught:
        decode_response("m1", LIST, list_reply(results=[{}] * count))
    assert caught.value.message == (
        f"m1: the list reply carries {count} results; more than {limits.REPLY_RESULTS_MAX} cannot be a real answer, "
        "refused"
    )
    assert caught.value.exit_code == 255
    assert time.monotonic() - started < 1  # no model was built for them
    with pytest.raises(ReplyUntrusted, match=f"carries {count} warnings"):
        decode_response("m1", LIST, list_reply(results=[], warnings=[{}] * count))


def test_a_repeated_agent_id_from_one_machine_is_refused_naming_it() -> None:
    with pytest.raises(ReplyUntrusted) as caught:
        decode_response("m1", LIST, list_reply(results=[result(), result(agent_id=OTHER_ID), result()]))
    assert caught.value.message == f"m1: the list reply names agent run {RUN_ID} more than once; refused"
    warned = list_reply(results=[result()], warnings=[{"agent_id": RUN_ID, "error": "unreadable"}])
    with pytest.raises(ReplyUntrusted, match=f"names agent run {RUN_ID} more than once"):
        decode_response("m1", LIST, warned)


def test_distinct_results_are_accepted() -> None:
    response = decode_response("m1", LIST, list_reply(results=[result(), result(agent_id=OTHER_ID)]))
    assert [item.agent_id for item in response.results_of()] == [RUN_ID, OTHER_ID]


@pytest.mark.parametrize(
    ("operation", "fields", "body"),
    [
        ("status", {"agent_id": RUN_ID}, {"result": result(agent_id=OTHER_ID)}),
        ("await", {"agent_id": RUN_ID}, {"result": result(agent_id=OTHER_ID)}),
        ("dispatch", {"agent_id": RUN_ID}, {"result": result(agent_id=OTHER_ID)}),
        ("logs", {"agent_id": RUN_ID, "follow": True}, {"logs": "", "result": result(agent_id=OTHER_ID)}),
        ("stop", {"agent_id": RUN_ID}, {"result": {"agent_id": OTHER_ID, "worker_pid": 7, "state": "failed"}}),
        ("diff", {"agent_id": RUN_ID}, {"result": {"agent_id": OTHER_ID, "base_sha": "a", "head_sha": "b"}}),
        ("continue", {"agent_id": OTHER_ID, "new_agent_id": RUN_ID}, {"result": result(agent_id=OTHER_ID)}),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_a_result_about_another_run_than_the_one_asked_about_is_untrusted(
    operation: str, fields: dict[str, Any], body: dict[str, Any]
) -> None:
    request = RemoteRequest(schema_version=1, operation=operation, **fields)
    with pytest.raises(ReplyUntrusted) as caught:
        decode_response("m1", request, {"schema_version": 1, "operation": operation, **body})
    assert caught.value.message == f"m1: the {operation} reply is about agent run {OTHER_ID}, not {RUN_ID}; refused"
    assert caught.value.exit_code == 255


def test_a_result_about_the_run_asked_about_is_accepted() -> None:
    request = RemoteRequest(schema_version=1, operation="status", agent_id=RUN_ID)
    response = decode_response("m1", request, {"schema_version": 1, "operation": "status", "result": result()})
    assert response.result_of().agent_id == RUN_ID and response.result_of().machine == "m1"
    unnamed = RemoteRequest(schema_version=1, operation="dispatch")  # a dispatch may leave the ID to the peer
    assert decode_response("m1", unnamed, {"schema_version": 1, "operation": "dispatch", "result": result()})


def test_a_reply_of_too_many_scalars_is_refused_before_decoding() -> None:
    bound = limits.REPLY_VALUES_MAX
    for junk, count in (("1", bound), ('"x"', bound), ("true", bound), ("null", bound), ('{"a":0}', bound // 2 + 1)):
        junk_array = ",".join([junk] * count)
        data = ('{"schema_version":1,"operation":"list","results":[],"junk":[' + junk_array + "]}").encode()
        started = time.monotonic()
        with pytest.raises(BadReply, match=f"^it holds more than {limits.REPLY_VALUES_MAX} JSON values$"):
            find_reply(data)
        assert time.monotonic() - started < 2, junk


def test_a_reply_at_the_value_bound_is_accepted_and_commas_in_strings_are_not_counted() -> None:
    # 1 (the object) + 4 members + the junk array's elements: exactly the bound.
    count = limits.REPLY_VALUES_MAX - 5
    junk = ",".join(["0"] * (count - 1) + ["[]"])
    data = ('{"schema_version":1,"operation":"list","results":[],"junk":[' + junk + "]}").encode()
    assert len(find_reply(data)["junk"]) == count
    text = "," * (2 * limits.REPLY_VALUES_MAX)
    assert find_reply(json.dumps(list_reply(failure=text, results=[])).encode())["failure"] == text
