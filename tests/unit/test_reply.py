"""Reply finding, hostile-JSON containment and reply classification (docs/protocol.md#the-callers-rules), without
SSH."""

from __future__ import annotations

import json
from typing import Any

import pytest

from courier.call.caller import interpret
from courier.call.decode import decode_response
from courier.channels.channel import Outcome
from courier.channels.exits import first_stderr_line, stderr_excerpt
from courier.config import ExecTarget, Target
from courier.errors import RemoteWbMissing, ReplyUntrusted, SchemaSkew, TransportError
from protocol import limits
from protocol.models import RemoteRequest
from protocol.reply import BadReply, find_reply

RUN_ID = "agt-" + "0123456789abcdef" * 2
VERSION = RemoteRequest(schema_version=1, operation="version")
STATUS = RemoteRequest(schema_version=1, operation="status", agent_id=RUN_ID)
TARGET = Target(host="box.lan")


def result(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "agent_id": RUN_ID,
        "state": "completed",
        "terminal": False,
        "profile": "fast",
        "resolved": {
            "profile": "fast",
            "harness": "codex",
            "provider": "deepseek",
            "model": "deepseek-flash",
            "routing": {"base_url": "https://api.deepseek.com", "credential_env": "DEEPSEEK_API_KEY",
                        "wire_api": "responses"},
        },
        "repository": "acme/widget",
        "worktree_mode": "new",
        "worktree": "w1",
        "started_at": "2026-01-02T03:04:05Z",
    }  # fmt: skip
    body.update(changes)
    return body


def ok(stdout: bytes, stderr: bytes = b"") -> Outcome:
    return Outcome(stdout=stdout, stderr=stderr, exit_status=0, exit_signal=None)


# --- finding the document -------------------------------------------------------------


def test_a_plain_document_is_found() -> None:
    assert find_reply(b'{"schema_version":1,"operation":"version"}\n') == {
        "schema_version": 1,
        "operation": "version",
    }


def test_shell_noise_before_the_document_is_skipped() -> None:
    data = b'Welcome to box\n{ not json either\nlast login\n{"schema_version":1,"operation":"list"}\n\n  \t'
    assert find_reply(data)["operation"] == "list"


def test_leading_whitespace_at_offset_zero_is_allowed() -> None:
    assert find_reply(b'  \n {"schema_version":1}')["schema_version"] == 1


def test_a_brace_in_the_middle_of_a_line_is_not_a_candidate() -> None:
    with pytest.raises(BadReply, match="no reply document"):
        find_reply(b'noise {"schema_version":1}\n')


def test_the_first_decodable_candidate_wins_and_later_text_makes_it_garbage() -> None:
    # Two documents: the first candidate's remainder holds both, so only the second decodes.
    data = b'{"schema_version":1,"operation":"a"}\n{"schema_version":1,"operation":"b"}\n'
    assert find_reply(data)["operation"] == "b"


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "empty"),
        (b"  \n\t", "empty"),
        (b"hello world\n", "not a JSON object"),
        (b"[1, 2]\n", "not a JSON object"),
        (b'{"schema_version":1} trailing', "trailing garbage"),
        (b'{"schema_version":"1"}', "not an integer"),
        (b'{"schema_version":true}', "not an integer"),
        (b'{"operation":"version"}', "missing"),
        (b'{"schema_version":1,"x":NaN}', "NaN"),
        (b'{"schema_version":1,"x":Infinity}', "Infinity"),
        (b'{"schema_version":1,"x":-Infinity}', "Infinity"),
        (b'{"schema_version":1,"x":1e999}', "out-of-range"),
        (b'{"schema_version":1,"x":' + b"1" * 5000 + b"}", "5000 digits"),
        (b'{"schema_version":' + b"9" * 30 + b"}", "30 digits"),
        (b'{"schema_version":1,"x":"\xff\xfe"}', "UTF-8"),
        (b'{"schema_version":1', "not valid JSON"),
    ],
)
def test_hostile_or_broken_replies_are_refused_with_a_reason(data: bytes, reason: str) -> None:
    with pytest.raises(BadReply, match=reason):
        find_reply(data)


