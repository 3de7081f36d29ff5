"""Canonical clones and their wb worktrees (docs/config.md#layout-on-every-machine; docs/runs.md#dispatch)."""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from courier.errors import NotStartable, UsageError
from courier.runs.git import CLONE_TIMEOUT_S, run_git
from courier.runs.git_head import head_commit
from protocol.refs import BadName, check_repository

WORKTREES_DIR = ".wb-worktrees"
_EXISTING_SHOWN = 20  # names listed when --use-worktree NAME does not exist (docs/runs.md#dispatch)
_URL_PATH = re.compile(r"(?:^[a-z+]+://[^/]+/|^[^/:@]+@[^:]+:|^[^/:]+:)(?P<path>.+?)(?:\.git)?/?$")


def clone_path(projects_root: Path, repository: str) -> Path:
    owner, repo = repository.split("/", 1)
    return projects_root / owner / repo


def worktree_path(projects_root: Path, repository: str, name: str) -> Path:
    owner, repo = repository.split("/", 1)
    return projects_root / WORKTREES_DIR / owner / repo / name


def clone_of(worktree_dir: str, repository: str, name: str) -> Path | None:
    """The canonical clone of a wb worktree, from where wb put it (`worktree_path`); None when it is not there."""
    worktree = Path(worktree_dir)
    if len(worktree.parents) < 4 or worktree_path(worktree.parents[3], repository, name) != worktree:
        return None
    return clone_path(worktree.parents[3], repository)


def require_clone(projects_root: Path, repository: str) -> Path:
    path = clone_path(projects_root, repository)
    if not (path / ".git").exists():
        raise NotStartable(f"no canonical clone at {path}; clone it there (git clone <url> {path})")
    return path


def repository_from_url(url: str) -> str | None:
    """OWNER/REPO from an ssh, https or scp-style remote URL."""
    match = _URL_PATH.match(url.strip())
    if not match:
        return None
    parts = match.group("path").strip("/").split("/")
    if len(parts) < 2:
        return None
    candidate = "/".join(parts[-2:])
    candidate = candidate.removesuffix(".git")
    try:
        return check_repository(candidate)
    except BadName:
        return None


def origin_repository(cwd: Path) -> str | None:
    done = run_git(["remote", "get-url", "origin"], cwd=cwd, timeout=CLONE_TIMEOUT_S)
    if done.returncode != 0:
        return None
    return repository_from_url(done.stdout.decode("utf-8", "replace"))


def _git_error(done: object) -> str:
    stderr = getattr(done, "stderr", b"") or b""
    text = stderr.decode("utf-8", "replace").strip().splitlines()
    return text[-1] if text else "git failed"


def resolve_base(repo_dir: Path, base: str) -> str:
    if base.startswith("-"):
        raise UsageError(f'--base "{base}" must not start with "-"')
    done = run_git(
        ["rev-parse", "--verify", "--quiet", "--end-of-options", f"{base}^{{commit}}"],
        cwd=repo_dir,
        timeout=CLONE_TIMEOUT_S,
    )
    if done.returncode != 0:
        raise NotStartable(f'--base "{base}" is not a commit in {repo_dir}; fetch it there or name another ref')
    return done.stdout.decode().strip()


def check_branch_name(repo_dir: Path, branch: str) -> None:
    if branch.startswith("-"):
        raise UsageError(f'branch "{branch}" must not start with "-"')
    if _plainly_a_branch_name(branch):
        return  # git would accept it: a run starts one git process sooner (docs/benchmarks.md#dispatch-latency)
    done = run_git(["check-ref-format", "--branch", branch], cwd=repo_dir, timeout=CLONE_TIMEOUT_S)
    if done.returncode != 0:
        raise UsageError(f'git refuses the branch name "{branch}"; choose another with --branch')


