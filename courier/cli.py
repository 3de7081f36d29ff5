"""The typer app: argv → request → answer → output and exit code. The only module importing typer."""

from __future__ import annotations

import codecs
import os
import sys
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated

import typer
import typer._click as typer_click  # typer vendors its own click
from typer import core as typer_core
from typer import main as typer_main
from typer import models as typer_models
from typer._click import exceptions as click_exceptions

from courier import __version__, cli_io, hot
from courier.client.client import Client
from courier.commands import (
    AWAIT_DEFAULT,
    EXEC_TIMEOUT_DEFAULT,
    MACHINE_TIMEOUT_DEFAULT,
    PLACEMENT_TIMEOUT_DEFAULT,
    TIMEOUT_DEFAULT,
    check_list_scope,
    duration_ms,
    machine_timeout_s,
)
from courier.commands import naming as _naming
from courier.commands import target as _target
from courier.config import Config, load_config
from courier.errors import Finding, Interrupted, UsageError, WbError
from courier.ops.await_ import await_target
from courier.ops.continue_ import build_continue
from courier.ops.logs import check_tail, logs_request, logs_text, with_whole_id
from courier.ops.stop import stop_remedy, stop_request
from courier.render import to_json
from courier.run_commands import awaited, dispatch_command, started, then_wait_bound
from courier.text import escape_controls, sanitize
from protocol import limits
from protocol.refs import format_reference

if TYPE_CHECKING:
    pass

# Plain help (rich_markup_mode=None): typer's rich help shows every flag as taking a value
# (`--json <bool>`, `--help <bool>`); click's plain help shows a flag as a flag.
_PLAIN_HELP = None
app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=_PLAIN_HELP,
    help="Dispatch one bounded coding task to one coding-agent harness, here or over SSH.",
)
agent_app = typer.Typer(no_args_is_help=True, rich_markup_mode=_PLAIN_HELP, help="Dispatch, watch and stop agent runs.")
app.add_typer(agent_app, name="agent")
courier_app = typer.Typer(
    no_args_is_help=True, rich_markup_mode=_PLAIN_HELP, help="The courier that keeps wb and its SSH connections warm."
)
app.add_typer(courier_app, name="courier")
config_app = typer.Typer(no_args_is_help=True, rich_markup_mode=_PLAIN_HELP, help="The wb.yaml wb uses.")
app.add_typer(config_app, name="config")


class Format(StrEnum):
    text = "text"
    json = "json"


FormatOpt = Annotated[Format, typer.Option("--format", help="Output format.")]
WaitOpt = Annotated[bool, typer.Option("--wait", help="Then wait for the run and print its facts, as await does.")]
FollowOpt = Annotated[
    bool, typer.Option("--follow", help="Then print its worker actions as they happen, and its facts, as await does.")
]
WaitTimeoutOpt = Annotated[
    str | None,
    typer.Option("--wait-timeout", metavar="DURATION", help="With --wait or --follow: bound on the wait (0 = none)."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Same as --format json.")]


RefArg = Annotated[
    str, typer.Argument(metavar="REF", help="agt-… or MACHINE:agt-… (a unique prefix of 6+ digits will do)")
]
ToOpt = Annotated[str | None, typer.Option("--to", metavar="MACHINE", help="Ask this configured machine.")]
MachineTimeoutOpt = Annotated[
    str, typer.Option("--machine-timeout", metavar="DURATION", help="Give up on a machine not answering by then.")
]
MaxTokensOpt = Annotated[
    int | None, typer.Option("--max-tokens", metavar="N", help="Stop the run past N tokens (replaces the profile's).")
]
MaxCostOpt = Annotated[
    float | None,
    typer.Option("--max-cost-usd", metavar="X", help="Stop the run past $X (replaces the profile's)."),
]


def _version(value: bool) -> None:
    if value:
        sys.stdout.write(f"wb {__version__} (protocol schema {limits.SCHEMA_VERSION})\n")
        raise typer.Exit(0)


@app.callback()
def root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print versions.")
    ] = False,
) -> None:
    """wb: one task, one harness, one worktree; the facts reported later."""


