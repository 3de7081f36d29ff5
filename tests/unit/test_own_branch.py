"""A confined run's own branch (courier/runs/own_branch.py, docs/security.md#confined-runs): the private copy
of its folders, what the owner carries back from it (the own branch only, compare-and-swap, under git's lock),
and a bubblewrap command line whose mounts do not grow with the branches of the clone. Real git, no bubblewrap:
the copy is written here as a worker would write it inside."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from conftest import git, make_clone

from courier.runs import own_branch, sandbox


@pytest.fixture(autouse=True)
def _private_shm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The copies these tests make go to their own directory, not the machine's /dev/shm."""
    (tmp_path / "shm").mkdir()
    monkeypatch.setattr(own_branch, "SHM", str(tmp_path / "shm"))


def _worktree(tmp_path: Path, branch: str = "wb/run", others: int = 2) -> tuple[Path, Path]:
    """A clone with `others` other `wb/` branches (loose refs with reflogs) and a linked worktree on `branch`."""
    clone = make_clone(tmp_path / "clone")
    lines = "".join(f"create refs/heads/wb/other{index} HEAD\n" for index in range(others))
    if others:
        _git_stdin(clone, lines, "update-ref", "--create-reflog", "--stdin")
    worktree = tmp_path / "worktree"
    git(clone, "worktree", "add", "-q", "-b", branch, str(worktree))
    return clone, worktree


