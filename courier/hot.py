"""The hot commands without typer: `wb agent list`, `status`, `dispatch` and `diff`, parsed by hand.

A cold `wb agent list` spent more time importing typer and building its click command than
reading the store, and a cold dispatch or diff about 50 ms (docs/benchmarks.md). This module parses
exactly the documented options of these commands (docs/cli.md) and runs the same command bodies
the typer commands run (courier/cli.py calls `list_command`, `status_command`, `diff_command` and
courier/run_commands.py's `dispatch_command`). Anything it does not
recognise exactly — `--help`, an unknown or repeated option, a missing value, `--`, a second
argument — it hands back (`parse` returns None) to the typer path, so every usage message,
help text and exit code stays typer's. Imports no typer, and no asyncio for this machine.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from courier import cli_io
from courier.errors import Finding, Interrupted, WbError

_FLAGS = {
    "list": ("--all", "--stalled", "--json"),
    "status": ("--json",),
    "dispatch": ("--wait", "--follow", "--json"),
    "diff": ("--stat", "--json"),
}
_VALUED = {
    "list": ("--to", "--machine-timeout", "--format"),
    "status": ("--to", "--machine-timeout", "--format"),
    "diff": ("--to", "--format"),
    "dispatch": (
        "--new-worktree", "--use-worktree", "--profile", "--task", "--task-file", "--repo", "--branch", "--base",
        "--to", "--timeout", "--max-tokens", "--max-cost-usd", "--machine-timeout", "--wait-for-slot",
        "--wait-timeout", "--format",
    ),
}  # fmt: skip
_POSITIONALS = {"list": 0, "status": 1, "dispatch": 0, "diff": 1}
_FORMATS = ("text", "json")
# Options whose value typer converts: one it would refuse (with its own message) goes to typer.
_CONVERTED = {"--max-tokens": int, "--max-cost-usd": float}


@dataclass(frozen=True)
class HotCall:
    command: str  # "list" or "status"
    options: dict[str, str | bool]
    reference: str | None


def parse(argv: list[str]) -> HotCall | None:
    """`agent list|status …` with only their documented options, each once; else None (typer's)."""
    if len(argv) < 2 or argv[0] != "agent" or argv[1] not in _FLAGS:
        return None
    command = argv[1]
    options: dict[str, str | bool] = {}
    positionals: list[str] = []
    rest = argv[2:]
    i = 0
    while i < len(rest):
        token = rest[i]
        i += 1
        if not token.startswith("-"):
            positionals.append(token)
            continue
        name, has_inline, inline = token.partition("=")
        if name in options:
            return None  # repeated: typer's rules (the last one wins) and typer's messages
        if name in _FLAGS[command] and not has_inline:
            options[name] = True
        elif name in _VALUED[command]:
            if has_inline:
                value = inline
            elif i < len(rest):
                value = rest[i]
                i += 1
            else:
                return None  # a missing value: typer's message
            if not value or (value.startswith("-") and not (name == "--task-file" and value == "-")):
                return None  # typer's rules and messages (`--task-file -` is stdin, documented)
            if name in _CONVERTED:
                try:
                    _CONVERTED[name](value)
                except ValueError:
                    return None
            if name == "--format" and value not in _FORMATS:
                return None
            options[name] = value
        else:
            return None  # --help, --, an unknown option, a flag given a value
    if len(positionals) != _POSITIONALS[command]:
        return None
    return HotCall(command, options, positionals[0] if positionals else None)


def run(argv: list[str]) -> int | None:
    """The exit code of a hot command run here; None when argv is not one (the typer path runs it)."""
    call = parse(argv)
    if call is None:
        return None
    from courier.commands import MACHINE_TIMEOUT_DEFAULT, PLACEMENT_TIMEOUT_DEFAULT

    opts = call.options
    to = opts.get("--to")
    default_bound = PLACEMENT_TIMEOUT_DEFAULT if call.command == "dispatch" else MACHINE_TIMEOUT_DEFAULT
    machine_timeout = opts.get("--machine-timeout", default_bound)
    as_json = bool(opts.get("--json")) or opts.get("--format") == "json"
    assert isinstance(machine_timeout, str) and (to is None or isinstance(to, str))
    try:
        if call.command == "list":
            list_command(to, bool(opts.get("--all")), machine_timeout, bool(opts.get("--stalled")), as_json)
        elif call.command == "dispatch":
            _dispatch(opts, to, as_json)
        elif call.command == "diff":
            assert call.reference is not None
            diff_command(call.reference, bool(opts.get("--stat")), to, as_json)
        else:
            assert call.reference is not None
            status_command(call.reference, to, machine_timeout, as_json)
        sys.stdout.flush()
        return 0
    except BrokenPipeError:
        cli_io.broken_pipe()
    except KeyboardInterrupt:
        return Interrupted.exit_code
    except WbError as exc:
        return cli_io.report(exc)
    except Exception as exc:
        cli_io.error(f"internal: {type(exc).__name__}: {exc}")
        return 1


# -- the command bodies (the typer commands in courier/cli.py call these too) ---------------


def _dispatch(opts: dict[str, str | bool], to: str | None, as_json: bool) -> None:
    """`wb agent dispatch` with the options parsed here (courier/run_commands.py, as typer's command runs it)."""
    from courier.commands import PLACEMENT_TIMEOUT_DEFAULT, TIMEOUT_DEFAULT
    from courier.run_commands import dispatch_command

    def text(name: str) -> str | None:
        value = opts.get(name)
        return value if isinstance(value, str) else None

    tokens, dollars = text("--max-tokens"), text("--max-cost-usd")
    dispatch_command(
        new_worktree=text("--new-worktree"),
        use_worktree=text("--use-worktree"),
        profile=text("--profile"),
        task=text("--task"),
        task_file=text("--task-file"),
        repo=text("--repo"),
        branch=text("--branch"),
        base=text("--base"),
        to=to,
        timeout=text("--timeout") or TIMEOUT_DEFAULT,
        max_tokens=int(tokens) if tokens is not None else None,
        max_cost_usd=float(dollars) if dollars is not None else None,
        machine_timeout=text("--machine-timeout") or PLACEMENT_TIMEOUT_DEFAULT,
        wait_for_slot=text("--wait-for-slot"),
        wait=bool(opts.get("--wait")),
        follow=bool(opts.get("--follow")),
        wait_timeout=text("--wait-timeout"),
        as_json=as_json,
    )


def list_command(to: str | None, all_machines: bool, machine_timeout: str, stalled: bool, as_json: bool) -> None:
    """`wb agent list` (docs/cli.md, wb agent list)."""
    from courier.client.client import Client
    from courier.commands import check_list_scope, machine_timeout_s, target
    from courier.config import load_config
    from protocol.models import collector_paused

    check_list_scope(to, all_machines)
    bound_s = machine_timeout_s(machine_timeout)
    client = Client(load_config())
    if all_machines:
        # 64 machines × 50 runs: thousands of acyclic results; the collector's passes over the
        # growing heap free nothing that reference counting does not (docs/benchmarks.md, fleet).
        with collector_paused():
            client.list_all(bound_s, as_json=as_json, stalled_only=stalled)
        return
    from courier.ops.list_ import list_lines, listed
    from courier.render import results_json
    from protocol.refs import format_reference

    machine, _ = target(None, to)
    # Thousands of short-lived, acyclic objects: the cyclic collector would only re-walk them.
    with collector_paused():
        response = client.list_(machine, timeout_s=bound_s)
        results = listed(response, stalled_only=stalled)
        if as_json:
            cli_io.out(results_json(results))
        else:
            cli_io.out_lines(list_lines(results).splitlines(keepends=True))
    if response.warnings:
        for warning in response.warnings:
            cli_io.warn(f"{format_reference(machine, warning.agent_id)}: {warning.error}")
        raise Finding("some run records could not be read (named above); the others are listed")


def status_command(reference: str, to: str | None, machine_timeout: str, as_json: bool) -> None:
    """`wb agent status` (docs/cli.md, wb agent status)."""
    from courier.client.client import Client
    from courier.commands import machine_timeout_s
    from courier.config import load_config
    from courier.ops.status import status_request, status_text
    from courier.render import to_json

    machine, request = status_request(reference, to)
    bound_s = machine_timeout_s(machine_timeout)
    result = Client(load_config()).status(machine, request.agent_id, timeout_s=bound_s)
    cli_io.out(to_json(result.to_wire()) if as_json else status_text(result))


def diff_command(reference: str, stat: bool, to: str | None, as_json: bool) -> None:
    """`wb agent diff` (docs/cli.md, wb agent diff)."""
    from courier.client.client import Client
    from courier.client.following import write_bytes
    from courier.config import load_config
    from courier.ops.diff import diff_json, diff_request, patch_bytes, stat_text
    from courier.text import escape_controls

    machine, request = diff_request(reference, to, stat=stat)
    result = Client(load_config()).diff(machine, request.agent_id, stat=request.stat)
    if as_json:
        cli_io.out(diff_json(result))
    elif stat:
        cli_io.out(stat_text(result))
    elif sys.stdout.isatty():
        cli_io.out(escape_controls(patch_bytes(result).decode("utf-8", "replace")))
    else:
        try:
            write_bytes(patch_bytes(result))
        except BrokenPipeError:
            cli_io.broken_pipe()
