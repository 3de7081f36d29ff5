"""A confined run's own branch (docs/security.md#confined-runs): a private copy of its folder, carried back.

A confined worker may move its own branch (a commit, `reset`, the `reset --hard` of `git stash`) and no
other ref. Git moves a branch by writing `<name>.lock` beside it and renaming it over `<name>`, so the
folder that holds the branch must be writable to it. Binding every other branch file of that folder (and
of its reflog's) read-only on top cost two mounts per branch of the clone, and bubblewrap's start grows
with its mounts (docs/benchmarks.md#confinement).

Instead, before the worker starts, the owner copies the branch's folder (`refs/heads/wb/`: its regular
files and directories, never a link) into a private directory of the run, and the sandbox binds the copy
writable over the real folder; and the branch's reflog, which git only appends to, is a copy of that one
file bound over it. Two mounts, whatever the number of branches. Inside, the worker sees every branch as
it was (and every other reflog, read-only, as it is) and moves its own in the copy; what else it writes
there stays there.

The owner, outside, carries the own branch back (`OwnBranch.sync`): the ref's new value and its
reflog's new lines, and nothing else of the copy. It takes git's own lock (`<name>.lock`, created
exclusively; a lock held elsewhere is waited for briefly, then tried again later), appends the lines,
writes the value into the lock and renames it over the ref, as git does; and only while the real ref
still holds the value of the snapshot or of the last sync (compare-and-swap): a branch moved outside
meanwhile is left as it is, with a warning that names the run's commit.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from protocol import limits

# Where a run's copy lives: `refs`, the copy of the branch's folder, and `log`, of its reflog (`_fresh_dir`).
SHM = "/dev/shm"
COPY_DIR = "own-branch"  # in the run's directory, where the machine has no shared-memory tmpfs to trust
HEADS = "refs/heads/"
_VALUE = re.compile(rb"([0-9a-f]{40}(?:[0-9a-f]{24})?)\n?")  # a SHA-1 or SHA-256 object name
_LOG_LINE = re.compile(rb"[0-9a-f]{40}(?:[0-9a-f]{24})? [0-9a-f]{40}(?:[0-9a-f]{24})? [^\n]*\n")
_VALUE_READ = 66  # a SHA-256 name, its newline, and one byte more to see that there is more
_UNREADABLE = b"?"  # a real ref that is no object name (a symbolic ref, a link): never a base to swap from
_LOCK = ".lock"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True)
class GitDirs:
    """A linked worktree's git directories: its admin dir, the clone's common dir, its branch if it is on one."""

    admin: str
    common: str
    ref: str | None  # `refs/heads/…`; None on a detached HEAD

    @property
    def logs(self) -> str:
        return os.path.join(self.common, "logs")


def git_dirs(worktree: str, *, clone_git: str | None = None, branch: str | None = None) -> GitDirs | None:
    """The git directories of a linked worktree (its `.git` is a `gitdir:` file); None for anything else.

    The worktree's files are the worker's to write, and what they name becomes writable inside the
    next worker's sandbox and written by the owner outside: so the admin dir must be one of the
    clone's `worktrees/<name>` (its `commondir` is not read), the clone must be `clone_git` (the
    owner's, from where wb put the worktree), and the branch is the run's record's when it has one.
    Without one (a run in an existing worktree), the branch HEAD names is taken unless another
    worktree or the clone has it checked out (then it is another run's, or the clone's `main`).
    """
    admin = _admin_dir(worktree)
    if admin is None:
        return None
    common = os.path.dirname(os.path.dirname(admin))
    if os.path.basename(os.path.dirname(admin)) != "worktrees":
        return None
    if clone_git is not None and os.path.realpath(common) != os.path.realpath(clone_git):
        return None
    if branch is not None:
        ref: str | None = HEADS + branch
    else:
        ref = _head_ref(admin)
        if ref is not None and ref in _checked_out_elsewhere(common, admin):
            ref = None
    return GitDirs(admin, common, ref if ref is not None and _safe_branch(ref) else None)


def _admin_dir(worktree: str) -> str | None:
    try:
        text = Path(worktree, ".git").read_text(errors="replace")
    except OSError:
        return None
    if not text.startswith("gitdir:"):
        return None
    return os.path.normpath(os.path.join(worktree, text.split(":", 1)[1].strip()))


def _head_ref(git_dir: str) -> str | None:
    """The branch a HEAD file names; None for a detached or unreadable HEAD."""
    try:
        head = Path(git_dir, "HEAD").read_text(errors="replace").strip()
    except OSError:
        return None
    return head[len("ref: ") :] if head.startswith("ref: " + HEADS) else None


def _checked_out_elsewhere(common: str, admin: str) -> set[str]:
    """The branches the clone and its other worktrees have checked out."""
    found = {_head_ref(common)}
    with contextlib.suppress(OSError), os.scandir(os.path.join(common, "worktrees")) as entries:
        found |= {_head_ref(entry.path) for entry in entries if entry.path != admin}
    return {ref for ref in found if ref is not None}


_REF_PART = re.compile(r"[^\x00-\x20\x7f~^:?*\[\\]+")


def _safe_branch(ref: str) -> bool:
    """`refs/heads/…` as git allows a branch name (git check-ref-format): no part empty, led by a dot (`..`
    included) or ending in `.lock`, no character git refuses; so it never leads out of the folders it names."""
    if not ref.startswith(HEADS) or ref.endswith(".") or "@{" in ref:
        return False
    parts = ref[len(HEADS) :].split("/")
    return all(part and part[0] != "." and not part.endswith(_LOCK) and _REF_PART.fullmatch(part) for part in parts)


@dataclass(frozen=True)
class Copy:
    """What the sandbox sees as the run's copy: `real` in the clone, `copy` in the run's directory."""

    real: str
    copy: Path


@dataclass
class OwnBranch:
    """The run's branch, its copies, and what of it has been carried back (see the module's docstring)."""

    dirs: GitDirs
    ref: str
    root: Path  # the run's private directory that holds the copies (`_fresh_dir`)
    refs: Copy  # the branch's folder
    log: Copy | None  # the branch's reflog file; None when it could not be had (the reflog stays read-only)
    base: bytes | None  # the real ref's value at the snapshot or the last sync; None when it had none
    log_inode: int | None  # the copy of the reflog, and how much of it the real one has
    log_carried: int
    seen: tuple[object, ...] = ()
    warned: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return os.path.basename(self.ref)

    def binds(self) -> list[tuple[str, str, str]]:
        copies = [self.refs] if self.log is None else [self.refs, self.log]
        return [("--bind", str(copy.copy), copy.real) for copy in copies]

    def changed(self) -> bool:
        """The copy's ref or reflog changed since the last completed sync (a stat of each)."""
        return self._look() != self.seen

    def _look(self) -> tuple[object, ...]:
        return _identity(self.refs.copy / self.name), self.log and _identity(self.log.copy)

    def sync(self, patience_s: float = 0.0) -> list[str]:
        """Carry the copy's ref and new reflog lines to the real branch; the warnings not given before.

        With git's lock held elsewhere for longer than `patience_s`, nothing is carried and the next
        sync tries again (`changed` stays true); a warning only when `patience_s` was spent in vain."""
        seen = self._look()
        value = _read_value(self.refs.copy, self.name)
        lines, carried, inode = self._new_log_lines()
        if value == _UNREADABLE:
            return self._warn(f"{self.ref} was not carried back: the run left it holding no commit id")
        moved = value is not None and value != self.base
        if moved or lines:
            try:
                self._swap(value if moved else None, lines, patience_s)
            except _Busy:
                if not patience_s:
                    return []  # the next sync tries again
                return self._warn(
                    self._not_carried(value, f"its lock ({self.ref}.lock) is held by another git process")
                )
            except _Refused as refused:
                self.seen = seen
                return self._warn(self._not_carried(value, str(refused)))
            except OSError as exc:
                self.seen = seen
                return self._warn(self._not_carried(value, str(exc.strerror or exc)))
            self.base = value if moved else self.base
        self.seen, self.log_carried, self.log_inode = seen, carried, inode
        return []

    def _not_carried(self, value: bytes | None, why: str) -> str:
        target = (value or self.base or b"").decode()
        return f"{self.ref} was not carried back to {target}: {why}"

    def _warn(self, text: str) -> list[str]:
        if text in self.warned:
            return []
        self.warned.append(text)
        return [text]

    def _new_log_lines(self) -> tuple[bytes, int, int | None]:
        """The copy's reflog lines not carried yet (whole lines shaped as git writes them), how far that
        reaches, and the file's inode: a reflog rewritten in place of the copied one (a new inode) carries
        nothing of what it held, only what is appended to it from then on."""
        if self.log is None:
            return b"", 0, None
        with _opened(self.log.copy) as fd:
            if fd is None:
                return b"", self.log_carried, self.log_inode
            info = os.fstat(fd)
            known = self.log_inode is None or info.st_ino == self.log_inode
            start = self.log_carried if known else info.st_size
            if info.st_size <= start:
                return b"", info.st_size, info.st_ino
            data = os.pread(fd, min(info.st_size - start, limits.BRANCH_REFLOG_CARRY_MAX_BYTES), start)
        whole = data[: data.rfind(b"\n") + 1]
        kept = b"".join(line for line in whole.splitlines(keepends=True) if _LOG_LINE.fullmatch(line))
        return kept, start + len(whole), info.st_ino

    def _swap(self, value: bytes | None, lines: bytes, patience_s: float) -> None:
        """Under git's lock on the real ref: append `lines` to its reflog and set it to `value` (None: keep it),
        if it still holds `base`. _Busy when the lock stayed held, _Refused when the ref moved outside."""
        folder = _real_folder(self.refs.real)
        try:
            lock = _take_lock(folder, self.name + _LOCK, patience_s)
            renamed = False
            try:
                real = _real_value(folder, self.name, self.dirs.common, self.ref)
                if real != self.base or self.base == _UNREADABLE:
                    shown = "no commit" if real is None else real.decode(errors="replace")
                    keep = f"; `git branch <name> {value.decode()}` keeps the run's commits" if value else ""
                    raise _Refused(f"it moved outside the run (to {shown}) since the run last saw it{keep}")
                if lines and self.log is not None:
                    _append(self.log.real, lines)
                if value is not None:
                    os.write(lock, value + b"\n")
                    os.rename(self.name + _LOCK, self.name, src_dir_fd=folder, dst_dir_fd=folder)
                    renamed = True
            finally:
                os.close(lock)
                if not renamed:  # only ours: after the rename, a lock by that name is someone else's
                    with contextlib.suppress(OSError):
                        os.unlink(self.name + _LOCK, dir_fd=folder)
        finally:
            os.close(folder)