# Components of letters, digits, '_' and '-', a dot only between two of them: no rule of
# `git check-ref-format` (no "..", no leading or trailing dot, no "@{", no control or
# special character, no empty component) can refuse it, save the three checked beside it.
_PLAIN_BRANCH = re.compile(r"[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*(?:/[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*)*")


def _plainly_a_branch_name(branch: str) -> bool:
    """A name every git accepts as a new branch's, known without asking git (`wb/<worktree>`, most --branch names)."""
    if branch == "HEAD" or branch.startswith("-") or _PLAIN_BRANCH.fullmatch(branch) is None:
        return False
    return not any(part.endswith(".lock") for part in branch.split("/"))


def add_worktree(clone: Path, path: Path, branch: str, sha: str) -> None:
    """The worktree at `path` on the new branch `branch` at `sha`. git creates the branch before anything else
    and stops there when it exists, so that case is read from its refusal instead of asked first."""
    if os.path.lexists(path):
        raise NotStartable(f"worktree directory {path} already exists; reuse it with --use-worktree {path.name}")
    made = [parent for parent in (path.parent, *path.parent.parents) if not os.path.lexists(parent)]
    path.parent.mkdir(parents=True, exist_ok=True)
    done = run_git(["worktree", "add", "-b", branch, "--", str(path), sha], cwd=clone, timeout=CLONE_TIMEOUT_S)
    if done.returncode != 0:
        for directory in made:  # deepest first: a refused dispatch leaves nothing behind
            with contextlib.suppress(OSError):
                directory.rmdir()
        error = _git_error(done)
        if f"a branch named '{branch}' already exists" in error:
            raise NotStartable(f'branch "{branch}" already exists in {clone}; choose another with --branch')
        raise NotStartable(f"git worktree add failed in {clone}: {error}")


def remove_worktree(clone: Path, path: Path, branch: str) -> None:
    """Undo add_worktree after a dispatch that could not finish: the worktree and its new branch."""
    run_git(["worktree", "remove", "--force", "--", str(path)], cwd=clone, timeout=CLONE_TIMEOUT_S)
    if os.path.lexists(path):
        import shutil

        shutil.rmtree(path, ignore_errors=True)
        run_git(["worktree", "prune"], cwd=clone, timeout=CLONE_TIMEOUT_S)
    run_git(["branch", "-D", "--", branch], cwd=clone, timeout=CLONE_TIMEOUT_S)


def registered_worktrees(clone: Path) -> set[Path]:
    done = run_git(["worktree", "list", "--porcelain", "-z"], cwd=clone, timeout=CLONE_TIMEOUT_S)
    if done.returncode != 0:
        return set()
    found = set()
    for field in done.stdout.split(b"\0"):
        if field.startswith(b"worktree "):
            found.add(Path(os.fsdecode(field[len(b"worktree ") :])))
    return found


def default_branch(name: str) -> str:
    """The branch a new worktree NAME gets unless --branch names another (docs/runs.md#dispatch)."""
    return f"wb/{name}"


def worktree_branches(clone: Path) -> dict[Path, str | None]:
    """Each registered worktree of `clone` (its resolved path) and the branch checked out there (None: detached)."""
    done = run_git(["worktree", "list", "--porcelain", "-z"], cwd=clone, timeout=CLONE_TIMEOUT_S)
    if done.returncode != 0:
        return {}
    found: dict[Path, str | None] = {}
    current: Path | None = None
    for field in done.stdout.split(b"\0"):
        if field.startswith(b"worktree "):
            current = Path(os.fsdecode(field[len(b"worktree ") :])).resolve()
            found[current] = None
        elif field.startswith(b"branch refs/heads/") and current is not None:
            found[current] = os.fsdecode(field[len(b"branch refs/heads/") :])
    return found


