"""Inside a confined worker's network namespace: 127.0.0.1:PORT → a Unix socket the owner listens on.

    python -I -S sandbox_forwarder.py CHUNK PORT=/run/dir/sockets/relay.sock [...] -- HARNESS ARGV...

Started by bwrap before the harness (docs/security.md#confined-runs). It binds every listener
first (so the harness can connect at once: early connections wait in the backlog), forks one
child that carries connections, and execs the harness in its own place, so the harness keeps
the process bwrap waits for and its exit code is the worker's. The child dies with the PID
namespace when the harness ends. Standard library only, run with -I -S: nothing of wb's is
imported inside the sandbox.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading

_chunk = 1  # bytes per read: the first argument (courier/runs/sandbox.py passes wb's bound; nothing of wb is imported)
# A socket path longer than sun_path (108 bytes) is reached through its directory's descriptor.
_SUN_PATH_MAX = 100


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while True:
            data = source.recv(_chunk)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for end, how in ((sink, socket.SHUT_WR), (source, socket.SHUT_RD)):
            with contextlib.suppress(OSError):
                end.shutdown(how)


def _connect_unix(path: str) -> socket.socket:
    target = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if len(path.encode()) <= _SUN_PATH_MAX:
        target.connect(path)
        return target
    fd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        target.connect(f"/proc/self/fd/{fd}/{os.path.basename(path)}")
    finally:
        os.close(fd)
    return target


def _carry(client: socket.socket, path: str) -> None:
    try:
        upstream = _connect_unix(path)
    except OSError:
        client.close()
        return
    back = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
    back.start()
    _pipe(client, upstream)
    back.join()
    client.close()
    upstream.close()


def _serve(listener: socket.socket, path: str) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=_carry, args=(client, path), daemon=True).start()


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print("sandbox_forwarder: usage: PORT=SOCKET ... -- ARGV", file=sys.stderr)
        return 2
    global _chunk
    split = argv.index("--")
    pairs, command = argv[1:split], argv[split + 1 :]
    _chunk = int(argv[0])
    listeners = []
    for pair in pairs:
        port, _, path = pair.partition("=")
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", int(port)))
        listener.listen(64)
        listeners.append((listener, path))
    if os.fork() == 0:
        # The carrier holds none of the harness's stdio: the owner's pipe ends with the harness.
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        threads = [threading.Thread(target=_serve, args=pair, daemon=True) for pair in listeners]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        os._exit(0)
    for listener, _ in listeners:
        listener.close()
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"could not start {command[0]}: {exc.strerror or exc}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