def test_deep_nesting_is_refused_without_recursion_errors() -> None:
    # 100,000 levels: far past the recursion limit, within the bound on objects and arrays.
    with pytest.raises(BadReply, match="not a JSON object"):
        find_reply(b"[" * 100_000)
    with pytest.raises(BadReply, match="nested deeper"):
        find_reply(b'{"schema_version":1,"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}")


def test_nesting_just_past_the_limit_is_refused_and_at_the_limit_accepted() -> None:
    depth = limits.REPLY_MAX_NESTING
    inner = "[" * (depth - 1) + "]" * (depth - 1)
    assert find_reply(f'{{"schema_version":1,"x":{inner}}}'.encode())["schema_version"] == 1
    deeper = "[" * depth + "]" * depth
    with pytest.raises(BadReply, match="nested deeper"):
        find_reply(f'{{"schema_version":1,"x":{deeper}}}'.encode())


def test_invalid_utf8_in_noise_does_not_hide_the_document() -> None:
    assert find_reply(b'\xff\xfe banner\n{"schema_version":1}')["schema_version"] == 1


def test_many_candidate_lines_are_handled_quickly() -> None:
    data = b"\n{" * 150_000 + b'\n{"schema_version":1}'
    assert find_reply(data)["schema_version"] == 1


# --- classifying the outcome --------------------------------------------------------


def test_exit_127_names_the_machine_and_the_setting() -> None:
    outcome = Outcome(stdout=b"", stderr=b"sh: 1: wb: not found", exit_status=127, exit_signal=None)
    with pytest.raises(RemoteWbMissing) as caught:
        interpret("gpu-box", TARGET, VERSION, outcome)
    assert caught.value.message == (
        "wb is not installed on gpu-box (or not on the PATH of a non-interactive shell); "
        "set session_move.targets.gpu-box.ssh.wb_path"
    )
    assert caught.value.exit_code == 255


def test_exit_126_says_wb_path_is_not_executable() -> None:
    target = Target(host="box.lan", wb_path="/opt/wb/bin/wb")
    with pytest.raises(TransportError, match="/opt/wb/bin/wb is not executable") as caught:
        interpret("m", target, VERSION, Outcome(b"", b"", 126, None))
    assert caught.value.exit_code == 255
    assert caught.value.cause == "wb not executable"


def test_other_exits_and_signals_carry_a_one_line_sanitised_excerpt() -> None:
    stderr = b"Traceback\n  line\x1b[31m red\nBoom: \xe2\x80\xaeevil" + b"x" * 5000 + b"\nfinal words"
    with pytest.raises(TransportError) as caught:
        interpret("m", TARGET, VERSION, Outcome(b"", stderr, 3, None))
    message = caught.value.message
    assert "exited with status 3" in message
    assert "\n" not in message and "\x1b" not in message and "\u202e" not in message
    assert message.endswith("final words")
    with pytest.raises(TransportError, match="killed by signal KILL"):
        interpret("m", TARGET, VERSION, Outcome(b"", b"", None, "KILL"))


def test_stderr_excerpt_is_bounded() -> None:
    excerpt = stderr_excerpt(b"\xf0\x9f\x92\xa5" * 2000)
    assert len(excerpt.encode()) <= limits.REMOTE_STDERR_EXCERPT_MAX_BYTES
    assert stderr_excerpt(b"") == "(nothing on stderr)"


def test_the_first_stderr_line_skips_banner_rows_without_letters() -> None:
    """ssh's changed-host-key warning starts with a row of `@`: the line worth quoting is the next one with words."""
    banner = b"@" * 59
    stderr = (
        banner + b"\n@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\n" + banner + b"\n"
        b"IT IS POSSIBLE THAT SOMEONE IS DOING SOMETHING NASTY!\nHost key verification failed.\n"
    )
    assert first_stderr_line(stderr) == "@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @"
    assert first_stderr_line(b"  \n----\n== 42 ==\nssh: connect to host x port 22: Connection refused\n") == (
        "ssh: connect to host x port 22: Connection refused"
    )
    assert first_stderr_line(b"@@@@\n") == "(nothing on stderr)"


def test_an_exec_exit_quotes_the_first_stderr_line_with_words() -> None:
    target = ExecTarget(argv=["ssh", "-T", "box"])
    stderr = b"@" * 59 + b"\n@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\n"
    with pytest.raises(TransportError) as caught:
        interpret("box", target, VERSION, Outcome(b"", stderr, 255, None))
    assert caught.value.message.endswith("without a reply: @ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @")


def test_overflow_is_untrusted() -> None:
    outcome = Outcome(b"x", b"", None, None, overflow="stdout")
    with pytest.raises(ReplyUntrusted, match="exceeds 4194304 bytes"):
        interpret("m", TARGET, VERSION, outcome)
    outcome = Outcome(b"", b"x", None, None, overflow="stderr")
    with pytest.raises(ReplyUntrusted, match="65536 bytes on stderr"):
        interpret("m", TARGET, VERSION, outcome)


def test_a_bad_reply_names_the_machine() -> None:
    with pytest.raises(ReplyUntrusted, match=r"^m: the reply cannot be trusted: .*empty"):
        interpret("m", TARGET, VERSION, ok(b""))


# --- decoding the document -----------------------------------------------------------


@pytest.mark.parametrize(("version", "remedy"), [(0, "upgrade wb on m"), (2, "upgrade wb here")])
def test_schema_skew_names_the_direction(version: int, remedy: str) -> None:
    with pytest.raises(SchemaSkew, match=remedy):
        decode_response("m", VERSION, {"schema_version": version, "operation": "version"})


def test_operation_mismatch_is_untrusted_but_an_unparsed_refusal_is_returned() -> None:
    with pytest.raises(ReplyUntrusted, match='answered operation "list" to a version request'):
        decode_response("m", VERSION, {"schema_version": 1, "operation": "list"})
    refusal = {"schema_version": 1, "operation": "", "failure": "request is not valid JSON", "failure_kind": "request"}
    response = decode_response("m", VERSION, refusal)
    assert response.failure == "request is not valid JSON"
    assert response.failure_kind == "request"


def test_status_result_is_stamped_and_terminal_rederived() -> None:
    document = {"schema_version": 1, "operation": "status", "result": result(machine="evil", extra="ignored")}
    stamped = decode_response("gpu-box", STATUS, document).result_of().to_wire()
    assert stamped["machine"] == "gpu-box"
    assert stamped["terminal"] is True
    assert "extra" not in stamped


def test_unknown_state_is_accepted_and_not_terminal() -> None:
    document = {"schema_version": 1, "operation": "status", "result": result(state="paused", terminal=True)}
    response = decode_response("m", STATUS, document)
    assert response.result_of().terminal is False


@pytest.mark.parametrize(
    "bad",
    [
        {"agent_id": "../x"},
        {"agent_id": RUN_ID.upper()},
        {"worktree": "../../etc"},
        {"worktree_mode": "sideways"},
        {"profile": "fast\x1b[2J"},
        {"duration_ms": -5},
        {"started_at": "yesterday"},
    ],
)
def test_a_hostile_result_is_untrusted(bad: dict[str, Any]) -> None:
    document = {"schema_version": 1, "operation": "status", "result": result(**bad)}
    with pytest.raises(ReplyUntrusted, match=r"^m: the status reply carries a result that fails validation"):
        decode_response("m", STATUS, document)


def test_missing_result_is_untrusted() -> None:
    with pytest.raises(ReplyUntrusted, match="carries no result"):
        decode_response("m", STATUS, {"schema_version": 1, "operation": "status"})


def test_list_results_are_each_validated_and_stamped() -> None:
    request = RemoteRequest(schema_version=1, operation="list")
    response = decode_response("m", request, {"schema_version": 1, "operation": "list", "results": [result()]})
    assert [item.machine for item in response.results_of()] == ["m"]
    assert decode_response("m", request, {"schema_version": 1, "operation": "list", "results": None}).results_of() == []
    with pytest.raises(ReplyUntrusted):
        decode_response("m", request, {"schema_version": 1, "operation": "list", "results": [result(agent_id="../x")]})


def test_stop_result_is_decoded_as_its_own_shape() -> None:
    request = RemoteRequest(schema_version=1, operation="stop", agent_id=RUN_ID)
    body = {"agent_id": RUN_ID, "worker_pid": 42, "state": "running"}
    response = decode_response("m", request, {"schema_version": 1, "operation": "stop", "result": body})
    assert response.stop_result_of().to_wire() == {**body, "machine": "m"}


def test_a_failure_is_returned_without_results() -> None:
    document = {"schema_version": 1, "operation": "status", "failure": "unknown run", "failure_kind": "not_found",
                "result": {"junk": True}}  # fmt: skip
    response = decode_response("m", STATUS, document)
    assert (response.failure, response.failure_kind, response.result) == ("unknown run", "not_found", None)


def test_envelope_fields_are_checked() -> None:
    with pytest.raises(ReplyUntrusted, match="now"):
        decode_response("m", VERSION, {"schema_version": 1, "operation": "version", "now": "noon"})
    with pytest.raises(ReplyUntrusted, match="home_id"):
        decode_response("m", VERSION, {"schema_version": 1, "operation": "version", "home_id": "a\x1bb"})
    with pytest.raises(ReplyUntrusted, match="does not fit protocol schema 1"):
        decode_response("m", VERSION, {"schema_version": 1, "operation": "version", "result": [1]})


def test_a_full_reply_through_interpret() -> None:
    body = json.dumps({"schema_version": 1, "operation": "version", "wb_version": "9.9", "home_id": "abc"})
    response = interpret("m", TARGET, VERSION, ok(b"motd\n" + body.encode() + b"\n"))
    assert (response.wb_version, response.home_id) == ("9.9", "abc")


def test_a_reply_kind_the_caller_does_not_know_is_refused_not_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reply-kind switch is exhaustive: a kind added to the table without a case stops, loudly."""
    from protocol import operations

    entry = operations.Operation("example", "result")
    object.__setattr__(entry, "reply", "novel")  # a kind the Reply literal does not list yet
    monkeypatch.setitem(operations.TABLE, "example", entry)
    request = RemoteRequest(schema_version=1, operation="example")
    with pytest.raises(AssertionError, match="novel"):
        decode_response("m", request, {"schema_version": 1, "operation": "example", "result": result()})


@pytest.mark.parametrize(
    ("value", "depth"),
    [(1, 0), ("x", 0), ([], 1), ({}, 1), ([1, [2, [3]]], 3), ({"a": [{"b": []}], "c": 1}, 4), ([[], [[{}]]], 4)],
)
def test_nesting_depth_counts_the_deepest_container_path(value: object, depth: int) -> None:
    from protocol.reply import nesting_depth

    assert nesting_depth(value) == depth
