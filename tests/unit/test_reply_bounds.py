"""A list reply's size in objects and results is bounded before any model is built; a repeated ID is refused."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from test_reply import RUN_ID, result

from courier.errors import ReplyUntrusted
from courier.remote.client import decode_response
from courier.remote.reply import BadReply, find_reply
from protocol import limits
from protocol.models import RemoteRequest

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
