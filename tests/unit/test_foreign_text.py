"""One sanitiser for foreign text (docs/cli.md#conventions-shared-by-every-command) and requests with lone surrogates
refused like any malformed one (docs/protocol.md#the-receivers-rules)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests_support import sample_record

from courier.errors import WbError
from courier.ops.dispatch import dispatch_line
from courier.ops.list_ import list_lines
from courier.ops.status import status_text
from courier.receiver.serve import _operation_of, _refusal
from courier.runs.privacy import redact_text
from courier.text import escape_controls, sanitize
from protocol.models import RemoteRequest, Result
from protocol.validate import RequestRefused, decode_request

UNSAFE_CATEGORIES = ("Cc", "Cf", "Zl", "Zp", "Cs")
EVERY_CHARACTER = "".join(chr(code) for code in range(0x110000))


def _unsafe(ch: str) -> bool:
    return unicodedata.category(ch) in UNSAFE_CATEGORIES


def test_sanitize_replaces_every_control_format_separator_and_surrogate_character() -> None:
    cleaned = sanitize(EVERY_CHARACTER)
    assert len(cleaned) == len(EVERY_CHARACTER)
    missed = [f"U+{ord(ch):04X}" for ch in cleaned if _unsafe(ch)]
    assert missed == []
    # Beyond those, only unassigned code points of format blocks are replaced; other text is kept.
    extra = [
        f"U+{ord(ch):04X}"
        for ch, out in zip(EVERY_CHARACTER, cleaned, strict=True)
        if out != ch and not _unsafe(ch) and unicodedata.category(ch) != "Cn"
    ]
    assert extra == []
    kept = sanitize(EVERY_CHARACTER, keep_newlines=True)
    assert kept[10] == "\n" and [ch for ch in kept if _unsafe(ch)] == ["\n"]


def test_escape_controls_leaves_no_unsafe_character_but_newlines() -> None:
    escaped = escape_controls(EVERY_CHARACTER)
    assert [f"U+{ord(ch):04X}" for ch in escaped if _unsafe(ch) and ch != "\n"] == []
    assert "\\u2028" in escaped and "\\xad" in escaped and "\\ud800" in escaped


def _hostile_result() -> Result:
    record = sample_record(state="completed", branch="wb/w1", machine="m1")
    fields = {name: getattr(record, name) for name in Result.model_fields}
    result = Result.model_construct(**fields)
    result.profile = "fake\u2028\u00ad"
    result.branch = "wb/\u2029x"
    result.failure = "boom \x1b[2J\u202e\u2066"
    result.result = "line one\u2028still one\nline two\u00ad\U000e0041"
    return result


def test_every_text_output_of_a_result_is_clean() -> None:
    result = _hostile_result()
    for text in (list_lines([result]), status_text(result, details=True), dispatch_line(result)):
        # Tabs and newlines of the layout itself are the only control characters left.
        assert [f"U+{ord(ch):04X}" for ch in text if _unsafe(ch) and ch not in "\t\n"] == []
    assert "line one still one" in status_text(result, details=True)


def test_redaction_is_idempotent_and_masks_a_cut_fragment() -> None:
    assert redact_text("hello e", "e") == "h[redacted]llo [redacted]"
    assert redact_text(redact_text("hello e", "e"), "e") == "h[redacted]llo [redacted]"
    assert redact_text("key sk-abcdef…", "sk-abcdefghij") == "key [redacted]…"
    assert redact_text("short sk…", "sk-abcdefghij") == "short sk…"  # too short to be told from text


# -- lone surrogates in a request --------------------------------------------------------------

STRING_FIELDS = ("operation", "mode", "worktree", "profile", "task", "repository", "branch", "base", "agent_id")


@pytest.mark.parametrize("field", STRING_FIELDS)
def test_a_lone_surrogate_in_any_string_field_is_a_request_refusal(field: str) -> None:
    document: dict[str, Any] = {"schema_version": 1, "operation": "status", "agent_id": "agt-" + "0" * 32}
    document[field] = "agt-\ud800" if field == "agent_id" else "x\udc00y"
    data = json.dumps(document).encode()  # ASCII: the surrogate travels as the escape \ud800
    with pytest.raises(RequestRefused, match=f"^{field} is not valid Unicode text"):
        decode_request(data)


_SURROGATES = st.integers(min_value=0xD800, max_value=0xDFFF).map(chr)
_TEXT = st.text(alphabet=st.one_of(st.characters(), _SURROGATES), max_size=12)


@settings(max_examples=300)
@given(
    st.fixed_dictionaries(
        {"schema_version": st.just(1), "operation": st.sampled_from(["status", "await", "logs", "stop", "dispatch"])},
        optional={name: _TEXT for name in STRING_FIELDS if name != "operation"},
    )
)
def test_any_request_with_surrogates_decodes_or_gets_an_encodable_refusal(document: dict[str, Any]) -> None:
    data = json.dumps(document).encode()
    try:
        request = decode_request(data)
    except RequestRefused as exc:
        reply = json.loads(_refusal(str(exc), _operation_of(data)).encode())
        assert reply["failure_kind"] == "request" and reply["now"] and reply["failure"]
        return
    assert isinstance(request, RemoteRequest)
    request.encode().decode("utf-8")  # every field the receiver acts on is valid Unicode


@pytest.mark.parametrize("operation", ["status", "await", "logs", "stop", "dispatch", "\ud800"])
def test_the_receiver_refuses_a_surrogate_agent_id_in_band_with_now(tmp_path: Path, operation: str) -> None:
    request = {"schema_version": 1, "operation": operation, "agent_id": "\ud800"}
    if operation == "dispatch":
        request.update(mode="new", worktree="w", profile="p", task="t", repository="a/b", timeout_ms=1000)
    env = {**os.environ, "WB_HOME": str(tmp_path / "home"), "WB_CONFIG": str(tmp_path / "none.yaml")}
    done = subprocess.run(
        [sys.executable, "-m", "courier.main", "--wb-internal-agent-remote"],
        input=json.dumps(request).encode(),
        capture_output=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0
    reply = json.loads(done.stdout)
    assert reply["failure_kind"] == "request", reply
    assert "not valid Unicode text" in reply["failure"] and "internal" not in reply["failure"]
    assert reply["now"].endswith("Z")
    assert reply["operation"] == ("" if operation == "\ud800" else operation)


# -- JSON output escapes what text output sanitises (docs/cli.md, "Formats") -------------------

SAFE_FOR_ROUND_TRIP = "".join(ch for ch in EVERY_CHARACTER if unicodedata.category(ch) != "Cs")


def test_json_output_escapes_every_character_text_output_sanitises() -> None:
    from courier.render import json_text, to_json

    for out in (to_json({"text": SAFE_FOR_ROUND_TRIP}), json_text({"text": SAFE_FOR_ROUND_TRIP}, indent=None)):
        left = [f"U+{ord(ch):04X}" for ch in out if _unsafe(ch) and ch != "\n"]
        assert left == []
        assert json.loads(out) == {"text": SAFE_FOR_ROUND_TRIP}  # the same text to a parser
    assert to_json({"a": "x\u202e\u2028\u200b\u00ad\U000e0001"}) == (
        '{\n  "a": "x\\u202e\\u2028\\u200b\\u00ad\\udb40\\udc01"\n}\n'
    )


def test_an_ascii_document_is_escaped_as_any_other() -> None:
    """ASCII-only JSON takes a shorter pattern (courier/text.py): the same escapes for each of the 128 characters."""
    from courier.render import to_json
    from courier.text import _UNSAFE, _json_escape, escape_json_unsafe

    for code in range(128):
        text = f"a{chr(code)}b"
        assert escape_json_unsafe(text) == _UNSAFE.sub(_json_escape, text), code
    assert to_json({"a": "x\x7fy"}) == '{\n  "a": "x\\u007fy"\n}\n'


def test_a_lone_surrogate_is_printed_as_its_escape() -> None:
    from courier.render import to_json

    assert to_json({"patch": "\udc80x"}) == '{\n  "patch": "\\udc80x"\n}\n'


def test_diff_json_and_the_mcp_text_use_the_one_json_printer() -> None:
    from courier.mcp_server import _error
    from courier.ops.diff import diff_json
    from protocol.models import DiffResult

    diff = DiffResult(agent_id="agt-" + "0" * 32, base_sha="a" * 40, head_sha="b" * 40, patch="+x\u202e\udc80\n")
    assert '"patch": "+x\\u202e\\udc80\\n"' in diff_json(diff)
    text = _error(WbError("bad \u2028 name")).content[0]
    assert '"message":"bad \\u2028 name"' in getattr(text, "text", "")
