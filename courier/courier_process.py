"""The courier process: `python -m courier.courier_process <socket> [<ready fd>]`, started by the thin client.

It takes the per-environment lock first (a second courier for the same socket exits at
once), then imports the whole program once, listens on the unix socket (0600 in a 0700
directory, peer uid checked with SO_PEERCRED) and serves three kinds of connection:
`run` (fork a child that runs one command on the caller's fds), `remote` (a child's
remote call, carried on the pooled connection or serve process) and `status`/`stop`. It
exits after `courier.idle` without work, on `wb courier stop`, on SIGTERM, and when wb on
disk was upgraded (the next command starts a courier of the new program).

This entry module sits at the top, beside `courier.main`: it is the one that knows the
command line (`courier.cli.run`) and hands it down to `courier.warm.daemon`, so nothing in
`courier/warm/` imports upwards.
"""

from __future__ import annotations

import fcntl
import gc
import os
import sys
from collections.abc import Callable


def load_program() -> Callable[[list[str]], int]:
    """The whole program, loaded once: every command forked from the courier starts with it in memory."""
    import courier.call.caller
    import courier.channels.courier
    import courier.channels.exec
    import courier.channels.ssh
    import courier.cli
    import courier.client.fleet
    import courier.client.transport
    import courier.executor.perform
    import courier.runs.owner  # a run's owner is a copy of the command that dispatched it (docs/runs.md#the-owner)
    import courier.runs.service
    import courier.runs.worktrees
    from courier import deferred_models
    from courier.runs.harness import REGISTRY, harness_for

    for harness in REGISTRY:
        harness_for(harness)  # each harness's module, as its owner loads it
    courier.cli.prepare()  # every click command and option coercion, built once here
    deferred_models.build_all()  # so no child rebuilds one
    # Objects that exist now live as long as the courier: out of the collector's reach, a
    # child's collections neither walk them nor copy the pages they sit on (copy-on-write).
    gc.freeze()
    return courier.cli.run


def main() -> None:
    path = sys.argv[1]
    ready_fd = int(sys.argv[2]) if len(sys.argv) > 2 else -1
    from courier.channels import courier_socket as place

    lock_fd = os.open(place.lock_path(path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        sys.exit(0)  # another courier serves this environment; the client connects to it
    # The program's first import stays in the path: `-m` put the package's parent first.
    sys.path[0] = os.getcwd()
    os.chdir("/")
    from courier import no_plugins

    no_plugins.install()  # the same models as a cold command, loaded once (courier/no_plugins.py)
    runner = load_program()
    from courier.warm.daemon import serve_forever

    sys.exit(serve_forever(path, ready_fd, lock_fd, runner))


if __name__ == "__main__":
    main()
