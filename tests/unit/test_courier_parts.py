"""The courier's small parts: frames, where the socket lives, and what the thin client sends."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from courier.channels import courier_frames as frames
from courier.channels import courier_socket as place
from courier.warm.child import Command


def test_frames_round_trip_any_bytes() -> None:
    fields = [b"run", b"", b"\x00\xff" * 1000, "é".encode()]
    packed = frames.pack(fields)
    assert frames.unpack(packed[4:]) == fields
    left, right = socket.socketpair()
    with left, right:
        frames.send_frame(left, fields)
        assert frames.recv_frame(right) == fields


@pytest.mark.parametrize("body", [b"", b"\x00\x00\x00\x02\x00\x00\x00\x01a", b"\x00\x00\x00\x01\x00\x00\x00\x09ab"])
def test_a_truncated_frame_is_refused(body: bytes) -> None:
    with pytest.raises(frames.FrameError):
        frames.unpack(body)


def test_an_oversize_frame_header_is_refused_before_reading_it() -> None:
    left, right = socket.socketpair()
    with left, right:
        left.sendall((frames.FRAME_MAX_BYTES + 1).to_bytes(4, "big"))
        with pytest.raises(frames.FrameError):
            frames.recv_frame(right)


def test_the_run_request_carries_argv_env_cwd_umask_and_which_stdio_were_passed() -> None:
    fields = [b"run", b"1", b"/work/dir", b"18", b"02", b"wb", b"2", b"agent", b"\xff-bytes", b"A=1", b"B==2", b"bad"]
    command = Command.parse(fields)
    assert command.cwd == "/work/dir" and command.umask == 0o22 and command.stdio == [0, 2]
    assert command.argv == ["agent", os.fsdecode(b"\xff-bytes")]
    assert command.env == {"A": "1", "B": "=2"}


def test_a_run_request_of_another_protocol_is_refused() -> None:
    with pytest.raises(ValueError):
        Command.parse([b"run", b"2", b"/", b"18", b"012", b"wb", b"0"])
    with pytest.raises(ValueError):
        Command.parse([b"run", b"1", b"/", b"18", b"012", b"wb", b"5", b"only-one"])


def test_the_socket_lives_under_a_private_wb_home(tmp_path: Path) -> None:
    home = tmp_path / "wbhome"
    env = {"HOME": str(tmp_path), "WB_HOME": str(home)}
    path = place.socket_path(env)
    assert path is not None and Path(path).parent == home / "run"  # a missing WB_HOME is created on start
    assert place.ensure_run_dir(path)
    assert (home.stat().st_mode & 0o777) == 0o700 and ((home / "run").stat().st_mode & 0o777) == 0o700
    home.chmod(0o777)
    assert place.socket_path(env) is None  # refused: the command runs cold and reports the home


def test_a_private_xdg_runtime_dir_is_preferred(tmp_path: Path) -> None:
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    env = {"HOME": str(tmp_path), "XDG_RUNTIME_DIR": str(runtime)}
    path = place.socket_path(env)
    assert path is not None and Path(path).parent == runtime / "wb"
    runtime.chmod(0o755)
    other = place.socket_path(env)
    assert other is not None and Path(other).parent == tmp_path / ".wb" / "run"


def test_different_setups_get_different_sockets(tmp_path: Path) -> None:
    base = {"HOME": str(tmp_path), "WB_HOME": str(tmp_path / "h")}
    paths = {place.socket_path({**base, **extra}) for extra in ({}, {"WB_SSH_CONFIG": "/x"}, {"SSH_AUTH_SOCK": "/a"})}
    assert len(paths) == 3
    assert place.socket_path(base) == place.socket_path(dict(base))


def test_a_long_socket_path_is_reached_through_its_directory(tmp_path: Path) -> None:
    directory = tmp_path / ("d" * 120)
    directory.mkdir()
    path = str(directory / "courier.sock")
    address, dir_fd = place.sun_path(path)
    assert dir_fd is not None and address.startswith("/proc/self/fd/")
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(address)
        server.listen(1)
        assert Path(path).exists()
    finally:
        server.close()
        os.close(dir_fd)