class _Busy(Exception):
    """Git's lock on the real ref stayed held by another process."""


class _Refused(Exception):
    """The real ref no longer holds the value of the snapshot or the last sync."""


def snapshot(dirs: GitDirs, run_dir: Path) -> OwnBranch | None:
    """Copy the folder of the worktree's branch, and its reflog, into a new private directory of the run.

    None on a detached HEAD, or when the branch's folder cannot be had: the sandbox then binds no
    copy and the branch stays read-only inside, as every other ref."""
    if dirs.ref is None:
        return None
    into = _fresh_dir(run_dir)
    refs = Copy(os.path.dirname(os.path.join(dirs.common, dirs.ref)), into / "refs")
    try:
        _make_folder(refs.real)
        _copy_tree(refs.real, refs.copy)
    except OSError:
        shutil.rmtree(into, ignore_errors=True)
        return None
    log = _copy_log(Copy(os.path.join(dirs.logs, dirs.ref), into / "log"))
    log_identity = _identity(log.copy) if log else None
    branch = OwnBranch(
        dirs=dirs,
        ref=dirs.ref,
        root=into,
        refs=refs,
        log=log,
        # What the worker will see, not the real ref read again: a move outside since the copy is then not
        # overwritten by the run's (compare-and-swap against the copied value). A packed branch has no file.
        base=_read_value(refs.copy, os.path.basename(dirs.ref)) or _real_value_at(dirs, refs.real),
        log_inode=log_identity[0] if log_identity else None,
        log_carried=log_identity[1] if log_identity else 0,
    )
    branch.seen = branch._look()
    return branch


