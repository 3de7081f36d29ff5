"""Run records on disk (docs/runs.md#the-store): private directories, atomic saves, no symlink following."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
import stat
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ValidationError

from courier.errors import Finding, NotFound, RecordUnreadable, UsageError, WbError
from courier.runs import process
from protocol import limits
from protocol.models import ListWarning, Price, Result, UsageLimitPolicy, is_terminal
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
# Space set aside at dispatch and given up on a full disk, so the terminal state can still be saved.
RESERVE = ".reserve"
RESERVE_BYTES = 128 * 1024


class Record(Result):
    """What the store keeps about one run: the Result's facts, validated by the same rules,
    plus what only the owner needs. The task lives beside it, in its own file."""

    schema_version: int = limits.SCHEMA_VERSION
    preexisting_changes: int | None = None
    timeout_ms: int
    network: bool | list[str] = False
    # docs/security.md#confined-runs: the mode in force (auto | required | off), where it came from, the writable paths.
    sandbox_mode: str = "auto"
    sandbox_source: str | None = None  # "profile fast" or "wb.yaml's sandbox.default": the `off` reason names it
    sandbox_writable: list[str] | None = None
    provider_options: dict[str, int] | None = None
    permissions: str | None = None  # the profile's `permissions` (claude: "bypass")
    command: list[str] | None = None  # the profile's `command` (harness command)
    owner_token: str | None = None
    worker_token: str | None = None
    # docs/cli.md#stalled-runs: absent means the default (10m); 0 means never stalled.
    stall_after_ms: int | None = None
    stop_when_stalled_ms: int | None = None
    # docs/cli.md, wb agent continue: the harness session a continuing run resumes (its parent's session_id).
    resume_session_id: str | None = None
    # Contract docs/cli.md#waiting-out-a-usage-limit: the profile's on_usage_limit (absent: a usage limit ends the run).
    usage_limit: UsageLimitPolicy | None = None
    # docs/config.md#price: the profile's price, which lets a cost bound be checked after every response.
    price: Price | None = None


# Derived when a record is rendered, never stored.
_DERIVED = frozenset({"machine", "terminal", "owner_alive", "worker_alive"})


class RecordNotCreated(Finding):
    """A new record could not be written (a full disk, a read-only home); nothing of it is left."""


def _check_private_dir(path: Path, what: str) -> None:
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise UsageError(f"{what} {path} is not a directory (a symlink is refused)")
    if info.st_uid != os.getuid():
        raise UsageError(f"{what} {path} is not owned by you; fix its owner or set WB_HOME elsewhere")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UsageError(f"{what} {path} is writable by group or others; run chmod 700 {path}")


# Run locks this process holds: run directory → (descriptor, depth).
_HELD_LOCKS: dict[str, tuple[int, int]] = {}


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
        """The new record, whole or not at all: any other failure than FileExistsError removes
        what was made and raises RecordNotCreated naming the path and the reason."""
        self.ensure()
        run_dir = self.run_dir(record.agent_id)
        try:
            os.mkdir(run_dir, 0o700)  # must not pre-exist: FileExistsError is the caller's signal
        except FileExistsError:
            raise
        except OSError as exc:
            raise RecordNotCreated(f"cannot create the run record {run_dir}: {_reason(exc)}") from None
        try:
            (run_dir / HARNESS_HOME).mkdir(mode=0o700)
            write_private(run_dir / TASK, task.encode())
            _reserve_space(run_dir / RESERVE)
            self.save(record)
        except OSError as exc:
            import shutil  # only here: the receiver's hot path does not pay for it

            shutil.rmtree(run_dir, ignore_errors=True)
            raise RecordNotCreated(f"cannot create the run record {run_dir}: {_reason(exc)}") from None
        return run_dir

    def save(self, record: Record) -> None:
        body = record.model_dump(mode="json", exclude_none=True, exclude=set(_DERIVED))
        data = json.dumps(body, ensure_ascii=False, indent=2).encode() + b"\n"
        path = self.run_dir(record.agent_id) / RECORD
        try:
            write_private(path, data)
        except OSError as exc:
            # A full disk: give up the space set aside when the record was made, and try once more.
            if exc.errno != errno.ENOSPC or not self.release_reserve(record.agent_id):
                raise
            write_private(path, data)

    def release_reserve(self, agent_id: str) -> bool:
        """Free the run's reserved space; False when there was none left."""
        try:
            os.unlink(self.run_dir(agent_id) / RESERVE)
            return True
        except OSError:
            return False

    def load(self, agent_id: str) -> Record:
        self.ensure()
        run_dir = self.run_dir(agent_id)
        try:
            info = os.lstat(run_dir)
        except FileNotFoundError:
            raise NotFound(f"unknown agent run {agent_id} (no record under {self.root})") from None
        if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
            raise RecordUnreadable(f"{run_dir} is a symlink or not a directory; refusing to follow it")
        problem = record_dir_problem(info)
        if problem:
            raise RecordUnreadable(f"{run_dir} {problem}")
        return read_record_of(run_dir, agent_id)

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
                    problem = record_dir_problem(entry.stat(follow_symlinks=False))
                    if problem:
                        raise RecordUnreadable(f"{entry.path} {problem}")
                    records.append(read_record_of(entry.path, entry.name))  # a str: no Path per record
                except (OSError, WbError) as exc:
                    if not os.path.lexists(entry.path):
                        continue  # pruned while this list ran (prune renames it away first)
                    reason = exc.message if isinstance(exc, WbError) else f"cannot read {entry.path}: {exc.strerror}"
                    warnings.append(ListWarning(agent_id=entry.name, error=reason))
        return records, warnings

    # -- the run's lock: stop and the owner's decisions exclude each other (docs/runs.md#terminal-state) ---

    def hold_run_lock(self, agent_id: str, wait_s: float | None = None) -> bool:
        """Take the run's lock (flock on its directory) for this process; reentrant. With `wait_s`,
        give up after that long and return False. Released by release_run_lock or at exit."""
        key = str(self.run_dir(agent_id))
        if key in _HELD_LOCKS:
            fd, depth = _HELD_LOCKS[key]
            _HELD_LOCKS[key] = (fd, depth + 1)
            return True
        fd = os.open(key, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        deadline = None if wait_s is None else time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if deadline is None else fcntl.LOCK_NB))
                break
            except BlockingIOError:
                if deadline is not None and time.monotonic() >= deadline:
                    os.close(fd)
                    return False
                time.sleep(0.02)
        _HELD_LOCKS[key] = (fd, 1)
        return True

    def release_run_lock(self, agent_id: str) -> None:
        key = str(self.run_dir(agent_id))
        if key not in _HELD_LOCKS:
            return
        fd, depth = _HELD_LOCKS[key]
        if depth > 1:
            _HELD_LOCKS[key] = (fd, depth - 1)
            return
        del _HELD_LOCKS[key]
        os.close(fd)  # closing the only descriptor releases the flock

    @contextlib.contextmanager
    def run_lock(self, agent_id: str, wait_s: float | None = None) -> Iterator[bool]:
        held = self.hold_run_lock(agent_id, wait_s)
        try:
            yield held
        finally:
            if held:
                self.release_run_lock(agent_id)

    # -- run artefacts -------------------------------------------------------------------

    def open_transcript(self, agent_id: str) -> tuple[int, int, Path] | None:
        """(descriptor, size, path) of the run's events.jsonl, checked as every store file is;
        None when there is none. A link, FIFO or hard-linked file is a finding naming it."""
        path = self.run_dir(agent_id) / EVENTS
        opened = open_transcript_file(path)
        return None if opened is None else (opened[0], opened[1].st_size, path)

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
            raw = read_private(self.run_dir(agent_id) / STOP_REQUESTED, limits.RUN_NOTE_MAX_BYTES)
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
            raw = read_private(self.run_dir(agent_id) / OWNER_ERROR, limits.RUN_NOTE_MAX_BYTES)
            return raw.decode("utf-8", "replace")
        except OSError:
            return None


