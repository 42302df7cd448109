"""Applying a claim's sharing settings to its GPUs, behind one small interface.

`NvidiaSharing` drives the real tools of the host driver (`nvidia-smi compute-policy` for time
slices, one `nvidia-cuda-mps-control` daemon per claim for MPS). `FakeSharing` serves the fake
GPU backend: it records time slices in memory and refuses MPS, which needs a real daemon — an
error the claim reports, rather than a setting silently ignored.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from dradriver import logs
from dradriver.prepare.cdi import ContainerEdits, Mount
from dradriver.prepare.config import Interval, Sharing, TimeSlicing

#: nvidia-smi compute-policy --set-timeslice values.
TIMESLICE_VALUES: dict[Interval, int] = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}
MPS_PIPE_IN_CONTAINER = "/tmp/nvidia-mps"
TOOL_TIMEOUT_SECONDS = 20.0

log = logs.get_logger(component="sharing")


class SharingError(Exception):
    pass


class SharedDevice(Protocol):
    """What sharing needs to know of a prepared device."""

    @property
    def name(self) -> str: ...

    @property
    def uuid(self) -> str: ...


class SharingControl(Protocol):
    def apply(self, claim_uid: str, sharing: Sharing, devices: Sequence[SharedDevice]) -> ContainerEdits:
        """Put the setting into effect for these devices; the edits go into the claim's CDI spec."""
        ...

    def release(self, claim_uid: str, sharing: str, uuids: Sequence[str]) -> None:
        """Undo `apply` (by the description stored in the checkpoint); must tolerate repeats."""
        ...


def timeslice_env(interval: Interval) -> str:
    return f"DRADRIVER_TIMESLICE_INTERVAL={interval}"


class FakeSharing:
    """Time slices land in memory (inspectable by tests); MPS is refused."""

    def __init__(self) -> None:
        self.timeslices: dict[str, Interval] = {}
        self._lock = threading.Lock()

    def apply(self, claim_uid: str, sharing: Sharing, devices: Sequence[SharedDevice]) -> ContainerEdits:
        if sharing.strategy == "MPS":
            raise SharingError("MPS cannot be applied: the fake GPU backend has no NVIDIA MPS control daemon")
        interval = (sharing.time_slicing or TimeSlicing()).interval
        with self._lock:
            for device in devices:
                self.timeslices[device.uuid] = interval
        return ContainerEdits(env=(timeslice_env(interval),))

    def release(self, claim_uid: str, sharing: str, uuids: Sequence[str]) -> None:
        with self._lock:
            for uuid in uuids:
                self.timeslices.pop(uuid, None)


class NvidiaSharing:
    """Uses the host driver's nvidia-smi and nvidia-cuda-mps-control."""

    def __init__(self, tools_dir: Path, state_dir: Path, host_state_dir: Path | None = None) -> None:
        self._nvidia_smi = tools_dir / "nvidia-smi"
        self._mps_control = tools_dir / "nvidia-cuda-mps-control"
        self._state_dir = state_dir / "mps"
        self._host_state_dir = (host_state_dir or state_dir) / "mps"

    def apply(self, claim_uid: str, sharing: Sharing, devices: Sequence[SharedDevice]) -> ContainerEdits:
        if sharing.strategy == "TimeSlicing":
            interval = (sharing.time_slicing or TimeSlicing()).interval
            for device in devices:
                self._set_timeslice(device.uuid, interval)
            return ContainerEdits(env=(timeslice_env(interval),))
        return self._start_mps(claim_uid, sharing, devices)

    def release(self, claim_uid: str, sharing: str, uuids: Sequence[str]) -> None:
        if sharing.startswith("TimeSlicing"):
            for uuid in uuids:
                self._set_timeslice(uuid, "Default")
        elif sharing == "MPS":
            self._stop_mps(claim_uid)

    def _run(self, argv: list[str], *, env: dict[str, str] | None = None, stdin: str | None = None) -> None:
        try:
            result = subprocess.run(
                argv,
                input=stdin,
                env=env,
                capture_output=True,
                text=True,
                timeout=TOOL_TIMEOUT_SECONDS,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            raise SharingError(f"{argv[0]}: {err}") from err
        if result.returncode != 0:
            detail = (result.stderr or result.stdout).strip().splitlines()
            raise SharingError(
                f"{' '.join(argv)} failed ({result.returncode}): {detail[-1] if detail else ''}"
            )

    def _set_timeslice(self, uuid: str, interval: Interval) -> None:
        self._run(
            [
                str(self._nvidia_smi),
                "compute-policy",
                "-i",
                uuid,
                f"--set-timeslice={TIMESLICE_VALUES[interval]}",
            ]
        )

    def _mps_env(self, claim_uid: str, uuids: Sequence[str]) -> dict[str, str]:
        root = self._state_dir / claim_uid
        return os.environ | {
            "CUDA_MPS_PIPE_DIRECTORY": str(root / "pipe"),
            "CUDA_MPS_LOG_DIRECTORY": str(root / "log"),
            "CUDA_VISIBLE_DEVICES": ",".join(uuids),
        }

    def _start_mps(self, claim_uid: str, sharing: Sharing, devices: Sequence[SharedDevice]) -> ContainerEdits:
        uuids = [d.uuid for d in devices]
        env = self._mps_env(claim_uid, uuids)
        for key in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
            Path(env[key]).mkdir(parents=True, exist_ok=True)
        self._run([str(self._mps_control), "-d"], env=env)
        commands = []
        mps = sharing.mps
        if mps is not None and mps.default_active_thread_percentage is not None:
            commands.append(f"set_default_active_thread_percentage {mps.default_active_thread_percentage}")
        for device in devices:
            limit = _pinned_limit(sharing, device)
            if limit is not None:
                commands.append(f"set_default_device_pinned_mem_limit {device.uuid} {limit}")
        if commands:
            self._run([str(self._mps_control)], env=env, stdin="\n".join(commands) + "\n")
        host_pipe = self._host_state_dir / claim_uid / "pipe"
        return ContainerEdits(
            env=(f"CUDA_MPS_PIPE_DIRECTORY={MPS_PIPE_IN_CONTAINER}",),
            mounts=(
                Mount(str(host_pipe), MPS_PIPE_IN_CONTAINER, ("rw", "nosuid", "nodev", "rbind", "rprivate")),
            ),
        )

    def _stop_mps(self, claim_uid: str) -> None:
        root = self._state_dir / claim_uid
        if not root.exists():
            return
        try:
            self._run([str(self._mps_control)], env=self._mps_env(claim_uid, []), stdin="quit\n")
        except SharingError as err:
            log.warning(
                "could not stop the MPS daemon; removing its directory anyway",
                claim=claim_uid,
                error=str(err),
            )
        shutil.rmtree(root, ignore_errors=True)


def _pinned_limit(sharing: Sharing, device: SharedDevice) -> str | None:
    """The pinned-memory limit for a device in the `<MiB>M` form the MPS control daemon takes."""
    mps = sharing.mps
    if mps is None:
        return None
    per_device = mps.per_device_pinned_memory_limit or {}
    text = (
        per_device.get(device.name) or per_device.get(device.uuid) or mps.default_pinned_device_memory_limit
    )
    if text is None:
        return None
    from dradriver.quantity import Quantity

    return f"{Quantity.parse(text).as_approximate_float() / 2**20:.0f}M"