# -- helpers -------------------------------------------------------------------------------


def _config() -> Config:
    return load_config()


def _client() -> Client:
    return Client(load_config())


def _wants_json(fmt: Format, json_flag: bool) -> bool:
    return json_flag or fmt == Format.json


_out = cli_io.out
_out_lines = cli_io.out_lines


# -- agent commands ------------------------------------------------------------------------


@agent_app.command()
def dispatch(
    new_worktree: Annotated[
        str | None, typer.Option("--new-worktree", metavar="NAME", help="Create this worktree.")
    ] = None,
    use_worktree: Annotated[
        str | None, typer.Option("--use-worktree", metavar="NAME", help="Use this existing worktree.")
    ] = None,
    profile: Annotated[str | None, typer.Option("--profile", metavar="NAME", help="Configured profile.")] = None,
    task: Annotated[str | None, typer.Option("--task", metavar="TEXT", help="The task text.")] = None,
    task_file: Annotated[
        str | None, typer.Option("--task-file", metavar="PATH", help="Read the task from a file (- for stdin).")
    ] = None,
    repo: Annotated[
        str | None, typer.Option("--repo", metavar="OWNER/REPO", help="Repository (default: origin of this checkout).")
    ] = None,
    branch: Annotated[
        str | None, typer.Option("--branch", metavar="NAME", help="Branch for a new worktree (default wb/NAME).")
    ] = None,
    base: Annotated[str | None, typer.Option("--base", metavar="REF", help="Commit to start from.")] = None,
    to: ToOpt = None,
    timeout: Annotated[
        str, typer.Option("--timeout", metavar="DURATION", help="Bound on the run (e.g. 30m, 2h).")
    ] = TIMEOUT_DEFAULT,
    max_tokens: MaxTokensOpt = None,
    max_cost_usd: MaxCostOpt = None,
    machine_timeout: Annotated[
        str,
        typer.Option("--machine-timeout", metavar="DURATION", help="--to auto: bound on asking the candidates."),
    ] = PLACEMENT_TIMEOUT_DEFAULT,
    wait_for_slot: Annotated[
        str | None,
        typer.Option("--wait-for-slot", metavar="DURATION", help="--to auto: wait this long for a free slot."),
    ] = None,
    wait: WaitOpt = False,
    follow: FollowOpt = False,
    wait_timeout: WaitTimeoutOpt = None,
    fmt: FormatOpt = Format.text,
    json_flag: JsonOpt = False,
) -> None:
    """Start one task in a worktree (--to auto[:LABEL]: where a slot is free); prints its reference."""
    dispatch_command(
        new_worktree=new_worktree,
        use_worktree=use_worktree,
        profile=profile,
        task=task,
        task_file=task_file,
        repo=repo,
        branch=branch,
        base=base,
        to=to,
        timeout=timeout,
        max_tokens=max_tokens,
        max_cost_usd=max_cost_usd,
        machine_timeout=machine_timeout,
        wait_for_slot=wait_for_slot,
        wait=wait,
        follow=follow,
        wait_timeout=wait_timeout,
        as_json=_wants_json(fmt, json_flag),
    )


@agent_app.command()
def status(
    reference: RefArg,
    to: ToOpt = None,
    machine_timeout: MachineTimeoutOpt = MACHINE_TIMEOUT_DEFAULT,
    fmt: FormatOpt = Format.text,
    json_flag: JsonOpt = False,
) -> None:
    """Show the facts of one run."""
    hot.status_command(reference, to, machine_timeout, _wants_json(fmt, json_flag))


@agent_app.command(name="await")
def await_(
    reference: RefArg,
    wait_timeout: Annotated[
        str, typer.Option("--wait-timeout", metavar="DURATION", help="Bound on the wait (0 = none).")
    ] = AWAIT_DEFAULT,
    to: ToOpt = None,
    fmt: FormatOpt = Format.text,
    json_flag: JsonOpt = False,
) -> None:
    """Wait until the run is terminal (or the bound passes) and print the result."""
    machine, run_id, bound_ms = await_target(reference, to, wait_timeout)
    awaited(machine, run_id, bound_ms, _wants_json(fmt, json_flag))


