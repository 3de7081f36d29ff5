"""Run records on disk (contract §6.1): private directories, atomic saves, no symlink following."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
import time
from pathlib import Path

from pydantic import ValidationError

from courier.errors import NotFound, RecordUnreadable, UsageError, WbError
from courier.runs import process
from protocol import limits
from protocol.models import ListWarning, Result, is_terminal
from protocol.refs import is_run_id
from protocol.timestamps import parse_rfc3339, rfc3339, utc_now
from protocol.validate import describe_validation_error

__all__ = ["parse_rfc3339", "rfc3339", "utc_now"]  # re-exported for the run modules

RECORD = "run.json"
TASK = "task"
EVENTS = "events.jsonl"
LAST_MESSAGE = "last-message.txt"
STOP_REQUESTED = "stop-requested"
HARNESS_HOME = "harness-home"
OWNER_ERROR = "owner-error"
HOME_ID = "home-id"


class Record(Result):
    """What the store keeps about one run: the Result's facts, validated by the same rules,
    plus what only the owner needs. The task lives beside it, in its own file."""

    schema_version: int = limits.SCHEMA_VERSION
    preexisting_changes: int | None = None
    timeout_ms: int
    network: bool = False
    provider_options: dict[str, int] | None = None
    owner_token: str | None = None
    worker_token: str | None = None


# Derived when a record is rendered, never stored.
_DERIVED = frozenset({"machine", "terminal", "owner_alive", "worker_alive"})


def _check_private_dir(path: Path, what: str) -> None:
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise UsageError(f"{what} {path} is not a directory (a symlink is refused)")
    if info.st_uid != os.getuid():
        raise UsageError(f"{what} {path} is not owned by you; fix its owner or set WB_HOME elsewhere")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UsageError(f"{what} {path} is writable by group or others; run chmod 700 {path}")


class Store:
    """Records under `<home>/agents/`; `home` is checked (and created 0700) on first use."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.root = home / "agents"
        self._checked = False

    def ensure(self) -> Store:
        if self._checked:
            return self
        for path, what in ((self.home, "WB_HOME"), (self.root, "WB_HOME/agents")):
            if not os.path.lexists(path):
                try:
                    path.mkdir(mode=0o700, parents=True)
                except FileExistsError:
                    pass
                except OSError as exc:
                    raise UsageError(f"cannot create {what} {path}: {exc.strerror}") from None
            _check_private_dir(path, what)
        self._checked = True
        return self

    def run_dir(self, agent_id: str) -> Path:
        return self.root / agent_id

    # -- records -------------------------------------------------------------------------

    def exists(self, agent_id: str) -> bool:
        return os.path.lexists(self.run_dir(agent_id))

    def create(self, record: Record, task: str) -> Path:
        self.ensure()
        run_dir = self.run_dir(record.agent_id)
        os.mkdir(run_dir, 0o700)  # must not pre-exist: FileExistsError is the caller's signal
        (run_dir / HARNESS_HOME).mkdir(mode=0o700)
        write_private(run_dir / TASK, task.encode())
        self.save(record)
        return run_dir

    def save(self, record: Record) -> None:
        body = record.model_dump(mode="json", exclude_none=True, exclude=set(_DERIVED))
        data = json.dumps(body, ensure_ascii=False, indent=2).encode() + b"\n"
        write_private(self.run_dir(record.agent_id) / RECORD, data)

    def load(self, agent_id: str) -> Record:
        self.ensure()
        run_dir = self.run_dir(agent_id)
        try:
            info = os.lstat(run_dir)
        except FileNotFoundError:
            raise NotFound(f"unknown agent run {agent_id} (no record under {self.root})") from None
        if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
            raise RecordUnreadable(f"{run_dir} is a symlink or not a directory; refusing to follow it")
        return read_record(run_dir / RECORD)

    def read_task(self, agent_id: str) -> str:
        return read_private(self.run_dir(agent_id) / TASK, limits.TASK_MAX_BYTES).decode()

    def list(self) -> tuple[list[Record], list[ListWarning]]:
        self.ensure()
        records: list[Record] = []
        warnings: list[ListWarning] = []
        with os.scandir(self.root) as entries:
            for entry in entries:
                if not is_run_id(entry.name):
                    continue
                if entry.is_symlink():
                    warnings.append(ListWarning(agent_id=entry.name, error="symlinked run directory skipped"))
                    continue
                try:
                    records.append(read_record(os.path.join(entry.path, RECORD)))
                except WbError as exc:
                    warnings.append(ListWarning(agent_id=entry.name, error=exc.message))
        return records, warnings

    # -- run artefacts -------------------------------------------------------------------

    def request_stop(self, agent_id: str, requester: str) -> bool:
        """Create stop-requested exclusively; False when it already existed."""
        body = json.dumps({"requested_at": rfc3339(utc_now()), "requester": requester}).encode()
        try:
            write_private(self.run_dir(agent_id) / STOP_REQUESTED, body, exclusive=True)
            return True
        except FileExistsError:
            return False

    def stop_requested_at(self, agent_id: str) -> str | None:
        try:
            raw = read_private(self.run_dir(agent_id) / STOP_REQUESTED, 64 * 1024)
        except FileNotFoundError:
            return None
        except OSError:
            return rfc3339(utc_now())
        try:
            return str(json.loads(raw)["requested_at"])
        except (ValueError, KeyError, TypeError):
            return rfc3339(utc_now())

    def owner_error(self, agent_id: str) -> str | None:
        try:
            return read_private(self.run_dir(agent_id) / OWNER_ERROR, 64 * 1024).decode("utf-8", "replace")
        except OSError:
            return None


