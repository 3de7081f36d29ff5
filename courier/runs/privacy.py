"""A run directory made private when the run ends (docs/runs.md#the-store), the credential masked in what a harness
left (docs/runs.md#environment-and-credentials)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import secrets
import stat
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from protocol import limits

if TYPE_CHECKING:
    import sqlite3

    from courier.runs.store import Record

REDACTED = "[redacted]"
_CHUNK = limits.READ_CHUNK_BYTES
# A clipped text (ending in "…") may end with the start of the credential: a fragment this long is masked too.
_FRAGMENT_MIN = 4
# Files wb writes itself never hold the credential; a harness's may (its final message, its session files).
_HARNESS_FILES = ("last-message.txt", "harness-home")
# A harness's own JSON files (session logs, chats) are redacted on their decoded strings, up to this size.
_JSON_SUFFIXES = (".json", ".jsonl")
_JSON_DECODED_MAX_BYTES = limits.REDACTED_JSON_MAX_BYTES
# An SQLite database (Codex keeps its logs and state in some) is redacted cell by cell, then rewritten whole.
_SQLITE_HEADER = b"SQLite format 3\x00"
_SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


def end_of_run(run_dir: Path, record: Record, secret: bytes) -> None:
    """Before the terminal save: the credential out of every stored text, the run directory private."""
    text = secret.decode("utf-8", "replace")
    record.failure = redact_text(record.failure, text)
    record.result = redact_text(record.result, text)
    diagnostics = [redact_text(line, text) or "" for line in record.harness_diagnostics or []]
    diagnostics += seal(run_dir, secret)
    record.harness_diagnostics = diagnostics or None


def redact_text(text: str | None, secret: str) -> str | None:
    """`text` with every occurrence of `secret` masked, including a fragment a cut left at its end."""
    if not text or not secret:
        return text
    # Idempotent: a mask already there is kept whole, even when the secret is one of its letters.
    text = REDACTED.join(part.replace(secret, REDACTED) for part in text.split(REDACTED))
    if text.endswith("…"):
        body = text[:-1]
        for size in range(min(len(secret) - 1, len(body)), _FRAGMENT_MIN - 1, -1):
            if body.endswith(secret[:size]):
                return body[:-size] + REDACTED + "…"
    return text


def redact_everywhere(text: str, secrets: Iterable[str]) -> str:
    """`text` with each of `secrets` masked however it is spelled: as itself, JSON-escaped
    (`\\u0073…`, short escapes), or cut by a clip at either end (`…` before or after a fragment).

    For text wb shows but did not write itself: a peer's stderr and messages (docs/cli.md,
    "Credentials"), whatever a page shows of them.
    """
    for secret in sorted({item for item in secrets if item}, key=len, reverse=True):
        if not text:
            return text
        text = redact_text(text, secret) or ""
        if "\\" in text:
            raw = text.encode("utf-8", "surrogatepass")
            text = _escaped_spellings(secret.encode()).sub(REDACTED.encode(), raw).decode("utf-8", "surrogatepass")
        if "…" in text:
            text = _mask_clipped(text, secret)
    return text


def _mask_clipped(text: str, secret: str) -> str:
    """Mask what a clip left of `secret` beside each `…`: its end after one, its start before one."""
    parts = text.split("…")
    for index, part in enumerate(parts):
        if index > 0:  # follows a clip mark: may start with the secret's end
            for size in range(min(len(secret) - 1, len(part)), _FRAGMENT_MIN - 1, -1):
                if part.startswith(secret[-size:]):
                    part = REDACTED + part[size:]
                    break
        if index < len(parts) - 1:  # precedes one: may end with the secret's start
            for size in range(min(len(secret) - 1, len(part)), _FRAGMENT_MIN - 1, -1):
                if part.endswith(secret[:size]):
                    part = part[:-size] + REDACTED
                    break
        parts[index] = part
    return "…".join(parts)


def redact_line(line: bytes, secret: bytes) -> bytes:
    """One stored transcript line with `secret` masked wherever it shows, the line still what it was.

    A JSON line is redacted inside its decoded strings, so a harness that writes the credential
    JSON-escaped (`\\u0073\\u006b…`) is caught too, and re-encoded only when something was masked:
    it stays valid JSON. Any other line is masked as text (docs/cli.md, "Credentials").
    """
    if not secret:
        return line
    body = line.rstrip(b"\r\n")
    if b"\\" not in body and secret not in body:
        return line  # no escape at all: every JSON string in it is spelled as it decodes
    ending = line[len(body) :]
    text = body.decode("utf-8", "replace")  # as the readers decode it, so they see what was checked
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        # Kept as written (a cut JSON line, a log line quoting one): its JSON-escaped spellings of
        # the credential read as plainly as the credential itself, so they are masked too.
        return _escaped_spellings(secret).sub(REDACTED.encode(), body) + ending
    plain = secret.decode("utf-8", "replace")
    value, masked = _mask_strings(value, plain)
    if not masked and secret not in body:
        return line
    try:
        encoded = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    except (ValueError, RecursionError):
        encoded = plain  # cannot be re-encoded: take the fallback below
    if any(plain in part for part in encoded.split(REDACTED)):
        # The credential is spelled by the JSON itself (a number, or across the syntax): the line
        # becomes one JSON string of its masked text, still valid JSON, read as a malformed event.
        encoded = json.dumps(_mask(text, plain), ensure_ascii=False)
    # A lone surrogate (decoded from a `\\udXXX` escape) goes back to that escape.
    return encoded.encode("utf-8", "backslashreplace") + ending


_SHORT_ESCAPES = {
    '"': b'\\"', "\\": b"\\\\", "/": b"\\/", "\b": b"\\b", "\f": b"\\f", "\n": b"\\n", "\r": b"\\r", "\t": b"\\t",
}  # fmt: skip


@functools.lru_cache(maxsize=4)  # one credential per run: compiled once, not per line
def _escaped_spellings(secret: bytes) -> re.Pattern[bytes]:
    """Every spelling of `secret` a JSON string could hold: each character as itself, as `\\uXXXX`
    (hex digits in either case; a surrogate pair beyond the BMP) or as its short escape."""
    parts = []
    for char in secret.decode("utf-8", "replace"):
        units = char.encode("utf-16-be").hex()
        escape = b"".join(
            b"\\\\u"
            + b"".join(b"[" + re.escape(d.encode()) + re.escape(d.upper().encode()) + b"]" for d in units[i : i + 4])
            for i in range(0, len(units), 4)
        )
        choices = [re.escape(char.encode()), escape]
        if char in _SHORT_ESCAPES:
            choices.append(re.escape(_SHORT_ESCAPES[char]))
        parts.append(b"(?:" + b"|".join(choices) + b")")
    return re.compile(b"".join(parts))


def _mask(text: str, secret: str) -> str:
    # Idempotent: a mask already there is kept whole, even when the secret is a part of it.
    return REDACTED.join(part.replace(secret, REDACTED) for part in text.split(REDACTED))


def _mask_strings(value: object, secret: str) -> tuple[object, bool]:
    """A decoded JSON value with `secret` masked in every string (keys included), containers
    changed in place, and whether one held it. Iterative: a line nested as deep as the decoder
    allows costs no recursion here."""
    if isinstance(value, str):
        return _mask(value, secret), secret in value
    found = False
    pending = [value]
    while pending:
        container = pending.pop()
        if isinstance(container, dict):
            items = list(container.items())
            if any(secret in key for key, _ in items):
                found = True
                container.clear()
                container.update((_mask(key, secret), item) for key, item in items)
                items = list(container.items())
            for key, item in items:
                if isinstance(item, str):
                    if secret in item:
                        container[key], found = _mask(item, secret), True
                elif isinstance(item, dict | list):
                    pending.append(item)
        elif isinstance(container, list):
            for index, item in enumerate(container):
                if isinstance(item, str):
                    if secret in item:
                        container[index], found = _mask(item, secret), True
                elif isinstance(item, dict | list):
                    pending.append(item)
    return value, found


def seal(run_dir: Path, secret: bytes) -> list[str]:
    """Make every file under run_dir 0600 and every directory 0700, without following links, and
    rewrite the harness's files that hold `secret` with it masked. Returns what could not be done."""
    problems: list[str] = []
    for top, dirs, files in os.walk(run_dir, followlinks=False):
        top_path = Path(top)
        _chmod_dir(top_path, problems)
        harness_owned = top_path != run_dir  # below the run directory is only harness-home
        # A database before its journals: redacting it folds them in, and they are then removed.
        for name in sorted(files, key=lambda name: name.endswith(_SQLITE_SIDE_FILES)):
            path = top_path / name
            redact = bool(secret) and (harness_owned or name in _HARNESS_FILES)
            _seal_file(path, secret if redact else b"", problems)
        # A symlinked directory is listed among dirs but never walked into; leave the link itself.
        dirs[:] = [name for name in dirs if not os.path.islink(top_path / name)]
    return problems


