"""Console entry: routes the private argv[1] values, then the courier, before typer is imported."""

from __future__ import annotations

import os
import sys

from courier.stage_trace import mark
from protocol import limits
from protocol.entry import LAUNCHER_ARGUMENT, OWNER_ARGUMENT, REMOTE_ARGUMENT, SERVE_ARGUMENT

TYPE_CHECKING = False  # typing's own import loads `re`, which the warm path never does
if TYPE_CHECKING:
    from typing import NoReturn


def exit_now(code: int) -> NoReturn:
    """End the process with `code` once stdout and stderr are written, without the interpreter's teardown.

    Tearing down the modules a cold call loads (pydantic's schemas, asyncssh, cryptography)
    frees every object one by one: about 20 ms of the receiver's 140 and 40 ms of a cold remote
    `status` (docs/benchmarks.md#the-interpreters-teardown). The paths that end here hold no
    atexit handler, temporary file or thread that teardown would still have to finish.
    """
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:
        code = limits.EXIT_STDOUT_CLOSED  # the reader left: what cli_io.broken_pipe() exits with
    carrier = sys.modules.get("courier.channels.ssh_carrier")
    if carrier is not None:
        carrier.finish()  # the SSH carrier, if this command started one, ends with it
    early = sys.modules.get("courier.channels.exec_early")
    if early is not None:
        early.finish()  # and an exec receiver it started that no call took
    os._exit(code)


# Commands that always run in this process: the courier's own controls, the demo and `wb ui`
# (which run servers of their own), `wb config check` (it reads a file that may be broken and
# creates nothing, not even the courier's socket), and any private entry.
COLD_COMMANDS = ("config", "courier", "demo", "mcp", "ui")


def main() -> None:
    if sys.platform.startswith("win"):
        sys.stderr.write("error: wb supports Linux and macOS only\n")
        sys.exit(limits.EXIT_USAGE)
    argv1 = sys.argv[1] if len(sys.argv) > 1 else ""
    if argv1 == REMOTE_ARGUMENT:
        mark("main.receiver")  # each process's first mark: its interpreter has started (docs/benchmarks.md)
        # The hot path of every remote call: protocol, the store and one operation, nothing else.
        from courier.receiver.serve import serve

        exit_now(serve(sys.argv[2:]))
    if argv1 == SERVE_ARGUMENT:
        mark("main.serve")
        # The remote session mode (docs/courier.md): as light as the one-call receiver.
        from courier.receiver.session import serve_session

        sys.exit(serve_session(sys.argv[2:]))
    if argv1 == OWNER_ARGUMENT:
        mark("main.owner")
        from courier import no_plugins

        no_plugins.install()  # every run's owner validates models: no scan of installed distributions
        from courier.runs.owner import owner_main

        sys.exit(owner_main(sys.argv[2:]))
    mark("main.cli")
    if argv1 == LAUNCHER_ARGUMENT:
        from courier.runs.launcher import serve_launches

        exit_now(serve_launches(sys.argv[2:]))
    if sys.argv[1:] == ["mcp"]:
        # The MCP server without the CLI's argument layer: `initialize` waits on nothing but the SDK,
        # and on none of the SDK's client and HTTP parts its package inits would import.
        from courier.bare_packages import register_bare

        register_bare("mcp", "mcp.server")
        from courier.mcp_server import main as serve_mcp

        sys.exit(serve_mcp())
    if argv1 not in COLD_COMMANDS and not argv1.startswith("--wb-internal-") and sys.platform.startswith("linux"):
        # The warm path (docs/courier.md): a few ms here, the command itself in the courier.
        from courier.warm.thin_client import run as run_warm

        try:
            code = run_warm(sys.argv[1:])
        except Exception:  # the courier may make wb faster, never make it fail
            code = None
        if code is not None:
            sys.exit(code)
    from courier.channels.carrier_choice import plan

    try:
        carrier, receivers = plan(sys.argv[1:])
        if carrier:
            # Before pydantic and wb.yaml: asyncssh is imported meanwhile, in a copy of this process on another
            # core, and that copy makes the command's SSH calls (courier/channels/ssh_carrier.py).
            from courier.channels import ssh_carrier

            ssh_carrier.start()
        if receivers and sys.platform.startswith("linux") and os.environ.get("WB_EXEC_EARLY") != "off":
            # Likewise an exec machine's receiver: it imports on the other core while this process does.
            from courier.channels import exec_early

            for receiver in receivers:
                exec_early.start(receiver)
    except Exception:  # like the courier, the carrier may make wb faster, never make it fail
        pass
    from courier import no_plugins

    no_plugins.install()
    # `wb agent list` and `status` without typer (courier/hot.py); any other argv: typer's.
    from courier.hot import run as run_hot

    code = run_hot(sys.argv[1:])
    if code is not None:
        exit_now(code)
    from courier.cli import run

    sys.exit(run(sys.argv[1:]))


if __name__ == "__main__":
    main()