def read_record(path: str | Path) -> Record:
    try:
        raw = read_private(path, 16 * limits.MIB)
    except FileNotFoundError:
        raise RecordUnreadable(f"{path} is missing") from None
    except OSError as exc:
        reason = "is a symlink" if exc.errno == 40 else (exc.strerror or str(exc))
        raise RecordUnreadable(f"cannot read {path}: {reason}") from None
    try:
        return Record.model_validate_json(raw)
    except ValidationError as exc:
        raise RecordUnreadable(f"{path} is corrupt ({describe_validation_error(exc)})") from None


def read_private(path: str | Path, limit: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        chunks = []
        remaining = limit
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def write_private(path: Path, data: bytes, *, exclusive: bool = False) -> None:
    """Write 0600 data atomically: temp file in the same directory, fsync, rename."""
    if exclusive:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        return
    temp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    with contextlib.suppress(OSError):
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


# -- rendering ---------------------------------------------------------------------------


def render(record: Record, store: Store | None = None) -> Result:
    """Project a record for output: a running run whose owner is gone is `abandoned`."""
    owner_alive = process.same_process(record.owner_pid, record.owner_token)
    worker_alive = process.same_process(record.worker_pid, record.worker_token)
    state = record.state
    failure = record.failure
    if state == "running" and not owner_alive and not within_admission_grace(record):
        state = "abandoned"
        if store is not None and failure is None:
            failure = store.owner_error(record.agent_id)
    # Field by field, so nothing stored privately (the task, tokens) can reach a Result; the
    # record was validated when read, so the projection is not validated a second time.
    fields = {name: getattr(record, name) for name in _PROJECTED}
    fields.update(state=state, terminal=is_terminal(state), owner_alive=owner_alive, worker_alive=worker_alive)
    if failure is not None:
        fields["failure"] = failure
    return Result.model_construct(**fields)


_PROJECTED = tuple(name for name in Result.model_fields if name not in _DERIVED)


def within_admission_grace(record: Record) -> bool:
    """A run not yet owned counts as running for the admission grace after dispatch."""
    if record.owner_pid:
        return False
    try:
        started = parse_rfc3339(record.started_at).timestamp()
    except ValueError:
        return False
    return time.time() - started < limits.ADMISSION_GRACE_S


def home_id(store: Store) -> str | None:
    """This machine's WB_HOME identity, created on first use; None when the home is unusable."""
    try:
        store.ensure()
        path = store.home / HOME_ID
        try:
            return read_private(path, 256).decode().strip() or None
        except FileNotFoundError:
            pass
        with contextlib.suppress(FileExistsError):
            write_private(path, secrets.token_hex(16).encode(), exclusive=True)
        return read_private(path, 256).decode().strip() or None
    except (WbError, OSError, UnicodeDecodeError):
        return None
