"""The confined worker (docs/security.md#confined-runs): the bubblewrap command line around a harness's own.

The owner starts every harness (`command` included) through `bwrap` when the run's sandbox mode
allows it and bubblewrap is usable here (courier/runs/bwrap_probe.py). Inside:

* **Mounts.** `--ro-bind / /` first, then overlays: the system stays visible and read-only as it
  is (a harness or its interpreter may live anywhere: /usr, /opt, /tmp), which is simpler and
  harder to get wrong than listing what a CLI needs; then the homes (HOME, /home, /root, wb's
  home) and where Unix sockets live (/run, /tmp's socket directories) are covered with empty
  tmpfs, made read-only once the few paths a run needs are bound back into them: the harness's
  install dir, node's, wb's own interpreter (the in-sandbox forwarder below runs on it) read-only;
  the worktree, its git admin dir, the clone's objects, the harness home, a private TMPDIR and the
  configured writable paths read-write.
* **Git.** The canonical clone's git dir is bound back read-only (config, hooks, HEAD, packed
  refs, every ref), with `objects` and `worktrees/<name>` writable over it so status, diff and add
  work, and what `git stash` writes (see _git_binds); the folder of the run's own branch and its
  reflog are the run's private copies, which the owner carries the own branch back from
  (courier/runs/own_branch.py): two mounts, whatever the number of branches.
* **Processes.** New PID, IPC and mount namespaces with `/proc` of the new PID namespace;
  `--die-with-parent`. Not `--new-session`: the owner signals the worker's process group
  (stop, timeout, stall, budget) and bubblewrap's command would leave it; the worker has no
  controlling terminal to inject into (the owner runs in its own session, stdio on pipes).
* **Network.** A new network namespace has only its own loopback. The owner's relay (and the
  CONNECT proxy for `network: [hosts]`) listen on Unix sockets in a private directory bound
  into the sandbox; courier/runs/sandbox_forwarder.py, started inside before the harness,
  listens on 127.0.0.1:PORT there (the port the relay has outside, so the provider's base_url
  reads the same inside and out) and carries each connection to its socket.
  `network: true` keeps the machine's network (no --unshare-net).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import socket
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from courier.errors import NotStartable
from courier.runs import own_branch
from protocol import limits

if TYPE_CHECKING:
    from courier.config import Config
    from courier.runs.bwrap_probe import BwrapProbe
    from courier.runs.store import Record
    from protocol.models import Sandbox

FORWARDER = Path(__file__).with_name("sandbox_forwarder.py")
_WB_CODE = Path(__file__).resolve().parents[2]  # where the courier and protocol packages are
SOCKETS_DIR = "sockets"
TMP_DIR = "tmp"
RELAY_SOCKET = "relay.sock"
PROXY_SOCKET = "proxy.sock"
PROXY_PORTS = (3128, 3129)  # the proxy's port inside the sandbox's own loopback: any but the relay's


@dataclass(frozen=True)
class Setting:
    """The sandbox mode in force for one profile on this machine, where it came from, the extra writable paths."""

    mode: str
    source: str
    writable: tuple[str, ...] = ()


def setting_for(config: Config, profile_name: str) -> Setting:
    """The profile's `sandbox` and `sandbox_writable`, else wb.yaml's `sandbox:` section (docs/config.md#sandbox)."""
    profile = config.profile(profile_name)
    mode: str
    if profile.sandbox is not None:
        mode, source = profile.sandbox, f"profile {profile_name}"
    else:
        mode, source = config.sandbox_default, "wb.yaml's sandbox.default"
    writable = tuple(profile.sandbox_writable) if profile.sandbox_writable is not None else config.sandbox_writable
    return Setting(mode, source, writable)


def machine_name() -> str:
    return socket.gethostname() or "this machine"


def required_refusal(reason: str | None) -> str:
    return (
        f"sandbox required but bubblewrap is not usable on {machine_name()}: {reason} "
        "(install bubblewrap, or set sandbox: auto)"
    )


def refuse_unless_startable(setting: Setting) -> None:
    """`required` without a usable bubblewrap: not startable (exit 1), before anything is created."""
    if setting.mode != "required":
        return
    from courier.runs import bwrap_probe

    found = bwrap_probe.usable(os.environ.get("PATH"))
    if not found.usable:
        raise NotStartable(required_refusal(found.reason))


def network_label(network: bool | list[str]) -> Literal["provider", "all"] | list[str]:
    if network is True:
        return "all"
    return list(network) if isinstance(network, list) else "provider"


def decide(record: Record, found: BwrapProbe | None) -> Sandbox:
    """How this run's worker runs: confined with its network, or not and why. `found` is None for mode off.

    NotStartable when the mode is `required` and bubblewrap is not usable.
    """
    from protocol.models import Sandbox

    if record.sandbox_mode == "off":
        return Sandbox(kind="none", reason=f"off in {record.sandbox_source or 'the run'}")
    assert found is not None
    if not found.usable:
        if record.sandbox_mode == "required":
            raise NotStartable(required_refusal(found.reason))
        return Sandbox(kind="none", reason=found.reason)
    return Sandbox(kind="bwrap", network=network_label(record.network))


@dataclass
class Plan:
    """What one confined worker may see and touch; `command_line` turns it into bwrap's argv."""

    bwrap: str
    worktree: str
    run_dir: Path
    harness_home: Path
    wb_home: Path
    path_env: str
    writable: tuple[str, ...] = ()
    share_network: bool = False
    # (port inside, socket file name in the run's sockets dir): the forwarder's listeners.
    forwards: list[tuple[int, str]] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)  # single files written inside (codex's last message)
    # A continued run's harness home is a copy of its parent's, whose paths the harness's own state names
    # (Codex's session index): the copy is also bound at the parent's path, so they lead to the copy.
    parent_home: Path | None = None
    # Directories directly in the machine's /tmp that the harness makes whatever TMPDIR says (Codex's
    # /tmp/codex-daemon-<uid>, before its own sandbox starts): /tmp stays read-only, and each of these is
    # the run's own directory bound over an empty one of the user's (`prepare`).
    tmp_dirs: list[str] = field(default_factory=list)
    # The worktree's git dirs as the owner trusts them (own_branch.git_dirs): None binds nothing of git.
    git: own_branch.GitDirs | None = None
    # The run's own branch as the worker's copy (`snapshot_branch`, before each worker; courier/runs/own_branch.py).
    branch: own_branch.OwnBranch | None = None

    # The directories the last command line covered: one may go away before bubblewrap mounts over it.
    hidden: list[str] = field(default_factory=list)

    def hidden_gone(self) -> list[str]:
        """The covered directories no longer there: bubblewrap cannot mount over them (it says "Can't mkdir")."""
        return [path for path in self.hidden if not os.path.isdir(path)]

    @property
    def socket_dir(self) -> Path:
        return self.run_dir / SOCKETS_DIR

    @property
    def tmp_dir(self) -> Path:
        return self.run_dir / TMP_DIR

    def _private(self, path: str) -> Path:
        """Where the run's own copy of /tmp's `path` is: in its private TMPDIR, removed with it."""
        return self.tmp_dir / ("slash-tmp-" + os.path.basename(path))

    def prepare(self) -> None:
        """The run's own directories the sandbox binds (made by the user, 0700)."""
        for directory in (self.tmp_dir, self.socket_dir, self.harness_home):
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.tmp_dirs = [tmp for tmp in self.tmp_dirs if _own_tmp_dir(tmp)]
        for tmp in self.tmp_dirs:
            self._private(tmp).mkdir(mode=0o700, exist_ok=True)
        for path in self.files:
            if not path.exists():
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                os.close(fd)

    def cleanup(self) -> None:
        """The private TMPDIR, the sockets and the branch's copy are the worker's while it runs, no longer
        (the owner has carried the branch back first: `carry_branch`)."""
        for directory in (self.tmp_dir, self.socket_dir, self.run_dir / own_branch.COPY_DIR):
            shutil.rmtree(directory, ignore_errors=True)
        if self.branch is not None:
            shutil.rmtree(self.branch.root, ignore_errors=True)
        self.branch = None

    def snapshot_branch(self) -> None:
        """Copy the folder of the worktree's branch, and its reflog, for the next worker, as they are now."""
        if self.branch is not None:  # an earlier worker's (before a usage-limit wait), carried back already
            shutil.rmtree(self.branch.root, ignore_errors=True)
        self.branch = own_branch.snapshot(self.git, self.run_dir) if self.git else None

    def carry_branch(self, patience_s: float = 0.0, *, when_changed: bool = False) -> list[str]:
        """Carry the own branch back from the worker's copy (compare-and-swap); warnings not given before."""
        branch = self.branch
        if branch is None or (when_changed and not branch.changed()):
            return []
        return branch.sync(patience_s)

    def command_line(self, argv: list[str], status_fd: int | None = None) -> list[str]:
        """bubblewrap's argv around `argv`; with `status_fd`, bubblewrap reports there whether the worker ran."""
        hidden = _hidden_roots(self.wb_home)
        self.hidden = hidden
        out = [self.bwrap, "--die-with-parent", "--unshare-pid", "--unshare-ipc"]
        if status_fd is not None:
            out += ["--json-status-fd", str(status_fd)]
        lock = _root_lock()
        if lock == _DROP_ALL:
            out += _DROP_ALL
        elif lock:
            out.append("--unshare-user")  # and `lock` starts the harness in one more (see _root_lock)
        if not self.share_network:
            out.append("--unshare-net")
        out += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        for root in hidden:
            out += ["--tmpfs", root]
        reads = _needed_reads(argv, self.path_env, hidden, bool(self.forwards))
        writes = [self.worktree, *self.writable, str(self.harness_home), str(self.tmp_dir)]
        binds: list[tuple[str, str, str]] = [("--ro-bind", path, path) for path in reads]
        binds += [("--bind", path, path) for path in writes + [str(p) for p in self.files]]
        binds += _git_binds(self.git, self.branch)
        if self.forwards:
            binds.append(("--ro-bind", str(self.socket_dir), str(self.socket_dir)))
        if self.parent_home is not None:
            binds.append(("--bind", str(self.harness_home), str(self.parent_home)))
        binds += [("--bind", str(self._private(path)), path) for path in self.tmp_dirs]
        binds += [("--ro-bind", "/dev/null", path) for path in _tmp_sockets()]
        if self.share_network:
            # The machine's network needs its resolver, which may live in /run (systemd-resolved, resolvconf).
            resolver = os.path.realpath("/etc/resolv.conf")
            if any(_within(resolver, root) for root in hidden):
                binds.append(("--ro-bind", resolver, resolver))
        for option, source, target in _ordered(binds):
            if os.path.lexists(source):
                # `-try`: a path gone since it was listed (another run's branch lock renamed) is not an error
                out += [f"{option}-try", source, target]
        for root in hidden:
            out += ["--remount-ro", root]
        out += ["--chdir", self.worktree, "--"]
        if lock and lock != _DROP_ALL:
            out += lock
        if self.forwards:
            interpreter = os.path.realpath(sys.executable)
            listens = [f"{port}={self.socket_dir / name}" for port, name in self.forwards]
            out += [interpreter, "-I", "-S", str(FORWARDER), str(limits.RELAY_READ_CHUNK_BYTES), *listens, "--"]
        return out + argv