def _chmod_dir(path: Path, problems: list[str]) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        problems.append(f"could not make {path} private: {exc.strerror or exc}")
        return
    try:
        os.fchmod(fd, 0o700)
    except OSError as exc:
        problems.append(f"could not make {path} private: {exc.strerror or exc}")
    finally:
        os.close(fd)


def _seal_file(path: Path, secret: bytes, problems: list[str]) -> None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(info.st_mode):
        return  # a link has no mode of its own; what it points to is not ours to change
    if not stat.S_ISREG(info.st_mode):
        try:
            # A FIFO or socket: chmod by name (opening a FIFO could block); the worker is gone by now.
            os.chmod(path, 0o600)
        except OSError as exc:
            problems.append(f"could not make {path} private: {exc.strerror or exc}")
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        problems.append(f"could not make {path} private: {exc.strerror or exc}")
        return
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode):
            return
        if opened.st_nlink > 1:
            # Linked from elsewhere: this name gets a private copy; the other name's mode is not ours.
            try:
                _rewrite(fd, path, secret)
            except OSError as exc:
                os.unlink(path)
                problems.append(f"removed {path}, linked from elsewhere, that could not be copied: {exc.strerror}")
            return
        os.fchmod(fd, 0o600)  # first, so a failed rewrite (a full disk) still leaves it private
        if not secret:
            return
        if os.pread(fd, len(_SQLITE_HEADER), 0) == _SQLITE_HEADER:
            _redact_sqlite_file(path, secret, problems)
        elif path.suffix in _JSON_SUFFIXES and opened.st_size <= _JSON_DECODED_MAX_BYTES:
            _redact_json_file(fd, path, secret)
        elif _contains(fd, secret):
            os.lseek(fd, 0, os.SEEK_SET)
            _rewrite(fd, path, secret)
    except OSError as exc:
        problems.append(f"could not make {path} private: {exc.strerror or exc}")
    finally:
        os.close(fd)


