"""MpsDaemons, one MPS control daemon per claim, with the fake backend's stand-in control daemon
(`dradriver.backend.fake.mps_standin`) running as the real process it is."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from dradriver.prepare.sharing_settings import MPS_STANDIN, MpsDaemons, SharingError, mps_directory
from tests.helpers import short_tmpdir, wait_for
from tests.prepare.sharing_setup import UUIDS, Device, sharing


@pytest.fixture
def state() -> Iterator[Path]:
    """A state directory short enough for the sockets MPS binds in it (pytest's tmp_path is not)."""
    with short_tmpdir() as root:
        yield root / "state"


def standin(pipe: Path, commands: str) -> subprocess.CompletedProcess[str]:
    """The stand-in's client mode, as `nvidia-cuda-mps-control` without arguments."""
    return subprocess.run(
        [*MPS_STANDIN],
        input=commands,
        env=os.environ | {"CUDA_MPS_PIPE_DIRECTORY": str(pipe)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_the_stand_in_daemon_answers_like_the_mps_control_tool(state: Path) -> None:
    daemons = MpsDaemons(MPS_STANDIN, state)
    config = sharing({"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 30}})
    daemons.start("uid-1", config, [Device("gpu-0", UUIDS[0])])
    pipe = state / "mps" / mps_directory("uid-1") / "pipe"
    answer = standin(
        pipe, f"get_default_active_thread_percentage\nget_default_device_pinned_mem_limit {UUIDS[0]}\n"
    )
    assert (answer.returncode, answer.stdout.splitlines()) == (0, ["30", "none"])
    refused = standin(pipe, f"set_default_device_pinned_mem_limit {UUIDS[1]} 10M\nstart_server -uid 0\n")
    assert refused.returncode == 1
    assert refused.stderr.splitlines() == [
        f"error: device {UUIDS[1]} is not visible to this daemon",
        "error: unknown command 'start_server -uid 0'",
    ]
    log = (state / "mps" / mps_directory("uid-1") / "log" / "control.log").read_text()
    assert "set_default_active_thread_percentage 30 -> ok" in log
    daemons.stop("uid-1")
    gone = standin(pipe, "get_default_active_thread_percentage\n")
    assert gone.returncode == 1
    assert "cannot reach the MPS control daemon" in gone.stderr


def test_a_stand_in_that_does_not_come_up_is_a_clear_error(tmp_path: Path, state: Path) -> None:
    broken = tmp_path / "broken-mps-control"
    broken.write_text("#!/bin/sh\necho 'MPS control daemon: no GPUs' >&2\nexit 3\n")
    broken.chmod(0o755)
    daemons = MpsDaemons([str(broken)], state)
    with pytest.raises(SharingError, match=r"did not start \(exit 3\): MPS control daemon: no GPUs"):
        daemons.start("uid-1", sharing({"strategy": "MPS"}), [Device("gpu-0", UUIDS[0])])


def test_a_state_directory_too_long_for_the_mps_sockets_is_a_clear_error(tmp_path: Path) -> None:
    """The control daemon cannot bind its sockets there: it would exit 1 without a word."""
    daemons = MpsDaemons(MPS_STANDIN, tmp_path / ("d" * 60) / "state")
    for _ in range(2):  # the refused claim is not left half-started
        with pytest.raises(SharingError, match=r"/pipe/control_privileged would be longer than 107 bytes"):
            daemons.start("uid-1", sharing({"strategy": "MPS"}), [Device("gpu-0", UUIDS[0])])


def test_sigterm_stops_the_stand_in_and_removes_its_socket(tmp_path: Path) -> None:
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    daemon = subprocess.Popen([*MPS_STANDIN, "-f"], env=os.environ | {"CUDA_MPS_PIPE_DIRECTORY": str(pipe)})
    wait_for((pipe / "control").is_socket, 30, "the stand-in's control socket")
    daemon.send_signal(signal.SIGTERM)
    assert daemon.wait(30) == 0
    assert sorted(p.name for p in pipe.iterdir()) == []