_DROP_ALL = ["--cap-drop", "ALL"]


def worker_ran(status: bytes) -> bool:
    """Whether bubblewrap's --json-status-fd report says the worker ran: it reports the worker's exit code,
    never one for a sandbox it could not set up."""
    return b'"exit-code"' in status


def _root_lock() -> list[str]:
    """What keeps a worker started as root from undoing its sandbox; nothing for an ordinary user.

    Root keeps its capabilities inside bubblewrap: with CAP_SYS_ADMIN it could unmount the tmpfs over
    a home or remount / read-write. Dropping them all would also stop Codex's own sandbox, which makes
    namespaces of its own. So as root the sandbox gets its own user namespace, and the harness starts
    in one more (`unshare --user --map-root-user --mount`): the mounts it inherits are then locked by
    the kernel (no unmount, no remount read-write) while it keeps the capabilities of its own
    namespaces for a sandbox of its own. Without util-linux's `unshare`, every capability is dropped.
    """
    if os.geteuid() != 0:
        return []
    found = shutil.which("unshare")
    if found is None:
        return _DROP_ALL
    return [found, "--user", "--map-root-user", "--mount", "--"]


def _hidden_roots(wb_home: Path) -> list[str]:
    """The homes covered with an empty tmpfs inside, shallowest first, each once (a nested one is covered already)."""
    candidates = [os.environ.get("HOME", ""), "/home", "/root", str(wb_home), "/run/user"]
    roots: list[str] = []
    for candidate in sorted({os.path.realpath(c) for c in candidates if c}, key=len):
        if os.path.isdir(candidate) and candidate != "/" and not any(_within(candidate, root) for root in roots):
            roots.append(candidate)
    # A socket on a read-only mount still accepts connections, and a Unix socket is not behind the
    # network namespace: /run (docker.sock, dbus, databases; /var/run is a link to it) is hidden, and so
    # is every directory directly in /tmp that holds one (an ssh agent's, X11's, tmux's).
    run = os.path.realpath("/run")
    if os.path.isdir(run) and not any(_within(run, root) for root in roots):
        roots = [root for root in roots if not _within(root, run)] + [run]
    roots += [path for path in _tmp_socket_dirs() if not any(_within(path, root) for root in roots)]
    return roots