def _redact_json_file(fd: int, path: Path, secret: bytes) -> None:
    """A harness's JSON file (`.json`: one document; `.jsonl`: one per line) redacted as transcript
    lines are, on decoded strings: a JSON-escaped credential is caught there too. Rewritten only
    when something was masked."""
    chunks = []
    while chunk := os.read(fd, _CHUNK):
        chunks.append(chunk)
    data = b"".join(chunks)
    if path.suffix == ".jsonl":
        redacted = b"".join(redact_line(line, secret) for line in data.splitlines(keepends=True))
    else:
        redacted = redact_line(data, secret)
    if redacted != data:
        _write_private_copy(path, redacted)


def _write_private_copy(path: Path, data: bytes) -> None:
    """Replace path by a 0600 file holding data (a temporary file renamed over it)."""
    _replace_privately(path, lambda out: _write_all(out, data))


def _replace_privately(path: Path, fill: Callable[[int], object]) -> None:
    """Replace path by a 0600 file that `fill` writes (a temporary file renamed over it)."""
    temp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.redact")
    out = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            fill(out)
            os.fsync(out)
        finally:
            os.close(out)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def _max_spelling_bytes(secret: bytes) -> int:
    """The longest any spelling of `secret` can be: a surrogate pair's two escapes (12 bytes) a character."""
    return 12 * len(secret.decode("utf-8", "replace"))


def _contains(fd: int, secret: bytes) -> bool:
    """Whether the file holds `secret` in any spelling (as written, or JSON-escaped), across chunks too."""
    spellings = _escaped_spellings(secret)
    overlap = _max_spelling_bytes(secret) - 1
    carry = b""
    while chunk := os.read(fd, _CHUNK):
        buffer = carry + chunk
        if spellings.search(buffer):
            return True
        carry = buffer[-overlap:] if overlap > 0 else b""
    return False