def remove_for_prune(clone: Path, path: Path, branch: str | None) -> str | None:
    """Remove a pruned run's worktree (uncommitted changes included) and then `branch`; None, or why git refused."""
    done = run_git(["worktree", "remove", "--force", "--", str(path)], cwd=clone, timeout=CLONE_TIMEOUT_S)
    if done.returncode != 0:
        return f"git worktree remove failed in {clone}: {_git_error(done)}"
    if branch:
        done = run_git(["branch", "-D", "--", branch], cwd=clone, timeout=CLONE_TIMEOUT_S)
        if done.returncode != 0:
            return f"the worktree is removed, but git branch -D {branch} failed in {clone}: {_git_error(done)}"
    return None


def find_existing(projects_root: Path, repository: str | None, name: str) -> tuple[str, Path, Path]:
    """Resolve `--use-worktree NAME` to (repository, clone, worktree path); never creates."""
    candidates = [repository] if repository else _all_clone_repositories(projects_root)
    matches = []
    for candidate in candidates:
        clone = clone_path(projects_root, candidate)
        if not (clone / ".git").exists():
            continue
        path = worktree_path(projects_root, candidate, name)
        if path in registered_worktrees(clone) or path.resolve() in registered_worktrees(clone):
            matches.append((candidate, clone, path))
    if repository:
        require_clone(projects_root, repository)
    if not matches:
        where = f"in {clone_path(projects_root, repository)}" if repository else f"in any clone under {projects_root}"
        existing = _existing_names(projects_root, candidates)
        raise NotStartable(
            f'no registered worktree "{name}" {where}; existing: {existing}; create it with --new-worktree {name}'
        )
    if len(matches) > 1:
        listed = ", ".join(match[0] for match in matches)
        raise NotStartable(f'worktree "{name}" exists in several clones ({listed}); pass --repo OWNER/REPO')
    return matches[0]


def _existing_names(projects_root: Path, repositories: list[str]) -> str:
    """The wb worktree names registered for these repositories, sorted, at most 20 (docs/runs.md#dispatch).

    With one repository the bare names; with several (no --repo) each as OWNER/REPO/NAME.
    """
    names: list[str] = []
    for repository in repositories:
        clone = clone_path(projects_root, repository)
        if not (clone / ".git").exists():
            continue
        parent = worktree_path(projects_root, repository, "x").parent
        for path in registered_worktrees(clone):
            if path.parent in (parent, parent.resolve()):
                names.append(path.name if len(repositories) == 1 else f"{repository}/{path.name}")
    names.sort()
    if not names:
        return "none"
    shown = ", ".join(names[:_EXISTING_SHOWN])
    more = len(names) - _EXISTING_SHOWN
    return shown + (f", … and {more} more" if more > 0 else "")


def _all_clone_repositories(projects_root: Path) -> list[str]:
    found = []
    try:
        owners = sorted(os.scandir(projects_root), key=lambda e: e.name)
    except OSError:
        return []
    for owner in owners:
        if owner.name == WORKTREES_DIR or not owner.is_dir(follow_symlinks=False):
            continue
        with os.scandir(owner.path) as repos:
            for repo in sorted(repos, key=lambda e: e.name):
                if (Path(repo.path) / ".git").exists():
                    try:
                        found.append(check_repository(f"{owner.name}/{repo.name}"))
                    except BadName:
                        continue
    return found


def head_sha(path: Path) -> str | None:
    """HEAD's commit, read from git's files when they are the common layout (courier/runs/git_head.py), else
    asked of git; None when HEAD has no commit."""
    read = head_commit(path)
    if read is not None:
        return read
    done = run_git(["rev-parse", "--verify", "--quiet", "HEAD^{commit}"], cwd=path, timeout=CLONE_TIMEOUT_S)
    return done.stdout.decode().strip() if done.returncode == 0 else None


def merge_base(path: Path, sha: str) -> str | None:
    done = run_git(["merge-base", "HEAD", sha], cwd=path, timeout=CLONE_TIMEOUT_S)
    return done.stdout.decode().strip() if done.returncode == 0 else None
