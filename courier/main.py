"""Console entry: routes the private argv[1] values before typer is imported."""

from __future__ import annotations

import sys

from protocol.entry import OWNER_ARGUMENT, REMOTE_ARGUMENT


def main() -> None:
    if sys.platform.startswith("win"):
        sys.stderr.write("error: wb supports Linux and macOS only\n")
        sys.exit(2)
    argv1 = sys.argv[1] if len(sys.argv) > 1 else ""
    if argv1 == REMOTE_ARGUMENT:
        # The hot path of every remote call: protocol, the store and one operation, nothing else.
        from courier.remote.serve import serve

        sys.exit(serve(sys.argv[2:]))
    if argv1 == OWNER_ARGUMENT:
        from courier.runs.owner import owner_main

        sys.exit(owner_main(sys.argv[2:]))
    from courier.cli import run

    sys.exit(run(sys.argv[1:]))


if __name__ == "__main__":
    main()