def _tmp_socket_dirs() -> list[str]:
    """The directories directly in /tmp with a socket (or an ssh agent's name) among their first entries."""
    found: list[str] = []
    with contextlib.suppress(OSError), os.scandir("/tmp") as entries:
        for entry in itertools.islice(entries, limits.SANDBOX_TMP_SCAN_ENTRIES):
            with contextlib.suppress(OSError):
                if not entry.is_dir(follow_symlinks=False):
                    continue
                if entry.name.startswith("ssh-") or _holds_socket(entry.path):
                    found.append(entry.path)
    return sorted(found)


def _holds_socket(directory: str) -> bool:
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        for entry in itertools.islice(entries, limits.SANDBOX_TMP_SCAN_ENTRIES):
            with contextlib.suppress(OSError):
                if stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode):
                    return True
    return False


def _tmp_sockets() -> list[str]:
    """Sockets directly in /tmp: each is covered with /dev/null inside (a file cannot take a tmpfs)."""
    found: list[str] = []
    with contextlib.suppress(OSError), os.scandir("/tmp") as entries:
        for entry in itertools.islice(entries, limits.SANDBOX_TMP_SCAN_ENTRIES):
            with contextlib.suppress(OSError):
                if stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode):
                    found.append(entry.path)
    return sorted(found)