def _git_stdin(cwd: Path, text: str, *args: str) -> None:
    import subprocess

    env = {**os.environ, "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    subprocess.run(["git", *args], cwd=cwd, input=text, text=True, env=env, check=True, capture_output=True)


def _commit(worktree: Path, message: str = "work") -> str:
    """A commit object on top of HEAD, written without moving any ref (as the worker's git writes objects)."""
    tree = git(worktree, "write-tree").strip()
    return git(worktree, "commit-tree", tree, "-p", "HEAD", "-m", message).strip()


def _snapshot(worktree: Path, run_dir: Path) -> own_branch.OwnBranch:
    dirs = own_branch.git_dirs(str(worktree))
    assert dirs is not None
    run_dir.mkdir(parents=True, exist_ok=True)
    branch = own_branch.snapshot(dirs, run_dir)
    assert branch is not None
    return branch


def _move_in_copy(branch: own_branch.OwnBranch, old: str, new: str) -> None:
    """What git does inside to move the own branch: its file in the copy rewritten, a line appended to the copy
    of its reflog."""
    (branch.refs.copy / branch.name).write_text(new + "\n")
    assert branch.log is not None
    with open(branch.log.copy, "a") as log:
        log.write(f"{old} {new} t <t@example.com> 1700000000 +0000\tcommit: work\n")


def _rev(clone: Path, ref: str) -> str:
    return git(clone, "rev-parse", ref).strip()


def test_the_copy_holds_each_branch_file_and_folder_privately_and_nothing_else(tmp_path: Path) -> None:
    """The copy has every branch of the folder (nested folders too) as it was, and the own reflog, 0700; a link,
    a FIFO and a lock file in the real folder are left out, so a link is never followed out of the clone."""
    clone, worktree = _worktree(tmp_path)
    heads = clone / ".git" / "refs" / "heads" / "wb"
    git(clone, "branch", "wb/deeper/one")
    secret = tmp_path / "secret"
    secret.write_text("not a ref\n")
    (heads / "link").symlink_to(secret)
    os.mkfifo(heads / "fifo")
    (heads / "other0.lock").write_text("held\n")
    branch = _snapshot(worktree, tmp_path / "run")
    copy = branch.refs.copy
    assert sorted(os.listdir(copy)) == ["deeper", "other0", "other1", "run"]
    assert (copy / "deeper" / "one").read_text() == (heads / "deeper" / "one").read_text()
    assert (copy / "other1").read_text() == (heads / "other1").read_text()
    assert branch.log is not None
    assert branch.log.copy.read_text() == (clone / ".git" / "logs" / "refs" / "heads" / "wb" / "run").read_text()
    for path in (branch.root, copy, copy / "deeper"):
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o700, path
    for path in (copy / "run", branch.log.copy):
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600, path


def test_the_own_branch_is_carried_back_with_its_new_reflog_lines(tmp_path: Path) -> None:
    """A commit in the copy moves the real branch (by git's lock, renamed over the ref) and appends the new
    reflog lines to the real reflog; a line not shaped as git writes one is not carried."""
    clone, worktree = _worktree(tmp_path)
    branch = _snapshot(worktree, tmp_path / "run")
    before = _rev(clone, "wb/run")
    log = clone / ".git" / "logs" / "refs" / "heads" / "wb" / "run"
    lines = log.read_text().count("\n")
    new = _commit(worktree)
    _move_in_copy(branch, before, new)
    assert branch.log is not None
    with open(branch.log.copy, "a") as copy_log:
        copy_log.write("not a reflog line\n")
    assert branch.changed()
    assert branch.sync() == []
    assert _rev(clone, "wb/run") == new and not (log.parent / "run.lock").exists()
    assert log.read_text().count("\n") == lines + 1 and f"{before} {new} " in log.read_text()
    assert "not a reflog line" not in log.read_text()
    assert not branch.changed() and branch.sync() == []  # nothing new: nothing carried twice
    assert log.read_text().count("\n") == lines + 1


def test_only_the_own_branch_is_carried_never_another_written_in_the_copy(tmp_path: Path) -> None:
    """Another branch moved, a branch made and a branch removed in the copy stay in the copy."""
    clone, worktree = _worktree(tmp_path)
    branch = _snapshot(worktree, tmp_path / "run")
    other = _rev(clone, "wb/other0")
    new = _commit(worktree)
    (branch.refs.copy / "other0").write_text(new + "\n")
    (branch.refs.copy / "made").write_text(new + "\n")
    (branch.refs.copy / "other1").unlink()
    assert not branch.changed()  # the own branch's copies are as they were: nothing to look at
    assert branch.sync() == []
    assert _rev(clone, "wb/other0") == other and _rev(clone, "wb/other1") == other
    assert not (clone / ".git" / "refs" / "heads" / "wb" / "made").exists()


def test_a_clone_without_the_branchs_reflog_gets_an_empty_one_to_append_to(tmp_path: Path) -> None:
    """Inside, the reflog's folder is read-only and git appends to the branch's reflog as it moves it: where the
    clone has none, the owner makes it empty (as git would), and the run's line lands in it."""
    clone, worktree = _worktree(tmp_path)
    log = clone / ".git" / "logs" / "refs" / "heads" / "wb" / "run"
    log.unlink()
    branch = _snapshot(worktree, tmp_path / "run")
    assert branch.log is not None and log.read_text() == "" and branch.log.copy.read_text() == ""
    base = _rev(clone, "wb/run")
    new = _commit(worktree)
    _move_in_copy(branch, base, new)
    assert branch.sync() == [] and _rev(clone, "wb/run") == new
    assert log.read_text().startswith(f"{base} {new} ")


def test_a_branch_moved_outside_meanwhile_is_not_overwritten(tmp_path: Path) -> None:
    """Compare-and-swap: once the real branch no longer holds what the run last saw, the run's move is not
    carried; the warning names the run's commit (once), and the real branch and its reflog stay as they are."""
    clone, worktree = _worktree(tmp_path)
    branch = _snapshot(worktree, tmp_path / "run")
    base = _rev(clone, "wb/run")
    elsewhere = _commit(worktree, "outside")
    git(clone, "update-ref", "refs/heads/wb/run", elsewhere)
    log = clone / ".git" / "logs" / "refs" / "heads" / "wb" / "run"
    kept = log.read_text()
    mine = _commit(worktree, "inside")
    _move_in_copy(branch, base, mine)
    warnings = branch.sync()
    assert len(warnings) == 1 and mine in warnings[0] and elsewhere in warnings[0], warnings
    assert _rev(clone, "wb/run") == elsewhere and log.read_text() == kept
    assert branch.sync(patience_s=0.05) == []  # said once


def test_a_sync_after_the_last_one_swaps_from_the_value_it_carried(tmp_path: Path) -> None:
    """The value compared is the last one carried, not the snapshot's: a run that commits twice moves the
    branch twice, and the branch moved outside after the first carry keeps the second from landing."""
    clone, worktree = _worktree(tmp_path)
    branch = _snapshot(worktree, tmp_path / "run")
    base = _rev(clone, "wb/run")
    first = _commit(worktree, "first")
    _move_in_copy(branch, base, first)
    assert branch.sync() == [] and _rev(clone, "wb/run") == first
    second = _commit(worktree, "second")
    _move_in_copy(branch, first, second)
    assert branch.sync() == [] and _rev(clone, "wb/run") == second
    git(clone, "update-ref", "refs/heads/wb/run", base)
    third = _commit(worktree, "third")
    _move_in_copy(branch, second, third)
    assert branch.sync() and _rev(clone, "wb/run") == base


def test_gits_lock_held_elsewhere_defers_the_sync_and_is_respected(tmp_path: Path) -> None:
    """A `<ref>.lock` held outside is never removed or written: the sync carries nothing and says nothing while
    it may still try again, tries again once the lock is gone, and warns when its patience ran out in vain."""
    clone, worktree = _worktree(tmp_path)
    branch = _snapshot(worktree, tmp_path / "run")
    base = _rev(clone, "wb/run")
    lock = clone / ".git" / "refs" / "heads" / "wb" / "run.lock"
    lock.write_text("another git\n")
    new = _commit(worktree)
    _move_in_copy(branch, base, new)
    assert branch.sync() == [] and _rev(clone, "wb/run") == base
    assert branch.changed()  # not done: the owner's next look tries again
    warnings = branch.sync(patience_s=0.05)
    assert len(warnings) == 1 and "run.lock" in warnings[0] and new in warnings[0], warnings
    assert lock.read_text() == "another git\n" and _rev(clone, "wb/run") == base
    lock.unlink()
    _move_in_copy(branch, new, new)  # the worker touches its copy again: the next look sees a change
    assert branch.changed() and branch.sync() == [] and _rev(clone, "wb/run") == new


def test_a_packed_branch_is_compared_as_git_reads_it(tmp_path: Path) -> None:
    """A branch packed by `git pack-refs` (no loose file, its folder gone) still has its value from packed-refs
    at the snapshot; the folder is made again and the run's move lands as a loose ref."""
    clone, worktree = _worktree(tmp_path, others=0)
    git(clone, "pack-refs", "--all", "--prune")
    assert not (clone / ".git" / "refs" / "heads" / "wb").exists()
    branch = _snapshot(worktree, tmp_path / "run")
    base = _rev(clone, "wb/run")
    assert branch.base == base.encode()
    new = _commit(worktree)
    _move_in_copy(branch, base, new)
    assert branch.sync() == [] and _rev(clone, "wb/run") == new


def test_a_link_or_non_commit_left_as_the_own_ref_in_the_copy_is_not_carried(tmp_path: Path) -> None:
    """The worker writes its copy as it likes: a link there is never followed (O_NOFOLLOW), even to a file that
    holds a commit, and a ref that holds no object name (a symbolic ref) is not carried; one warning says so."""
    clone, worktree = _worktree(tmp_path)
    branch = _snapshot(worktree, tmp_path / "run")
    base = _rev(clone, "wb/run")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text(_commit(worktree) + "\n")
    (branch.refs.copy / "run").unlink()
    (branch.refs.copy / "run").symlink_to(elsewhere)
    warnings = branch.sync()
    assert len(warnings) == 1 and "no commit id" in warnings[0] and _rev(clone, "wb/run") == base
    (branch.refs.copy / "run").unlink()
    (branch.refs.copy / "run").write_text("ref: refs/heads/main\n")
    assert branch.sync() == [] and _rev(clone, "wb/run") == base  # the same warning is not given twice


@pytest.mark.parametrize("branch_name", ["wb/run", "feature"])
def test_the_mounts_do_not_grow_with_the_branches_of_the_clone(tmp_path: Path, branch_name: str) -> None:
    """The bwrap command line for a clone with 200 other `wb/` branches has as many mounts as for one with
    none: the own branch's folder and its reflog are one copy each (a branch in `refs/heads/` itself, too),
    the folder bound writable after the read-only `refs/heads`, and every other branch is only in the copy."""
    counts = []
    for others in (0, 200):
        root = tmp_path / f"others{others}"
        root.mkdir()
        clone, worktree = _worktree(root, branch=branch_name, others=others)
        run_dir = root / "home" / "agents" / "agt-1"
        plan = sandbox.Plan(
            bwrap="/usr/bin/bwrap", worktree=str(worktree), run_dir=run_dir, harness_home=run_dir / "harness-home",
            wb_home=root / "home", path_env="/usr/bin:/bin", git=own_branch.git_dirs(str(worktree)),
        )  # fmt: skip
        plan.prepare()
        plan.snapshot_branch()
        argv = plan.command_line(["/bin/true"])
        mounts = [(word, argv[i + 1], argv[i + 2]) for i, word in enumerate(argv) if word.endswith("bind-try")]
        counts.append(len(mounts))
        folder = os.path.dirname(str(clone / ".git" / "refs" / "heads" / branch_name))
        assert plan.branch is not None
        copy = ("--bind-try", str(plan.branch.refs.copy), folder)
        assert copy in mounts
        heads = mounts.index(copy)
        read_only = [m for m in mounts if m[0] == "--ro-bind-try" and m[2] == str(clone / ".git" / "refs" / "heads")]
        assert read_only == ([] if branch_name == "feature" else [read_only[0]])
        assert all(mounts.index(m) < heads for m in read_only)  # the deeper copy lands on top
        assert not any("/wb/other" in target for _, _, target in mounts)
        log = str(clone / ".git" / "logs" / "refs" / "heads" / branch_name)
        assert ("--bind-try", str(plan.branch.root / "log"), log) in mounts
        plan.cleanup()
        assert not plan.branch and not os.path.exists(copy[1])  # the copy lives as long as its worker
    assert counts[0] == counts[1]


def test_the_git_dirs_are_the_clones_whatever_the_worktrees_files_say(tmp_path: Path) -> None:
    """A worker writes its worktree's `.git` and admin dir: what they name is not bound or written unless it is
    the run's clone's `worktrees/<name>`; its `commondir` is never read; the recorded branch wins over HEAD."""
    clone, worktree = _worktree(tmp_path)
    clone_git = str(clone / ".git")
    dirs = own_branch.git_dirs(str(worktree), clone_git=clone_git, branch="wb/run")
    assert dirs == own_branch.GitDirs(str(clone / ".git" / "worktrees" / "worktree"), clone_git, "refs/heads/wb/run")
    admin = clone / ".git" / "worktrees" / "worktree"
    (admin / "commondir").write_text(str(tmp_path) + "\n")  # the worker's to write: never read
    (admin / "HEAD").write_text("ref: refs/heads/wb/other0\n")
    assert own_branch.git_dirs(str(worktree), clone_git=clone_git, branch="wb/run") == dirs
    other = make_clone(tmp_path / "other")
    git(other, "worktree", "add", "-q", "-b", "wb/x", str(tmp_path / "other-worktree"))
    (worktree / ".git").write_text(f"gitdir: {other / '.git' / 'worktrees' / 'other-worktree'}\n")
    assert own_branch.git_dirs(str(worktree), clone_git=clone_git, branch="wb/run") is None
    (worktree / ".git").write_text(f"gitdir: {tmp_path}\n")
    assert own_branch.git_dirs(str(worktree)) is None  # not a `worktrees/<name>` at all


@pytest.mark.parametrize(
    ("head", "ref"),
    [
        ("ref: refs/heads/wb/run", "refs/heads/wb/run"),
        ("ref: refs/heads/main", None),  # the clone's own checkout
        ("ref: refs/heads/wb/elsewhere", None),  # another worktree's, another run's
        ("ref: refs/heads/wb/../../../config", None),  # out of the branch folders
        ("ref: refs/heads/wb/run.lock", None),
        ("0123456789012345678901234567890123456789", None),  # detached
    ],
)
def test_without_a_recorded_branch_only_a_branch_no_one_else_has_checked_out_is_the_runs(
    tmp_path: Path, head: str, ref: str | None
) -> None:
    """A run in an existing worktree has no recorded branch: HEAD says, but not a branch the clone or another
    worktree has checked out, nor a name git would refuse (a `..` part would lead out of the refs folders)."""
    clone, worktree = _worktree(tmp_path)
    git(clone, "worktree", "add", "-q", "-b", "wb/elsewhere", str(tmp_path / "elsewhere"))
    (clone / ".git" / "worktrees" / "worktree" / "HEAD").write_text(head + "\n")
    dirs = own_branch.git_dirs(str(worktree), clone_git=str(clone / ".git"))
    assert dirs is not None and dirs.ref == ref


def test_a_move_outside_between_the_copy_and_the_workers_start_is_not_overwritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The value compared is the one the worker was given (the copy's), not the real ref read again after the
    copy: a move outside in between is not overwritten by the run's commit."""
    clone, worktree = _worktree(tmp_path)
    copied = _rev(clone, "wb/run")
    elsewhere = _commit(worktree, "outside")
    copy_tree = own_branch._copy_tree

    def copy_then_move(real: str, copy: Path) -> None:
        copy_tree(real, copy)
        git(clone, "update-ref", "refs/heads/wb/run", elsewhere)  # outside, just after the copy

    monkeypatch.setattr(own_branch, "_copy_tree", copy_then_move)
    branch = _snapshot(worktree, tmp_path / "run")
    assert branch.base == copied.encode()
    _move_in_copy(branch, copied, _commit(worktree, "inside"))
    assert branch.sync() and _rev(clone, "wb/run") == elsewhere


def test_the_copy_is_in_a_private_tmpfs_directory_or_else_in_the_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy goes to this user's 0700 directory in /dev/shm (a file there is cheap to make); where that is
    missing or not this user's alone, to the run's own directory."""
    _, worktree = _worktree(tmp_path)
    shm = tmp_path / "shm"  # the machine's, as the fixture sets it
    branch = _snapshot(worktree, tmp_path / "run")
    assert branch.root.parent == shm / f"wb-{os.getuid()}" and branch.root.name.startswith("run-")
    assert stat.S_IMODE(os.lstat(branch.root.parent).st_mode) == 0o700
    os.chmod(branch.root.parent, 0o755)  # another user could enter: not trusted
    assert _snapshot(worktree, tmp_path / "run").root == tmp_path / "run" / own_branch.COPY_DIR
    monkeypatch.setattr(own_branch, "SHM", str(tmp_path / "none"))
    assert _snapshot(worktree, tmp_path / "run").root == tmp_path / "run" / own_branch.COPY_DIR