def _fresh_dir(run_dir: Path) -> Path:
    """A new private directory (0700) for one copy: in the machine's shared-memory tmpfs when there is one
    to trust, else in the run's directory.

    A copy is one new file per branch, and making a file on the disk is what costs: 25 us to 0.8 ms a
    file on this project's test machine's ext4, as its journal allows, against 10 us steadily on tmpfs
    (docs/benchmarks.md#confinement). The copy lives as long as its worker: `OwnBranch.root` is removed
    when the run ends (courier/runs/sandbox.py, `Plan.cleanup`)."""
    root = _tmpfs_root()
    if root is not None:
        with contextlib.suppress(OSError):
            return Path(tempfile.mkdtemp(prefix=run_dir.name + "-", dir=root))
    into = run_dir / COPY_DIR
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(mode=0o700)
    return into


def _tmpfs_root() -> str | None:
    """This user's directory in /dev/shm (0700, made when missing); None when there is none, or when what is
    there is not a directory of this user's that no one else may enter."""
    path = os.path.join(SHM, f"wb-{os.getuid()}")
    return path if users_directory(path, private=True) else None


def users_directory(path: str, *, private: bool = False) -> bool:
    """`path` is a directory of this user's (not a link), made now (0700) when missing; `private`: and no one
    else may enter it. Anything else there (another user's, a link, a file) is left alone."""
    with contextlib.suppress(OSError):
        os.mkdir(path, 0o700)
    try:
        info = os.lstat(path)
    except OSError:
        return False
    mine = stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()
    return mine and not (private and info.st_mode & 0o077)


