"""NvidiaSharing drives the host driver's real tools; here they are stand-in executables that
record how they were called (argv, environment, stdin), run as real subprocesses. The fake
backend's MPS control daemon (`dradriver.prepare.mps_standin`) runs as the real process it is."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dradriver.prepare.config import parse
from dradriver.prepare.sharing import MPS_STANDIN, MpsDaemons, NvidiaSharing, SharingError, mps_directory
from tests.helpers import short_tmpdir, wait_for

UUIDS = ["GPU-11111111-2222-3333-4444-555555555555", "GPU-66666666-7777-8888-9999-000000000000"]
RECORDER = """import json, os, subprocess, sys
client = sys.argv[1:] == [] and os.path.basename(sys.argv[0]) == "nvidia-cuda-mps-control"
entry = {"tool": os.path.basename(sys.argv[0]), "argv": sys.argv[1:],
         "pipe": os.environ.get("CUDA_MPS_PIPE_DIRECTORY"), "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
         "stdin": sys.stdin.read() if client else ""}
with open(os.environ["SHARING_LOG"], "a") as log:
    log.write(json.dumps(entry) + "\\n")
if os.environ.get("SHARING_FAIL"):
    print("Failed to set compute policy: Insufficient Permissions", file=sys.stderr)
    sys.exit(4)
if entry["tool"] == "nvidia-cuda-mps-control":  # then behave like it: the stand-in does
    standin = [sys.executable, "-m", "dradriver.prepare.mps_standin", *sys.argv[1:]]
    if not client:
        os.execv(sys.executable, standin)
    sys.exit(subprocess.run(standin, input=entry["stdin"], text=True, check=False).returncode)
"""


class Device:
    def __init__(self, name: str, uuid: str) -> None:
        self.name = name
        self.uuid = uuid


@pytest.fixture
def tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "usr" / "bin"
    directory.mkdir(parents=True)
    for tool in ("nvidia-smi", "nvidia-cuda-mps-control"):
        (directory / tool).write_text(f"#!{sys.executable}\n{RECORDER}")
        (directory / tool).chmod(0o755)
    monkeypatch.setenv("SHARING_LOG", str(tmp_path / "calls.log"))
    return directory


@pytest.fixture
def state() -> Iterator[Path]:
    """A state directory short enough for the sockets MPS binds in it (pytest's tmp_path is not)."""
    with short_tmpdir() as root:
        yield root / "state"


def calls(tools: Path) -> list[dict[str, Any]]:
    log = tools.parent.parent / "calls.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def sharing(strategy: dict[str, Any]) -> Any:
    config = parse({"apiVersion": "gpu.dradriver.dev/v1alpha1", "kind": "GpuConfig", "sharing": strategy})
    return config.sharing


def test_time_slicing_sets_and_resets_the_policy(tools: Path, tmp_path: Path) -> None:
    control = NvidiaSharing(tools.parent.parent, tmp_path / "state")
    devices = [Device("gpu-0", UUIDS[0]), Device("gpu-1", UUIDS[1])]
    edits = control.apply(
        "claim-uid", sharing({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}), devices
    )
    assert edits.env == ("DRADRIVER_TIMESLICE_INTERVAL=Long",)
    control.release("claim-uid", "TimeSlicing(Long)", UUIDS)
    assert [(c["tool"], c["argv"]) for c in calls(tools)] == [
        ("nvidia-smi", ["compute-policy", "-i", UUIDS[0], "--set-timeslice=3"]),
        ("nvidia-smi", ["compute-policy", "-i", UUIDS[1], "--set-timeslice=3"]),
        ("nvidia-smi", ["compute-policy", "-i", UUIDS[0], "--set-timeslice=0"]),
        ("nvidia-smi", ["compute-policy", "-i", UUIDS[1], "--set-timeslice=0"]),
    ]


def test_mps_runs_one_daemon_per_claim_with_its_limits(tools: Path, state: Path) -> None:
    host_state = Path("/var/lib/kubelet/plugins/gpu")
    control = NvidiaSharing(tools.parent.parent, state, host_state_dir=host_state)
    config = sharing(
        {
            "strategy": "MPS",
            "mps": {
                "defaultActiveThreadPercentage": 50,
                "defaultPinnedDeviceMemoryLimit": "10Gi",
                "perDevicePinnedMemoryLimit": {"gpu-1": "20Gi"},
            },
        }
    )
    edits = control.apply("uid-1", config, [Device("gpu-0", UUIDS[0]), Device("gpu-1", UUIDS[1])])
    pipe = state / "mps" / mps_directory("uid-1") / "pipe"
    assert pipe.is_dir()
    start, configure = calls(tools)
    assert (start["tool"], start["argv"], start["pipe"]) == ("nvidia-cuda-mps-control", ["-f"], str(pipe))
    assert start["visible"] == ",".join(UUIDS)  # the daemon sees only the claim's GPUs
    assert configure["stdin"].splitlines() == [
        "set_default_active_thread_percentage 50",
        f"set_default_device_pinned_mem_limit {UUIDS[0]} 10240M",
        f"set_default_device_pinned_mem_limit {UUIDS[1]} 20480M",
    ]
    assert edits.env == ("CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",)
    (mount,) = edits.mounts
    assert (mount.host_path, mount.container_path) == (
        f"/var/lib/kubelet/plugins/gpu/mps/{mps_directory('uid-1')}/pipe",
        "/tmp/nvidia-mps",
    )
    control.release("uid-1", "MPS", UUIDS)
    assert calls(tools)[-1]["stdin"] == "quit\n"
    assert not (state / "mps" / mps_directory("uid-1")).exists()
    control.release("uid-1", "MPS", UUIDS)  # repeated after a crash: nothing left to do, no error


def test_a_failing_tool_is_a_clear_error(
    tools: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHARING_FAIL", "1")
    control = NvidiaSharing(tools.parent.parent, tmp_path / "state")
    with pytest.raises(
        SharingError, match=r"set-timeslice=1 failed \(4\): Failed to set compute policy: Insufficient"
    ):
        control.apply(
            "u",
            sharing({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Short"}}),
            [Device("gpu-0", UUIDS[0])],
        )
    missing = NvidiaSharing(tmp_path / "nowhere", tmp_path / "state")
    with pytest.raises(SharingError, match="No such file"):
        missing.apply("u", sharing({"strategy": "TimeSlicing"}), [Device("gpu-0", UUIDS[0])])


def test_the_tools_are_found_in_a_driver_root_with_bin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The /usr/local/nvidia layout (GKE, and the GPU machines this was tried on): bin/, lib64/."""
    root = tmp_path / "usr" / "local" / "nvidia"
    (root / "bin").mkdir(parents=True)
    for tool in ("nvidia-smi", "nvidia-cuda-mps-control"):
        (root / "bin" / tool).write_text(f"#!{sys.executable}\n{RECORDER}")
        (root / "bin" / tool).chmod(0o755)
    monkeypatch.setenv("SHARING_LOG", str(tmp_path / "calls.log"))
    control = NvidiaSharing(root, tmp_path / "state")
    control.apply("u", sharing({"strategy": "TimeSlicing"}), [Device("gpu-0", UUIDS[0])])
    (call,) = [json.loads(line) for line in (tmp_path / "calls.log").read_text().splitlines()]
    assert call["tool"] == "nvidia-smi"
    assert call["argv"] == ["compute-policy", "-i", UUIDS[0], "--set-timeslice=0"]


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
