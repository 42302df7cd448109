"""NvidiaSharing drives the host driver's real tools; here they are stand-in executables that
record how they were called (argv, environment, stdin), run as real subprocesses. The MPS
control tool then behaves like the fake backend's stand-in (`dradriver.backend.fake.mps_standin`),
which runs as the real process it is."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from dradriver.backend.nvml.sharing import NvidiaSharing
from dradriver.prepare.sharing_settings import SharingError, mps_directory
from tests.helpers import short_tmpdir
from tests.prepare.sharing_setup import UUIDS, Device, sharing

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
    standin = [sys.executable, "-m", "dradriver.backend.fake.mps_standin", *sys.argv[1:]]
    if not client:
        os.execv(sys.executable, standin)
    sys.exit(subprocess.run(standin, input=entry["stdin"], text=True, check=False).returncode)
"""


@pytest.fixture
def tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "usr" / "bin"
    directory.mkdir(parents=True)
    for tool in ("nvidia-smi", "nvidia-cuda-mps-control"):
        (directory / tool).write_text(f"#!{sys.executable}\n{RECORDER}")
        (directory / tool).chmod(0o755)
    monkeypatch.setenv("SHARING_LOG", str(tmp_path / "calls.log"))
    return directory


def calls(tools: Path) -> list[dict[str, Any]]:
    log = tools.parent.parent / "calls.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


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


def test_mps_runs_one_daemon_per_claim_with_its_limits(tools: Path) -> None:
    """The state directory is short enough for the sockets MPS binds in it (tmp_path is not)."""
    with short_tmpdir() as root:
        state = root / "state"
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