@agent_app.command(name="list")
def list_(
    to: ToOpt = None,
    all_machines: Annotated[bool, typer.Option("--all", help="This machine and every configured machine.")] = False,
    machine_timeout: MachineTimeoutOpt = MACHINE_TIMEOUT_DEFAULT,
    stalled: Annotated[bool, typer.Option("--stalled", help="Only running runs that went silent (stalled).")] = False,
    fmt: FormatOpt = Format.text,
    json_flag: JsonOpt = False,
) -> None:
    """List runs, newest first."""
    hot.list_command(to, all_machines, machine_timeout, stalled, _wants_json(fmt, json_flag))


@agent_app.command()
def logs(
    reference: RefArg,
    tail: Annotated[
        int, typer.Option("--tail", metavar="N", help="How many worker actions.")
    ] = limits.LOGS_TAIL_DEFAULT,
    raw: Annotated[bool, typer.Option("--raw", help="The whole transcript.")] = False,
    follow: Annotated[bool, typer.Option("--follow", help="Print actions as they happen until the run ends.")] = False,
    to: ToOpt = None,
    fmt: FormatOpt = Format.text,
    json_flag: JsonOpt = False,
    machine_timeout: MachineTimeoutOpt = MACHINE_TIMEOUT_DEFAULT,
) -> None:
    """Show the last worker actions (or the raw transcript, or follow them live)."""
    check_tail(tail)
    bound_s = machine_timeout_s(machine_timeout)  # not with --follow: each of its calls waits up to 5 min
    if follow and raw:
        raise UsageError("--follow prints worker actions; it cannot be combined with --raw")
    as_json = _wants_json(fmt, json_flag)
    if as_json and raw:
        raise UsageError("--json prints worker actions; it cannot be combined with --raw")
    machine, request = logs_request(reference, to, tail=tail, raw=raw)
    client = _client()
    request = with_whole_id(request, lambda asked: client.ask(machine, asked, timeout_s=bound_s))
    run_id = request.agent_id
    if follow:
        ref = format_reference(machine, run_id)
        try:
            client.follow(machine, run_id, _out, _warn, as_json=as_json)
        except KeyboardInterrupt:
            hint = f"interrupted; the run continues; follow it again with wb agent logs {ref} --follow"
            raise Interrupted(hint) from None
        return
    response = client.logs(machine, request, timeout_s=bound_s)
    transcript = response.take_transcript()  # handed over in-process: printed whole, bytes as written
    if transcript is not None:
        _raw_transcript(transcript)
        return
    text = response.logs
    if as_json:
        from courier.ops.logs import actions_document

        _out(to_json(actions_document(machine, run_id, text).to_json()))
    else:
        _out(logs_text(text, raw=raw, terminal=raw and sys.stdout.isatty()))


def _raw_transcript(opened: tuple[int, int, str]) -> None:
    fd, _, path = opened
    _out(f"{path}\n")
    terminal = sys.stdout.isatty()
    decoder = codecs.getincrementaldecoder("utf-8")("replace")  # a character may span two chunks
    with os.fdopen(fd, "rb") as handle:
        while chunk := handle.read(limits.READ_CHUNK_BYTES):
            if terminal:
                sys.stdout.write(escape_controls(decoder.decode(chunk)))
            else:
                try:
                    sys.stdout.buffer.write(chunk)
                except BrokenPipeError:
                    _broken_pipe()
    _out("")


@agent_app.command()
def stop(
    reference: RefArg,
    to: ToOpt = None,
    fmt: FormatOpt = Format.text,
    json_flag: JsonOpt = False,
    machine_timeout: MachineTimeoutOpt = MACHINE_TIMEOUT_DEFAULT,
) -> None:
    """Stop a running run: its worker is signalled and the run recorded as stopped."""
    from courier.ops.stop import stop_document, stop_message

    machine, request = stop_request(reference, to)
    bound_s = machine_timeout_s(machine_timeout)
    ref = format_reference(machine, request.agent_id)
    with _naming(stop_remedy(ref)):
        response = _client().stop(machine, request.agent_id, timeout_s=bound_s)
        stopped = response.stop_result_of()
    if _wants_json(fmt, json_flag):
        _out(to_json(stop_document(machine, stopped).to_json()))
    else:
        _out(stop_message(machine, stopped) + "\n")
    for warning in response.warnings or []:  # processes of the worker that outlived SIGKILL
        _warn(f"{ref}: {warning.error}")