def _make_folder(real: str) -> None:
    """The branch's folder, made as git makes it to move the branch when `git gc` packed it and removed it;
    the clone's own path, never the worker's (the worker writes only its copy)."""
    os.makedirs(real, exist_ok=True)


def _copy_log(log: Copy) -> Copy | None:
    """The branch's reflog copied, once there is one to bind over: made empty (as git would make it to move
    the branch) when the clone has none, since inside its folder is read-only and a commit must append to it."""
    try:
        _make_folder(os.path.dirname(log.real))
        os.close(os.open(log.real, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666))
        source = os.open(log.real, _READ_FLAGS)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(source).st_mode):
            return None
        target = os.open(log.copy, _CREATE_FLAGS, 0o600)
        try:
            _copy_data(source, target)
        finally:
            os.close(target)
    except OSError:
        return None
    finally:
        os.close(source)
    return log


def _copy_tree(real: str, copy: Path) -> None:
    """The regular files and directories below `real`, copied into a new private `copy`; never a link, a
    socket, a FIFO or a device (left out), never a lock file (another git process's, not a branch)."""
    source = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        copy.mkdir(mode=0o700)
        target = os.open(copy, _DIR_FLAGS)
        try:
            _copy_entries(source, target)
        finally:
            os.close(target)
    finally:
        os.close(source)


def _copy_entries(source: int, target: int) -> None:
    with os.scandir(source) as entries:
        names = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in entries]
    for name, is_dir in names:
        if is_dir:
            _copy_folder(name, source, target)
        elif not name.endswith(_LOCK):
            _copy_file(name, source, target)