def _reason(exc: OSError) -> str:
    """An OSError's reason as a clause: "no space left on device"."""
    text = exc.strerror or str(exc)
    return text[:1].lower() + text[1:]


def _reserve_space(path: Path) -> None:
    """Set space aside in the run directory, so the terminal state can be saved on a disk that fills."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise
            write_all(fd, bytes(RESERVE_BYTES))  # a filesystem without fallocate
    finally:
        os.close(fd)


def record_dir_problem(info: os.stat_result) -> str | None:
    """Why a record directory cannot be trusted (checked as WB_HOME is, docs/runs.md#the-store), or None."""
    if info.st_uid != os.getuid():
        return f"is owned by uid {info.st_uid}, not by you; remove it or fix its owner"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "is writable by group or others; run chmod 700 on it"
    return None


def read_record_of(run_dir: str | Path, agent_id: str) -> Record:
    """The record of `run_dir`, which must name the run its directory is named after."""
    path = os.path.join(run_dir, RECORD)
    record = read_record(path)
    if record.agent_id != agent_id:
        raise RecordUnreadable(
            f"{path} names run {record.agent_id}, not {agent_id} (copied or linked from another run)"
        )
    return record


def read_record(path: str | Path) -> Record:
    try:
        raw = read_private(path, 16 * limits.MIB)
    except FileNotFoundError:
        raise RecordUnreadable(f"{path} is missing") from None
    except UnsafeStoreFile as exc:
        raise RecordUnreadable(str(exc)) from None
    except OSError as exc:
        reason = "is a symlink" if exc.errno == 40 else (exc.strerror or str(exc))
        raise RecordUnreadable(f"cannot read {path}: {reason}") from None
    try:
        return Record.model_validate_json(raw)
    except ValidationError as exc:
        raise RecordUnreadable(f"{path} is corrupt ({describe_validation_error(exc)})") from None


class UnsafeStoreFile(OSError):
    """A store file that is a symlink, not a regular file, or hard-linked elsewhere (docs/runs.md#the-store;
    docs/security.md)."""

    def __str__(self) -> str:
        return self.strerror or ""


def open_private(path: str | Path) -> tuple[int, os.stat_result]:
    """Open a store file for reading without following a link or blocking on a FIFO, and check
    the open descriptor: a regular file with no other link (none at all when its writer has just
    replaced it by rename: what was opened is a whole earlier version). FileNotFoundError passes through;
    every other refusal is an UnsafeStoreFile naming the file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeStoreFile(errno.ELOOP, f"{path} is a symbolic link; refusing to follow it") from None
        raise
    info = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(info.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(info.st_mode) else "not a regular file"
        problem = f"{path} is {kind}; refusing to read it"
    elif info.st_nlink > 1:  # 0: replaced by its writer's rename since the open; a whole old version
        problem = f"{path} has {info.st_nlink} hard links; refusing a store file linked from elsewhere"
    if problem:
        os.close(fd)
        raise UnsafeStoreFile(errno.EPERM, problem)
    return fd, info


def open_transcript_file(path: str | Path) -> tuple[int, os.stat_result] | None:
    """A transcript opened as every store file is (open_private); None when there is none. A link,
    FIFO or hard-linked file is a finding naming it: `logs` and `logs --follow` refuse alike."""
    try:
        return open_private(path)
    except FileNotFoundError:
        return None
    except UnsafeStoreFile as exc:
        raise Finding(str(exc)) from None
    except OSError as exc:
        raise Finding(f"cannot read {path}: {exc.strerror or exc}") from None


def read_private(path: str | Path, limit: int) -> bytes:
    fd, _ = open_private(path)
    try:
        return read_fd(fd, limit)
    finally:
        os.close(fd)


def read_fd(fd: int, limit: int) -> bytes:
    """At most `limit` bytes from fd's current offset."""
    chunks = []
    remaining = limit
    while remaining > 0:
        chunk = os.read(fd, min(remaining, limits.READ_CHUNK_BYTES))
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


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
    if record.state == "running" and not owner_alive and store is not None:
        # The owner writes its last state before it exits: read after seeing it gone, so a run that
        # ended between the first read and the liveness check is not shown abandoned. An owner that
        # started meanwhile has written itself into the record (dispatch renders the record it made,
        # before its owner's first write): it is asked about again, or a run just started shows abandoned.
        record = _read_again(store, record)
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
    if state == "running":
        fields.update(stall_facts(record, store))
    return Result.model_construct(**fields)


def _read_again(store: Store, record: Record) -> Record:
    try:
        return store.load(record.agent_id)
    except (WbError, OSError):
        return record


def stall_after_ms(record: Record) -> int:
    return limits.STALL_AFTER_DEFAULT_MS if record.stall_after_ms is None else record.stall_after_ms


def last_output(record: Record, store: Store | None) -> float | None:
    """When the harness last wrote, as a Unix time: the owner appends every line it reads to
    events.jsonl as it comes, so the file's mtime is the last output (one lstat, no extra
    writes by the owner). Before the first line it is the start of the run."""
    path = str(store.run_dir(record.agent_id) / EVENTS) if store is not None else record.log_path
    if path:
        try:
            return os.lstat(path).st_mtime
        except OSError:
            pass
    try:
        return parse_rfc3339(record.started_at).timestamp()
    except ValueError:
        return None


def stall_facts(record: Record, store: Store | None) -> dict[str, str]:
    """`last_output_at` of a running run, and `stalled_since` once it wrote nothing for stall_after."""
    moment = last_output(record, store)
    if moment is None:
        return {}
    facts = {"last_output_at": rfc3339(datetime.fromtimestamp(moment, UTC))}
    after = stall_after_ms(record)
    # silent by design while a usage limit resets (docs/cli.md#waiting-out-a-usage-limit)
    waiting = bool(record.waits) and not record.worker_pid
    if after > 0 and not waiting and (time.time() - moment) * limits.MS_PER_SECOND >= after:
        facts["stalled_since"] = rfc3339(datetime.fromtimestamp(moment + after / limits.MS_PER_SECOND, UTC))
    return facts


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


def kept_home_id(store: Store) -> str | None:
    """This machine's WB_HOME identity when it has one; creates nothing."""
    try:
        return read_private(store.home / HOME_ID, 256).decode().strip() or None
    except (WbError, OSError, UnicodeDecodeError):
        return None


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
