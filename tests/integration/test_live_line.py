"""`await` on a terminal (docs/cli.md, wb agent await): one live line on stderr, redrawn while the run goes on and
erased before the facts; stdout is what it is without a terminal. A real pty, the installed command."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios

from conftest import Machine

ERASE = "\r\x1b[K"


def _await_on_a_terminal(machine: Machine, *args: str, columns: int = 200) -> tuple[int, str, str]:
    """(exit code, stdout, what the terminal on stderr, `columns` wide, received)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    process = subprocess.Popen(
        [sys.executable, "-m", "courier.main", "agent", *args],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave, env=machine.env, cwd=machine.root,
    )  # fmt: skip
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: every writer of the terminal is gone
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    assert process.stdout is not None
    with process.stdout:
        stdout = process.stdout.read().decode()
    return process.wait(timeout=60), stdout, seen.decode()


def _facts(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith("process:")]  # the owner may be exiting


def test_await_on_a_terminal_draws_a_live_line_on_stderr_and_erases_it_before_the_facts(machine: Machine) -> None:
    machine.clone()
    ref = machine.dispatch(task="scenario:steps steps:3 every:1")
    code, stdout, terminal = _await_on_a_terminal(machine, "await", ref, "--wait-timeout", "60s")
    assert code == 0, terminal
    frames = [frame for frame in terminal.split(ERASE) if frame]
    assert frames and terminal.endswith(ERASE), repr(terminal)  # drawn, then erased
    assert all(frame.startswith(f"{ref} running ") and "\n" not in frame for frame in frames), frames
    assert any(frame.endswith(" · ran: /bin/bash -lc 'echo step 2'") for frame in frames), frames
    plain = machine.wb("agent", "await", ref)  # stdout is not a terminal here, nor stderr: no line
    assert plain.stderr == "" and _facts(stdout) == _facts(plain.stdout)


def test_the_line_fits_its_terminal_and_json_draws_none(machine: Machine) -> None:
    machine.clone()
    ref = machine.dispatch(task="scenario:steps steps:2 every:1")
    code, _, terminal = _await_on_a_terminal(machine, "await", ref, columns=40)
    frames = [frame for frame in terminal.split(ERASE) if frame]
    assert code == 0 and frames and all(len(frame) <= 39 for frame in frames), frames  # a wrapped line stays
    code, stdout, terminal = _await_on_a_terminal(machine, "await", ref, "--json")
    assert code == 0 and terminal == "" and stdout.startswith("{")