def _copy_folder(name: str, source: int, target: int) -> None:
    try:
        inner = os.open(name, _DIR_FLAGS, dir_fd=source)  # O_NOFOLLOW: a link put there since is not followed
    except OSError:
        return
    try:
        os.mkdir(name, 0o700, dir_fd=target)
        made = os.open(name, _DIR_FLAGS, dir_fd=target)
        try:
            _copy_entries(inner, made)
        finally:
            os.close(made)
    finally:
        os.close(inner)


def _copy_file(name: str, source: int, target: int) -> None:
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=source)
    except OSError:
        return  # a link (O_NOFOLLOW), or gone since it was listed
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return
        out = os.open(name, _CREATE_FLAGS, 0o600, dir_fd=target)
        try:
            _copy_data(fd, out)
        finally:
            os.close(out)
    finally:
        os.close(fd)


def _copy_data(source: int, target: int) -> None:
    while chunk := os.read(source, limits.READ_CHUNK_BYTES):
        _write_all(target, chunk)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


@contextlib.contextmanager
def _opened(path: Path) -> Iterator[int | None]:
    """`path` opened for reading when it is a regular file and not a link; else None."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError:
        yield None
        return
    try:
        yield fd if stat.S_ISREG(os.fstat(fd).st_mode) else None
    finally:
        os.close(fd)


def _identity(path: Path) -> tuple[int, int, int] | None:
    """(inode, size, mtime) of a file, not following a link; None when there is none."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return info.st_ino, info.st_size, info.st_mtime_ns


def _read_value(folder: Path, name: str) -> bytes | None:
    """The object name a ref file of the copy holds; None without a file; _UNREADABLE for anything else."""
    with _opened(folder / name) as fd:
        if fd is None:
            return None if not os.path.lexists(folder / name) else _UNREADABLE
        return _value_of(os.read(fd, _VALUE_READ))


def _value_of(text: bytes) -> bytes:
    found = _VALUE.fullmatch(text)
    return found.group(1) if found else _UNREADABLE


def _real_folder(real: str) -> int:
    _make_folder(real)  # `git pack-refs` outside may have removed it since the snapshot
    return os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def _real_value_at(dirs: GitDirs, real: str) -> bytes | None:
    assert dirs.ref is not None
    folder = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return _real_value(folder, os.path.basename(dirs.ref), dirs.common, dirs.ref)
    finally:
        os.close(folder)


def _real_value(folder: int, name: str, common: str, ref: str) -> bytes | None:
    """The real ref's value as git reads it: its loose file, else its line in packed-refs; None when neither."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=folder)
    except FileNotFoundError:
        return _packed_value(common, ref)
    except OSError:
        return _UNREADABLE  # a link (a symbolic ref of old), or unreadable
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return _UNREADABLE
        return _value_of(os.read(fd, _VALUE_READ))
    finally:
        os.close(fd)


def _packed_value(common: str, ref: str) -> bytes | None:
    suffix = b" " + ref.encode() + b"\n"
    try:
        with open(os.path.join(common, "packed-refs"), "rb") as packed:
            for line in packed:
                if line.endswith(suffix) and not line.startswith((b"#", b"^")):
                    return _value_of(line[: -len(suffix)])
    except FileNotFoundError:
        return None
    return None


def _take_lock(folder: int, name: str, patience_s: float) -> int:
    """Git's lock on a ref (`<name>.lock`, created exclusively); waited for up to `patience_s`, else _Busy."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            return os.open(
                name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=folder
            )
        except FileExistsError:
            if time.monotonic() >= deadline:
                raise _Busy from None
            time.sleep(limits.BRANCH_LOCK_RETRY_S)


def _append(real: str, lines: bytes) -> None:
    """Lines at the end of the real reflog, as git appends them (O_APPEND)."""
    fd = os.open(real, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    try:
        _write_all(fd, lines)
    finally:
        os.close(fd)
