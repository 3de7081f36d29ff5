"""An exec machine's receiver, started by a cold command before its own imports (docs/cli.md#exec-targets).

A cold call over an exec channel is two interpreters one after the other: this command's
(its imports, wb.yaml, the request) and the receiver's (its imports, pydantic's included),
about 150 and 110 ms on a two-core machine. When the command line names an exec machine and
wb.yaml's parsed copy says how it is reached (courier/channels/carrier_choice.py judges), the
command starts `argv + [wb_path, --wb-internal-agent-remote]` first, exactly as the exec channel
would, and the receiver imports on the other core while this process does. The channel's first
one-shot call to that machine takes the process (`take`) when its command line and environment are
exactly the ones started here; the request still goes to its stdin, then EOF, as always.

A process no call takes (the command refused its own flags, or asked nothing) is killed when this
command ends (`finish`): it was sent nothing, and a receiver that reads empty input creates nothing.
So no byte of a request reaches a machine before the request is validated, but the channel's
command itself starts before (docs/decisions.md): `WB_EXEC_EARLY=off` starts it only for the call.
Linux only: the channel waits on the adopted child through a pidfd (courier/channels/exec.py,
`AdoptedProcess`).

Imports only `subprocess` and `atexit`, and only when it starts something.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess

_started: dict[tuple[str, ...], subprocess.Popen[bytes]] = {}


def start(argv: list[str]) -> None:
    """Start `argv` with three pipes and this process's environment; a command that cannot start is left to
    the channel, which starts it again and names the setting."""
    import atexit
    import subprocess

    key = tuple(argv)
    if key in _started:
        return
    try:
        process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except (OSError, ValueError):
        return
    if not _started:
        atexit.register(finish)  # sys.exit paths; exit_now (courier/main.py) calls finish itself
    _started[key] = process


def take(argv: list[str], env: dict[str, str] | None) -> subprocess.Popen[bytes] | None:
    """The process started for exactly `argv` with this process's environment (`env` None), once."""
    if env is not None or not _started:
        return None
    return _started.pop(tuple(argv), None)


def finish() -> None:
    """Kill and reap every process no call took: it was never sent a request."""
    while _started:
        _, process = _started.popitem()
        process.kill()
        process.wait()
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None:
                stream.close()