@agent_app.command()
def diff(
    reference: RefArg,
    stat: Annotated[bool, typer.Option("--stat", help="Per-file +added -deleted and a total, no patch.")] = False,
    to: ToOpt = None,
    fmt: FormatOpt = Format.text,
    json_flag: JsonOpt = False,
) -> None:
    """Show the run's change against its base: a patch git apply takes (new and binary files included)."""
    hot.diff_command(reference, stat, to, _wants_json(fmt, json_flag))


@agent_app.command(name="continue")
def continue_(
    reference: Annotated[str, typer.Argument(metavar="REF", help="agt-… or MACHINE:agt-… (a finished run)")],
    task: Annotated[str | None, typer.Option("--task", metavar="TEXT", help="The follow-up task.")] = None,
    task_file: Annotated[
        str | None, typer.Option("--task-file", metavar="PATH", help="Read the task from a file (- for stdin).")
    ] = None,
    profile: Annotated[
        str | None, typer.Option("--profile", metavar="NAME", help="Profile (default: the run's own).")
    ] = None,
    timeout: Annotated[
        str, typer.Option("--timeout", metavar="DURATION", help="Bound on the new run (e.g. 30m, 2h).")
    ] = TIMEOUT_DEFAULT,
    max_tokens: MaxTokensOpt = None,
    max_cost_usd: MaxCostOpt = None,
    to: ToOpt = None,
    wait: WaitOpt = False,
    follow: FollowOpt = False,
    wait_timeout: WaitTimeoutOpt = None,
    fmt: FormatOpt = Format.text,
    json_flag: JsonOpt = False,
) -> None:
    """Start a new run in the same worktree that resumes REF's harness session with a follow-up task."""
    as_json = _wants_json(fmt, json_flag)
    bound_ms = then_wait_bound(wait, follow, wait_timeout, as_json)
    machine, request, new_id = build_continue(
        reference=reference,
        task=task,
        task_file=task_file,
        profile=profile,
        timeout=timeout,
        to=to,
        max_tokens=max_tokens,
        max_cost_usd=max_cost_usd,
    )
    result = Client(load_config()).start(machine, request, new_id)
    started(result, bound_ms, follow, as_json)


