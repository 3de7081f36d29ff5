"""Redaction of a stored transcript line (docs/cli.md, "Credentials"): on decoded strings, never breaking JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from courier.runs.privacy import redact_line, seal
from protocol import limits

SECRET = "sk-live/7Qx9"


def _escaped(text: str) -> str:
    return "".join(f"\\u{ord(char):04x}" for char in text)


def test_a_json_escaped_credential_is_masked_in_the_decoded_string() -> None:
    line = f'{{"type":"item.completed","item":{{"command":"curl -H x-api-key:{_escaped(SECRET)}"}}}}\n'.encode()
    out = redact_line(line, SECRET.encode())
    assert out.endswith(b"\n")
    assert json.loads(out) == {"type": "item.completed", "item": {"command": "curl -H x-api-key:[redacted]"}}


@pytest.mark.parametrize(
    "spelling",
    [
        SECRET,
        SECRET.replace("/", "\\/"),  # the escaped solidus
        SECRET.replace("-", "\\u002d"),  # partly escaped
        _escaped(SECRET),
    ],
)
def test_every_spelling_of_the_credential_in_a_json_string_is_masked(spelling: str) -> None:
    out = redact_line(f'{{"k":"a {spelling} b","{spelling}":1}}'.encode(), SECRET.encode())
    assert json.loads(out) == {"k": "a [redacted] b", "[redacted]": 1}


def test_a_credential_with_json_metacharacters_is_masked_where_json_escapes_them() -> None:
    secret = 'ab"cd\\ef/12'
    line = json.dumps({"text": f"key={secret}!", "list": [secret, 3]}).encode() + b"\r\n"
    out = redact_line(line, secret.encode())
    assert out.endswith(b"\r\n")
    assert json.loads(out) == {"text": "key=[redacted]!", "list": ["[redacted]", 3]}


def test_a_line_without_the_credential_is_stored_byte_for_byte() -> None:
    line = b'{ "type" : "turn.started",  "x": "\\u00e9" }\n'
    assert redact_line(line, SECRET.encode()) is line


def test_a_credential_spelled_by_the_syntax_leaves_valid_json_without_it() -> None:
    secret = '":"item.'  # what a byte replace would cut out of every Codex item event
    line = b'{"type":"item.completed","item":{"id":"i","type":"reasoning"}}\n'
    out = redact_line(line, secret.encode())
    decoded = json.loads(out)  # still JSON: one string, its text masked
    assert decoded == '{"type[redacted]completed","item":{"id":"i","type":"reasoning"}}'
    assert secret.encode() not in out


def test_a_credential_written_as_a_number_is_not_left_in_the_line() -> None:
    out = redact_line(b'{"n":12345678901}\n', b"12345678")
    assert b"12345678" not in out and isinstance(json.loads(out), str)


def test_a_line_that_is_not_json_is_masked_as_text() -> None:
    assert redact_line(f"warning: key {SECRET} refused\n".encode(), SECRET.encode()) == (
        b"warning: key [redacted] refused\n"
    )


def test_a_lone_surrogate_escape_survives_the_re_encoding() -> None:
    out = redact_line(f'{{"a":"\\ud800 {SECRET}"}}'.encode(), SECRET.encode())
    assert out == b'{"a":"\\ud800 [redacted]"}'
    assert json.loads(out) == {"a": "\ud800 [redacted]"}


def test_deep_nesting_costs_no_recursion() -> None:
    depth = 900  # as deep as the decoder goes
    line = ("[" * depth + json.dumps(SECRET) + "]" * depth).encode()
    out = redact_line(line, SECRET.encode())
    assert SECRET.encode() not in out
    json.loads(out)


def test_no_credential_changes_nothing() -> None:
    assert redact_line(b"anything", b"") == b"anything"


@pytest.mark.parametrize(
    "spelling",
    [
        _escaped(SECRET),
        _escaped(SECRET).upper().replace("\\U", "\\u"),  # upper-case hex digits
        SECRET.replace("/", "\\/").replace("-", "\\u002D"),  # partly escaped
    ],
)
def test_an_escaped_credential_in_a_line_that_is_not_json_is_masked(spelling: str) -> None:
    """The fresh red-team pass (docs/red-team.md, item 1): a harness line that does not parse (a cut
    JSON line, a log line quoting one) keeps its text as it was written, so `logs` prints it as a
    diagnostic; the credential's JSON-escaped spelling there is as readable as the plain one."""
    line = f'{{"type":"item.completed","item":{{"command":"curl -H x-api-key:{spelling} http://x'.encode()
    out = redact_line(line + b"\n", SECRET.encode())
    assert out == b'{"type":"item.completed","item":{"command":"curl -H x-api-key:[redacted] http://x\n'


def test_a_line_that_is_not_json_keeps_its_other_escapes_and_bytes() -> None:
    line = b"not json \\u0041 \xff " + _escaped(SECRET).encode() + b" \\n\n"
    assert redact_line(line, SECRET.encode()) == b"not json \\u0041 \xff [redacted] \\n\n"


@pytest.mark.parametrize("offset", [-3, -1, 0, 1])
def test_a_harness_file_of_any_format_is_masked_in_every_spelling_across_read_chunks(
    tmp_path: Path, offset: int
) -> None:
    """A file that is neither JSON nor a database (a log, a binary file) is masked as bytes, in each
    spelling, also where one straddles a read chunk's end (docs/cli.md, "Credentials")."""
    home = tmp_path / "harness-home"
    home.mkdir()
    spelled = _escaped(SECRET).upper().replace("\\U", "\\u").encode()
    head = b"x" * (limits.READ_CHUNK_BYTES - len(spelled) // 2 + offset)
    log = home / "codex.log"
    log.write_bytes(head + spelled + b"\n\x00" + SECRET.encode() + b"\xff")
    assert seal(tmp_path, SECRET.encode()) == []
    assert log.read_bytes() == head + b"[redacted]\n\x00[redacted]\xff"
    untouched = home / "other.bin"
    untouched.write_bytes(b"\x00\\u0073k plain \xff")
    assert seal(tmp_path, SECRET.encode()) == []
    assert untouched.read_bytes() == b"\x00\\u0073k plain \xff"
