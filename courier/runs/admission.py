"""Admit a run: resolve the profile and worktree, create the record, start the detached owner
(docs/runs.md#dispatch)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from courier.config import Config, Provider
from courier.errors import NeedsNewLogin, NotStartable, UsageError
from courier.runs import holders, process, sandbox, worktrees
from courier.runs.admission_locks import clone_lock, slots_lock, worktree_lock
from courier.runs.budget import budget_in_force, check_budget, price_of, usage_limit_policy
from courier.runs.changes import count_dirty
from courier.runs.environment import resolve_credential
from courier.runs.harness import UnknownHarness, spec_for
from courier.runs.holders import is_live
from courier.runs.store import Record, RecordNotCreated, Store, render, rfc3339, utc_now
from courier.stage_trace import mark
from courier.stamp import login_changed
from protocol.entry import OWNER_ARGUMENT
from protocol.models import PlacementFacts, RemoteRequest, Resolved, Result, Routing
from protocol.refs import format_reference, new_run_id


def resolve_profile(config: Config, name: str) -> tuple[Resolved, bool | list[str]]:
    """The profile as it will execute, snapshotted into the record; and its network flag.

    Checks made here name the file, the key and the rule, as the file's own checks do (docs/config.md).
    """
    profile = config.profile(name)
    try:
        spec = spec_for(profile.harness)
    except UnknownHarness as exc:
        raise UsageError(f"{config.path}: agents.profiles.{name}.harness: {exc}") from None
    if not spec.wire_apis:
        # A harness without a provider (`command`): schema 1 keeps every field, empty (see Routing).
        routing = Routing(base_url="", wire_api="")
        resolved = Resolved(profile=name, harness=profile.harness, provider="", model="", routing=routing)
        return resolved, profile.network
    assert profile.provider is not None and profile.model is not None  # Profile checks both for such harnesses
    if profile.provider not in config.providers:
        known = ", ".join(sorted(config.providers))
        raise UsageError(
            f'{config.path}: agents.profiles.{name}.provider: unknown provider "{profile.provider}" '
            f"(known: {known}; add it under agents.providers)"
        )
    provider = config.provider(profile.provider)  # a misconfigured one is refused with its own file and key
    if provider.wire_api not in spec.wire_apis:
        fitting = " or ".join(f'"{api}"' for api in spec.wire_apis)
        raise UsageError(
            f"{config.path}: agents.providers.{profile.provider}.wire_api: {spec.display} needs {fitting}, "
            f'not "{provider.wire_api}" (profile {name} runs it with harness {spec.name})'
        )
    routing = Routing(
        base_url=provider.base_url,
        credential_env=provider.credential_env,
        credential_file=provider.credential_file,
        wire_api=provider.wire_api,
    )
    resolved = Resolved(
        profile=name,
        harness=profile.harness,
        provider=profile.provider,
        model=profile.model,
        reasoning=profile.reasoning,
        routing=routing,
    )
    return resolved, profile.network


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold SIGINT/SIGTERM until the span ends, so a run is never half-admitted."""
    pending: list[int] = []

    def remember(signum: int, _frame: FrameType | None) -> None:
        pending.append(signum)

    try:
        previous = {sig: signal.signal(sig, remember) for sig in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread: nothing to defer
        yield
        return
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for signum in pending:
            os.kill(os.getpid(), signum)


def provider_options(provider: Provider) -> dict[str, int]:
    """The optional harness settings of a provider, kept so the owner runs what was resolved."""
    options = {
        "request_max_retries": provider.request_max_retries,
        "stream_max_retries": provider.stream_max_retries,
        "stream_idle_timeout_ms": provider.stream_idle_timeout_ms,
    }
    return {key: value for key, value in options.items() if value is not None}


def busy_run(store: Store, repository: str, worktree: str) -> str | None:
    """A run that still holds this worktree (under its lock): the one its holder file names, if live."""
    return holders.holder(store, repository, worktree)


def running_count(store: Store) -> int:
    """How many of this machine's runs are not terminal (what `max_running` bounds)."""
    records, _ = store.list()
    return sum(1 for record in records if is_live(record))


def placement_facts(config: Config | None, repository: str) -> PlacementFacts:
    """What `--to auto` asks of a candidate (a `version` with `placement: true`): its running runs, and
    whether `repository` (when named) has its canonical clone here. Cheap: a scan of the records and one stat."""
    if config is None:
        from courier.config import load_config

        config = load_config()
    has_repository = None
    if repository:
        has_repository = (worktrees.clone_path(config.projects_root, repository) / ".git").exists()
    return PlacementFacts(running=running_count(Store(config.home).ensure()), has_repository=has_repository)


@contextlib.contextmanager
def slot_held(store: Store, max_running: int) -> Iterator[None]:
    """With a slot bound (`--to auto`), refuse in-band when this machine already runs that many.

    Checked under the machine-wide slots lock, held until the record is made, so two
    concurrent placements never overfill a machine (docs/cli.md#placement-across-a-fleet).
    """
    if max_running <= 0:
        yield
        return
    with slots_lock(store):
        running = running_count(store)
        if running >= max_running:
            raise NotStartable(f"{running} of {max_running} slots busy")
        yield


def require_session_environment(harness: str, fresh_login: bool) -> None:
    """In a serve session (`fresh_login` false), a run is refused before anything is made, as needing a new
    login, when the machine's login files changed since the session started or the harness's CLI is not on
    the session's PATH: the courier asks again in a session of its own, whose environment has what was
    installed since (docs/courier.md, "Environment")."""
    if fresh_login:
        return
    if login_changed():
        raise NeedsNewLogin("the machine's login files changed since this session started; a new login reads them")
    executable = spec_for(harness).executable
    if executable and shutil.which(executable) is None:
        raise NeedsNewLogin(f"{executable} is not on this session's PATH; a new login may have it")


def settle_terms(
    config: Config, profile_name: str, request: RemoteRequest, fresh_login: bool
) -> tuple[Resolved, dict[str, Any]]:
    """What a new run and a continued one both check before anything is made (exit 2 or 3 when refused), and
    the record fields those checks settle: the profile's harness, network, confinement, budget, price and
    usage-limit policy, and when the run started. One home, so a continued run keeps every term a new one has."""
    resolved, network = resolve_profile(config, profile_name)
    require_session_environment(resolved.harness, fresh_login)
    profile = config.profile(profile_name)
    budget = budget_in_force(profile, request)  # counts this run's own usage only (docs/cli.md#budgets)
    price = price_of(profile)
    check_budget(budget, resolved.harness, profile_name, price)
    usage_limit = usage_limit_policy(profile, resolved.harness, profile_name)
    provider = config.provider(resolved.provider) if resolved.provider else None
    if provider is not None:
        resolve_credential(resolved.provider, provider)  # refuse now; the owner reads it again
    confinement = sandbox.setting_for(config, profile_name)
    sandbox.refuse_unless_startable(confinement)  # on the machine that runs it, before anything is made
    return resolved, {
        "network": network,
        "sandbox_mode": confinement.mode,
        "sandbox_source": confinement.source,
        "sandbox_writable": list(confinement.writable) or None,
        "provider_options": (provider_options(provider) or None) if provider else None,
        "permissions": profile.permissions,
        "command": profile.command,
        "started_at": rfc3339(utc_now()),
        "stall_after_ms": profile.stall_after_ms,
        "stop_when_stalled_ms": profile.stop_when_stalled_ms,
        "budget": budget,
        "price": price,
        "usage_limit": usage_limit,
        "max_waits": usage_limit.max_waits if usage_limit else None,
    }


def dispatch(config: Config, request: RemoteRequest, *, fresh_login: bool = True) -> Result:
    # The marks of docs/benchmarks.md#dispatch-latency: checks, the lock, the worktree, the record, the owner's start.
    mark("admission.start")
    store = Store(config.home).ensure()
    agent_id = request.agent_id or new_run_id()
    if store.exists(agent_id):
        return render(store.load(agent_id), store)
    resolved, terms = settle_terms(config, request.profile, request, fresh_login)
    projects_root = config.projects_root
    if request.mode == "new":
        repository = request.repository
        clone = worktrees.require_clone(projects_root, repository)
        path = worktrees.worktree_path(projects_root, repository, request.worktree)
    else:
        repository, clone, path = worktrees.find_existing(projects_root, request.repository or None, request.worktree)
    base_sha = worktrees.resolve_base(clone, request.base) if request.base else None
    branch = request.branch or (f"wb/{request.worktree}" if request.mode == "new" else None)
    if branch and request.mode == "new":
        worktrees.check_branch_name(clone, branch)

    with deferred_signals():  # from the record to its owner: a Ctrl-C waits, nothing is left half-made
        with worktree_lock(store, repository, request.worktree), slot_held(store, request.max_running):
            mark("admission.locked")
            if store.exists(agent_id):
                return render(store.load(agent_id), store)
            holder = busy_run(store, repository, request.worktree)
            if holder:
                raise NotStartable(
                    f"worktree {request.worktree} of {repository} is in use by run {format_reference('', holder)}; "
                    f"await or stop it first"
                )
            holders.hold(store, repository, request.worktree, agent_id)
            preexisting = None
            if request.mode == "new":
                if base_sha is None:
                    base_sha = worktrees.head_sha(clone)
                    if base_sha is None:
                        raise NotStartable(f"{clone} has no commit to branch from; commit something or pass --base")
                assert branch is not None
                mark("worktree.start")
                with clone_lock(store, repository):
                    worktrees.add_worktree(clone, path, branch, base_sha)
                mark("worktree.added")
            else:
                head = worktrees.head_sha(path)
                base_sha = worktrees.merge_base(path, base_sha) if base_sha and head else head
                preexisting = count_dirty(str(path))
            record = Record(
                agent_id=agent_id,
                state="running",
                profile=request.profile,
                resolved=resolved,
                repository=repository,
                worktree_mode="new" if request.mode == "new" else "existing",
                worktree=request.worktree,
                worktree_dir=str(path),
                branch=branch if request.mode == "new" else None,
                base=request.base or None,
                base_sha=base_sha,
                preexisting_changes=preexisting,
                timeout_ms=request.timeout_ms,
                **terms,
            )
            try:
                run_dir = store.create(record, request.task)
            except (FileExistsError, RecordNotCreated) as exc:
                # Nothing partial stays: the worktree just made goes too. FileExistsError is the same agent id
                # admitted meanwhile into another worktree (another lock): that run is the answer.
                if request.mode == "new" and branch:
                    with clone_lock(store, repository):
                        worktrees.remove_worktree(clone, path, branch)
                if isinstance(exc, FileExistsError):
                    return render(store.load(agent_id), store)
                raise
            mark("record.created")
        # Out of the worktree's lock: the record holds the worktree from here (other dispatches see it).
        start_owner(run_dir, request.task)
        mark("owner.spawned")
    return render(record, store)


def start_owner(run_dir: Path, task: str) -> None:
    """Start the run's detached owner (docs/runs.md#the-owner) as a copy of a process whose imports are done
    (a new interpreter and wb's imports cost more than all of admission, docs/benchmarks.md#dispatch-latency):
    of this one when it runs one thread (the copy's command line is written over: the dispatcher's may
    carry the task, and the owner lives as long as the run); else of this process's owner launcher (a serve
    session, a Ray worker: other threads); else a new interpreter."""
    from courier.runs.launcher import LauncherGone, owner_here, process_launcher

    owner_args = ["--run-dir", str(run_dir)]
    argv = [sys.executable, "-m", "courier.main", OWNER_ARGUMENT, *owner_args]
    try:
        if process.alone_in_process():
            title = f"wb owner --run-dir {run_dir}"  # not the dispatcher's command line, which may hold the task
            process.fork_detached(lambda: owner_here(owner_args), title=title, hidden=task, otherwise=argv)
            return
        try:
            process_launcher().launch(run_dir)
            return
        except LauncherGone:
            pass
        process.spawn_detached(argv, dict(os.environ))
    except OSError as exc:
        raise NotStartable(f"could not start the run owner: {exc}") from None