@agent_app.command()
def prune(
    older_than: Annotated[
        str | None,
        typer.Option("--older-than", metavar="DURATION", help="Remove records of runs that finished longer ago."),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print what would be removed; remove nothing.")] = False,
    worktrees: Annotated[
        bool, typer.Option("--worktrees", help="Also remove their worktrees and wb/<name> branches.")
    ] = False,
    to: ToOpt = None,
    all_machines: Annotated[bool, typer.Option("--all", help="This machine and every configured machine.")] = False,
    fmt: FormatOpt = Format.text,
    json_flag: JsonOpt = False,
    machine_timeout: MachineTimeoutOpt = MACHINE_TIMEOUT_DEFAULT,
) -> None:
    """Remove old run records (with --worktrees their worktrees too; never a live run's)."""
    from courier.ops.prune import prune_document, prune_fleet_document, prune_text

    if older_than is None:
        raise UsageError("pass --older-than DURATION (e.g. 7d is not a Go duration: use 168h)")
    older_than_ms = duration_ms(older_than, "--older-than")
    if older_than_ms < 0:
        raise UsageError("--older-than must not be negative")
    check_list_scope(to, all_machines)
    bound_s = machine_timeout_s(machine_timeout)
    client = _client()
    machine, _ = _target(None, to)
    machines = ["", *sorted(client.config.targets)] if all_machines else [machine]
    outcomes = client.prune(machines, older_than_ms, dry_run, bound_s, worktrees)
    text, warnings = prune_text(outcomes, dry_run, worktrees)
    if len(machines) == 1 and outcomes[0].error is not None:
        raise outcomes[0].error
    if not _wants_json(fmt, json_flag):
        _out(text)
    elif all_machines:
        _out(to_json(prune_fleet_document(outcomes, dry_run).to_json()))
    else:
        _out(to_json(prune_document(outcomes[0]).to_json()))
    for warning in warnings:
        _warn(warning)
    if warnings:
        raise Finding("not everything could be pruned (named above)")


@agent_app.command(name="watch")
def watch_(
    to: ToOpt = None,
    all_machines: Annotated[bool, typer.Option("--all", help="This machine and every configured machine.")] = False,
    json_flag: JsonOpt = False,
    exec_cmd: Annotated[
        str | None,
        typer.Option("--exec", metavar="CMD", help="Run CMD per finished run (Result JSON on stdin; no shell)."),
    ] = None,
    until_idle: Annotated[bool, typer.Option("--until-idle", help="Exit 0 once no watched run is running.")] = False,
    exec_timeout: Annotated[
        str,
        typer.Option("--exec-timeout", metavar="DURATION", help="Kill a CMD of --exec still running by then."),
    ] = EXEC_TIMEOUT_DEFAULT,
    since: Annotated[
        str | None,
        typer.Option("--since", metavar="DURATION", help="First, a finished line per run that ended this recently."),
    ] = None,
) -> None:
    """Print run transitions as they happen (dispatched, started, stalled, waiting, finished)."""
    from courier.client.watching import hook_argv

    check_list_scope(to, all_machines)
    hook = hook_argv(exec_cmd) if exec_cmd is not None else None
    exec_timeout_ms = duration_ms(exec_timeout, "--exec-timeout")
    if exec_timeout_ms <= 0:
        raise UsageError("--exec-timeout must be more than 0")
    since_ms = duration_ms(since, "--since") if since is not None else 0
    if since is not None and since_ms <= 0:
        raise UsageError("--since must be more than 0 (e.g. --since 10m)")
    client = _client()
    machine, _ = _target(None, to)
    machines = ["", *sorted(client.config.targets)] if all_machines else [machine]
    client.watch(
        machines,
        as_json=json_flag,
        hook=hook,
        until_idle=until_idle,
        write=_out,
        warn=_warn,
        exec_timeout_s=exec_timeout_ms / limits.MS_PER_SECOND,
        since_ms=since_ms,
    )


# -- fleet, demo ---------------------------------------------------------------------------


@app.command()
def machines(
    check: Annotated[bool, typer.Option("--check", help="Probe each machine with the version operation.")] = False,
    machine_timeout: Annotated[
        str, typer.Option("--machine-timeout", metavar="DURATION", help="Per-machine deadline with --check.")
    ] = MACHINE_TIMEOUT_DEFAULT,
    fmt: FormatOpt = Format.text,
    json_flag: JsonOpt = False,
) -> None:
    """Show the configured machines (and, with --check, whether they answer)."""
    timeout_s = machine_timeout_s(machine_timeout)
    _client().show_machines(check=check, as_json=_wants_json(fmt, json_flag), machine_timeout_s=timeout_s)


@config_app.command("check")
def config_check(fmt: FormatOpt = Format.text, json_flag: JsonOpt = False) -> None:
    """Print every problem of the wb.yaml wb would use, one line each; exit 2 when there is one."""
    from courier.config_check import check, text_lines

    found = check()
    if _wants_json(fmt, json_flag):
        _out(to_json(found.to_json()))
    else:
        _out("".join(f"{line}\n" for line in text_lines(found)))
    if not found.ok:
        raise typer.Exit(2)


@app.command()
def schema(
    name: Annotated[str | None, typer.Argument(metavar="NAME", help="A document name; none lists the names.")] = None,
) -> None:
    """Print the JSON Schema (draft 2020-12) of a document wb prints or sends."""
    from courier.schemas import DOCUMENTS, render

    if name is None:
        _out("".join(f"{known}\t{used_by}\n" for known, (_, used_by) in DOCUMENTS.items()))
        return
    if name not in DOCUMENTS:
        raise UsageError(f'unknown schema "{name}"; the schemas are: {", ".join(DOCUMENTS)}')
    _out(render(name))


@app.command()
def mcp() -> None:
    """Serve the wb tools to an agent over the Model Context Protocol on stdio."""
    from courier.mcp_server import serve

    serve()


@app.command()
def demo(
    harness: Annotated[
        str, typer.Option("--harness", metavar="codex|claude|gemini", help="The coding agent to run (default codex).")
    ] = "codex",
    ui: Annotated[bool, typer.Option("--ui", help="Also show the run live on a web page (wb ui).")] = False,
) -> None:
    """Show the product working end to end in a throwaway sandbox (nothing of yours is touched)."""
    from courier.demo.run import DEMO_HARNESSES, run_demo

    if harness not in DEMO_HARNESSES:
        raise UsageError(f'--harness must be one of {", ".join(sorted(DEMO_HARNESSES))}, not "{harness}"')
    code = run_demo(harness, ui=ui)
    if code:
        raise typer.Exit(code)


@app.command()
def ui(
    port: Annotated[int, typer.Option("--port", metavar="N", help="Listen on port N (default: a free one).")] = 0,
    bind: Annotated[
        str, typer.Option("--bind", metavar="ADDR", help="Listen on ADDR, not 127.0.0.1 (warned unless loopback).")
    ] = "127.0.0.1",
    to: ToOpt = None,
    all_machines: Annotated[bool, typer.Option("--all", help="This machine and every configured machine.")] = False,
    open_page: Annotated[bool, typer.Option("--open", help="Open the page in a browser.")] = False,
) -> None:
    """Serve the fleet on a web page (live runs, diffs, stop and continue) until Ctrl-C."""
    from courier.ui.asks import Scope
    from courier.ui.server import serve

    check_list_scope(to, all_machines)
    config = _config()
    machine, _ = _target(None, to)
    if machine:
        config.target(machine)  # an unknown or broken machine: exit 2 before anything listens
    machines = ("", *sorted(config.targets)) if all_machines else (machine,)
    scope = Scope(machines, all_machines, machine_timeout_s(MACHINE_TIMEOUT_DEFAULT))
    serve(config, scope, port=port, bind_address=bind, open_browser=open_page, write=_out, warn=_warn)


# -- courier (docs/courier.md) -----------------------------------------------------------------


@courier_app.command(name="status")
def courier_status(fmt: FormatOpt = Format.text, json_flag: JsonOpt = False) -> None:
    """Show the running courier: pid, uptime, machines with connection age and calls served."""
    from courier.warm import control

    found = control.status()
    if _wants_json(fmt, json_flag):
        _out(to_json(found if found is not None else {"running": False, "socket": control.where()}))
        return
    if found is None:
        socket = control.where()
        _out(
            f"no courier is running (socket {socket})\n"
            if socket
            else f"no courier is running, and none can start here: {control.why_nowhere()}\n"
        )
        return
    from protocol.durations import format_duration_ms

    lines = [
        f"courier:  pid {found['pid']}, up {format_duration_ms(int(found['uptime_s'] * limits.MS_PER_SECOND))}, "
        f"{found['commands']} command(s), {found['running']} running\n",
        f"socket:   {found['socket']}\n",
    ]
    machines = found.get("machines") or []
    if not machines:
        lines.append("machines: none connected\n")
    for row in machines:
        age = row.get("connection_age_s")
        shown = format_duration_ms(int(age * limits.MS_PER_SECOND)) if isinstance(age, (int, float)) else "closed"
        lines.append(
            f"machine:  {sanitize(str(row['machine']))}\tconnected {shown}\t{row['calls']} call(s)\t{row['mode']}\n"
        )
    _out("".join(lines))


@courier_app.command(name="stop")
def courier_stop() -> None:
    """Stop the courier (commands it is running finish first); the next command starts a new one."""
    from courier.warm import control

    pid = control.stop()
    _out(f"stopped courier {pid}\n" if pid is not None else "no courier is running\n")


# -- entry ---------------------------------------------------------------------------------


_warn = cli_io.warn
_error = cli_io.error
_broken_pipe = cli_io.broken_pipe


# -- registration: which click commands are built for one call --------------------------------
#
# typer turns every registered function into a click command (signature, type hints, one
# pydantic adapter per option) each time the app is called: most of a short command's own
# time. A cold process builds only the command its argv names (the full tree when argv
# names none: help, a typo's suggestions, `wb --version`); the courier builds the full
# tree once, before it forks (`prepare`), so its per-command children build nothing.

_prepared: typer_core.TyperGroup | None = None


def _command_name(info: typer_models.CommandInfo) -> str:
    assert info.callback is not None
    return info.name or typer_main.get_command_name(info.callback.__name__)


def _command_path(argv: list[str]) -> list[str] | None:
    """The group names and the command name argv starts with, or None when it names no command."""
    node, path = app, []
    for token in argv:
        groups = {info.name: info.typer_instance for info in node.registered_groups}
        child = groups.get(token)
        if child is not None:
            node = child
            path.append(token)
            continue
        if any(_command_name(info) == token for info in node.registered_commands):
            return [*path, token]
        return None
    return None


def _build(path: list[str] | None) -> typer_core.TyperGroup:
    """The click group for `path`: only the groups on it and its one command, or everything."""
    if path is None:
        return typer_main.get_group(app)
    saved: list[tuple[typer.Typer, list[typer_models.CommandInfo], list[typer_models.TyperInfo]]] = []
    node = app
    try:
        for name in path[:-1]:
            saved.append((node, node.registered_commands, node.registered_groups))
            info = next(info for info in node.registered_groups if info.name == name)
            node.registered_commands, node.registered_groups = [], [info]
            assert info.typer_instance is not None
            node = info.typer_instance
        saved.append((node, node.registered_commands, node.registered_groups))
        node.registered_commands = [info for info in node.registered_commands if _command_name(info) == path[-1]]
        node.registered_groups = []
        return typer_main.get_group(app)
    finally:
        for typer_app, commands, groups in saved:
            typer_app.registered_commands, typer_app.registered_groups = commands, groups


def prepare() -> None:
    """Build every command and its options' coercion now (the courier, before it forks children)."""
    global _prepared
    group = _build(None)
    pending: list[typer_click.Command] = [group]
    while pending:
        command = pending.pop()
        help_option = command.get_help_option(typer_click.Context(command, **command.context_settings))
        for param in [*command.params, *([help_option] if help_option is not None else [])]:
            if isinstance(param, typer_core._TyperParameter):
                param.get_runtime_param()
        if isinstance(command, typer_core.TyperGroup):
            pending.extend(command.commands.values())
    _prepared = group


def _command(argv: list[str]) -> typer_core.TyperGroup:
    if _prepared is not None:
        return _prepared
    return _build(_command_path(argv))


def run(argv: list[str]) -> int:
    """The command line's exit code: `agent list`/`status` by courier/hot.py when it parses them, else typer."""
    hot_code = hot.run(argv)  # the courier's children too: list and status without click
    if hot_code is not None:
        return hot_code
    return run_typer(argv)


def run_typer(argv: list[str]) -> int:
    """The command line through typer alone (every command, its help and its usage errors)."""
    try:
        if sys.excepthook != typer_main.except_hook:  # what `app(...)` does before it calls the command
            sys.excepthook = typer_main.except_hook
        result = _command(argv).main(args=argv, prog_name="wb", standalone_mode=False)
        sys.stdout.flush()
        return result if isinstance(result, int) else 0
    except BrokenPipeError:
        _broken_pipe()
    except typer.Exit as exc:
        return int(exc.exit_code)
    except click_exceptions.NoArgsIsHelpError as exc:  # `wb agent`: the help on stdout, exit 2
        _out(exc.format_message() + "\n")
        return 2
    except click_exceptions.UsageError as exc:
        _error(exc.format_message())
        return 2
    except (typer.Abort, KeyboardInterrupt):
        return Interrupted.exit_code
    except WbError as exc:
        return cli_io.report(exc)
    except click_exceptions.ClickException as exc:
        _error(exc.format_message())
        return exc.exit_code
    except Exception as exc:
        _error(f"internal: {type(exc).__name__}: {exc}")
        return 1