def _rewrite(fd: int, path: Path, secret: bytes) -> None:
    """Replace path by a 0600 copy of fd (from its current offset) with every spelling of `secret` masked."""
    _replace_privately(path, lambda out: _copy_redacted(fd, out, secret))


def _copy_redacted(source: int, target: int, secret: bytes) -> bool:
    """Stream source to target masking every spelling of `secret` (also across chunk boundaries);
    True when one occurred."""
    if not secret:
        while chunk := os.read(source, _CHUNK):
            _write_all(target, chunk)
        return False
    mask = REDACTED.encode()
    spellings = _escaped_spellings(secret)
    longest = _max_spelling_bytes(secret)
    found = False
    carry = b""
    while chunk := os.read(source, _CHUNK):
        buffer = carry + chunk
        # A match starting before `complete` lies wholly in the buffer; later ones may continue in the next chunk.
        complete = max(len(buffer) - longest + 1, 0)
        pieces = []
        position = 0
        for hit in spellings.finditer(buffer):
            if hit.start() >= complete:
                break
            pieces += [buffer[position : hit.start()], mask]
            position = hit.end()
            found = True
        keep = max(position, complete)
        pieces.append(buffer[position:keep])
        carry = buffer[keep:]
        _write_all(target, b"".join(pieces))
    _write_all(target, spellings.sub(mask, carry))
    return found


def _redact_sqlite_file(path: Path, secret: bytes, problems: list[str]) -> None:
    """An SQLite database with every spelling of `secret` masked in every text and blob cell, then
    rewritten whole (`VACUUM INTO`: no freed page keeps the old text) over it, its journals removed.
    A database that cannot be redacted so is not kept (docs/runs.md#environment-and-credentials)."""
    import sqlite3  # only at the end of a run that has a credential

    temp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.redact")
    try:
        connection = sqlite3.connect(str(path), isolation_level=None)  # it exists: lstat above
        try:
            _mask_sqlite_cells(connection, secret)
            # Always rewritten: a deleted row's text may linger in a freed page, which no cell shows.
            connection.execute("VACUUM INTO ?", (str(temp),))
            os.chmod(temp, 0o600)
            os.replace(temp, path)
        finally:
            connection.close()
        for suffix in _SQLITE_SIDE_FILES:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{path}{suffix}")
    except (sqlite3.Error, OSError) as exc:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        for suffix in _SQLITE_SIDE_FILES:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{path}{suffix}")
        problems.append(f"removed {path}, a database the credential could not be masked in: {exc}")


def _mask_sqlite_cells(connection: sqlite3.Connection, secret: bytes) -> bool:
    """Mask `secret` (any spelling) in every text and blob cell of every table; True when one held it."""
    spellings = _escaped_spellings(secret)
    mask = REDACTED.encode()
    found = False
    tables = [row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    for table in tables:
        quoted = '"' + table.replace('"', '""') + '"'
        columns = [row[1] for row in connection.execute(f"PRAGMA table_info({quoted})")]
        if not columns:
            continue
        names = ['"' + column.replace('"', '""') + '"' for column in columns]
        updates = []
        # Every row, addressed by its values (a WITHOUT ROWID table has no rowid to name it by).
        for row in connection.execute(f"SELECT {', '.join(names)} FROM {quoted}").fetchall():
            masked = [_mask_cell(value, spellings, mask) for value in row]
            if masked != list(row):
                updates.append((masked, list(row)))
        for masked, row in updates:
            found = True
            assignments = ", ".join(f"{name} = ?" for name in names)
            conditions = " AND ".join(f"{name} IS ?" for name in names)
            connection.execute(f"UPDATE {quoted} SET {assignments} WHERE {conditions}", [*masked, *row])
    return found


def _mask_cell(value: object, spellings: re.Pattern[bytes], mask: bytes) -> object:
    if isinstance(value, bytes):
        return spellings.sub(mask, value)
    if isinstance(value, str):
        encoded = value.encode("utf-8", "surrogatepass")
        masked = spellings.sub(mask, encoded)
        return value if masked == encoded else masked.decode("utf-8", "surrogatepass")
    return value


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