def _own_tmp_dir(path: str) -> bool:
    """`path` (directly in /tmp) is a directory of this user's, made now (0700) when it is missing; anything else
    there (another user's, a link, a file) is left alone and not bound over (the harness then fails as it sees it)."""
    return own_branch.users_directory(path)


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _needed_reads(argv: list[str], path_env: str, hidden: list[str], forwarder: bool) -> list[str]:
    """Read-only paths inside hidden roots that the harness needs: its install dir, its interpreter's, node's,
    and wb's own interpreter (the forwarder's)."""
    programs = [argv[0]] if argv else []
    interpreter = _shebang_program(argv[0], path_env) if argv else None
    if interpreter:
        programs.append(interpreter)
    programs.append("node")
    roots: list[str] = []
    for program in programs:
        found = program if os.path.isabs(program) else shutil.which(program, path=path_env)
        if found:
            roots += _install_roots(found, hidden)
    # wb's own interpreter and code, read-only: the forwarder runs on it, and so does a harness that is
    # a wb module (`python -m courier.demo.standin_claude`, the demo's stand-ins) from a venv or a
    # checkout that may sit in a hidden home.
    roots += [os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix), str(_WB_CODE)]
    if forwarder:
        roots.append(str(FORWARDER))
    # Only what lies inside a hidden root needs binding back, and never a hidden root as a whole.
    return [root for root in dict.fromkeys(roots) if root not in hidden and any(_within(root, h) for h in hidden)]


