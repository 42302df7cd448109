"""Sharing on the node's real GPUs: time slices through the host driver's `nvidia-smi
compute-policy`, MPS through one `nvidia-cuda-mps-control` daemon per claim."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dradriver.discovery.driverroot import BINARY_DIRS, find_binary
from dradriver.prepare.cdi import ContainerEdits
from dradriver.prepare.config import Interval, Sharing, TimeSlicing
from dradriver.prepare.sharing_settings import MpsDaemons, SharedDevice, run_tool, timeslice_env

#: nvidia-smi compute-policy --set-timeslice values.
TIMESLICE_VALUES: dict[Interval, int] = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}


class NvidiaSharing:
    """Uses the host driver's nvidia-smi and nvidia-cuda-mps-control, found under its root."""

    def __init__(self, driver_root: Path, state_dir: Path, host_state_dir: Path | None = None) -> None:
        self._nvidia_smi = _host_tool(driver_root, "nvidia-smi")
        control = _host_tool(driver_root, "nvidia-cuda-mps-control")
        self._mps = MpsDaemons([control], state_dir, host_state_dir)

    def apply(self, claim_uid: str, sharing: Sharing, devices: Sequence[SharedDevice]) -> ContainerEdits:
        if sharing.strategy == "TimeSlicing":
            interval = (sharing.time_slicing or TimeSlicing()).interval
            for device in devices:
                self._set_timeslice(device.uuid, interval)
            return ContainerEdits(env=(timeslice_env(interval),))
        return self._mps.start(claim_uid, sharing, devices)

    def release(self, claim_uid: str, sharing: str, uuids: Sequence[str]) -> None:
        if sharing.startswith("TimeSlicing"):
            for uuid in uuids:
                self._set_timeslice(uuid, "Default")
        elif sharing == "MPS":
            self._mps.stop(claim_uid)

    def _set_timeslice(self, uuid: str, interval: Interval) -> None:
        run_tool(
            [
                self._nvidia_smi,
                "compute-policy",
                "-i",
                uuid,
                f"--set-timeslice={TIMESLICE_VALUES[interval]}",
            ]
        )


def _host_tool(driver_root: Path, name: str) -> str:
    """The tool's path in the host driver; a missing one is named when it is first run."""
    found = find_binary(driver_root, name)
    return str(found) if found is not None else str(driver_root / BINARY_DIRS[0] / name)