def _install_roots(found: str, hidden: list[str]) -> list[str]:
    """Where an executable is installed: `<prefix>` for `<prefix>/bin/x` or `<prefix>/shims/x`, else its directory;
    both for the path as found and for the file it resolves to. Never a hidden root itself (a script in ~/ binds
    only itself)."""
    roots = []
    for candidate in dict.fromkeys((found, os.path.realpath(found))):
        parent = os.path.dirname(candidate)
        # `<prefix>/bin/x`, or a version manager's `<root>/shims/x` (pyenv, rbenv, asdf: the shim runs the manager)
        root = os.path.dirname(parent) if os.path.basename(parent) in ("bin", "shims") else parent
        if any(_within(h, root) for h in hidden):
            root = candidate
        roots.append(root)
    return roots


def _shebang_program(program: str, path_env: str) -> str | None:
    """The interpreter a script names on its first line (`#!/usr/bin/env python3` → `python3`)."""
    found = program if os.path.isabs(program) else shutil.which(program, path=path_env)
    if not found:
        return None
    try:
        with open(found, "rb") as handle:
            first = handle.readline(256)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode("utf-8", "replace").split()
    if not words:
        return None
    if os.path.basename(words[0]) == "env":
        rest = [word for word in words[1:] if not word.startswith("-")]
        return rest[0] if rest else None
    return words[0]


def _git_binds(dirs: own_branch.GitDirs | None, branch: own_branch.OwnBranch | None) -> list[tuple[str, str, str]]:
    """Git's binds for a linked worktree, by depth: a writable directory before the read-only ones inside it.

    `git stash` writes `refs/stash` and its log, each by a lock file created beside it, so `refs/`,
    `logs/` and `logs/refs/` are writable, with every directory below them (heads, tags, remotes, …)
    read-only on top: no other ref moves. The folder of the run's own branch and its reflog are the
    run's copies instead (courier/runs/own_branch.py), where git moves the branch (a commit, the
    `reset --hard` of a stash): a constant number of mounts, whatever the number of branches.
    """
    if dirs is None:
        return []  # not a linked worktree: nothing of git beyond the worktree itself
    common, logs = dirs.common, dirs.logs
    copies = branch.binds() if branch is not None else []
    own = {target for _, _, target in copies}
    read_only, writable = [common], [os.path.join(common, "objects"), dirs.admin]
    for top in (os.path.join(common, "refs"), logs, os.path.join(logs, "refs")):
        writable.append(top)
        read_only += [path for path in _subdirs(top) if path != os.path.join(logs, "refs") and path not in own]
    binds = [("--ro-bind", path, path) for path in read_only] + [("--bind", path, path) for path in writable]
    return sorted(binds + copies, key=lambda bind: (bind[2].count("/"), bind[0] == "--ro-bind"))


def _subdirs(path: str) -> list[str]:
    try:
        return [entry.path for entry in os.scandir(path) if entry.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _ordered(binds: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """Shallow targets first, so a deeper bind lands on top of the one that holds it."""
    return sorted(dict.fromkeys(binds), key=lambda bind: bind[2].rstrip("/").count("/"))
