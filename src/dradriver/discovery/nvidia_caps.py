"""The NVIDIA device nodes whose numbers the driver assigns at load time (nvidia-caps, nvidia-uvm).

A container using a MIG device needs /dev/nvidia<parent minor> plus two capability nodes,
/dev/nvidia-caps/nvidia-cap<m>, one for the GPU instance and one for the compute instance.
The driver lists the minors in /proc/driver/nvidia-caps/mig-minors ("gpu0/gi1/access 12",
"gpu0/gi1/ci0/access 13", keyed by the GPU's minor number) and registers the character majors
of "nvidia-caps" and "nvidia-uvm" in /proc/devices. The parsers are pure; `read_driver_nodes`
is the only I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

MIG_MINORS_FILE = "driver/nvidia-caps/mig-minors"
DEVICES_FILE = "devices"
CAPS_DEVICE_NAME = "nvidia-caps"
UVM_DEVICE_NAME = "nvidia-uvm"

# The driver's fixed layout: minors 1 and 2 are mig/config and mig/monitor, then per GPU 15 GPU
# instances, each with one access node followed by 8 compute instance access nodes.
_FIRST_GPU_MINOR = 3
_CIS_PER_GI = 8
_GIS_PER_GPU = 15
_MINORS_PER_GI = 1 + _CIS_PER_GI
_MINORS_PER_GPU = _GIS_PER_GPU * _MINORS_PER_GI


def gi_access_name(gpu_minor: int, gi_id: int) -> str:
    return f"gpu{gpu_minor}/gi{gi_id}/access"


def ci_access_name(gpu_minor: int, gi_id: int, ci_id: int) -> str:
    return f"gpu{gpu_minor}/gi{gi_id}/ci{ci_id}/access"


def driver_layout_minor(gpu_minor: int, gi_id: int, ci_id: int | None = None) -> int:
    """The minor the NVIDIA driver assigns to a GI (ci_id None) or CI access node.

    Used by the fake backend so that fake MIG devices carry the values a real node would show.
    """
    gi_minor = _FIRST_GPU_MINOR + gpu_minor * _MINORS_PER_GPU + gi_id * _MINORS_PER_GI
    return gi_minor if ci_id is None else gi_minor + 1 + ci_id


def parse_mig_minors(text: str) -> dict[str, int]:
    """`name minor` lines -> {name: minor}; malformed lines are ignored like the driver's readers do."""
    minors: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            minors[parts[0]] = int(parts[1])
    return minors


def parse_char_major(proc_devices: str, name: str) -> int | None:
    """The major registered for `name` in the "Character devices:" part of /proc/devices."""
    in_char_section = False
    for line in proc_devices.splitlines():
        stripped = line.strip()
        if stripped.endswith(":"):
            in_char_section = stripped == "Character devices:"
            continue
        parts = stripped.split()
        if in_char_section and len(parts) == 2 and parts[1] == name and parts[0].isdigit():
            return int(parts[0])
    return None


@dataclass(frozen=True)
class DriverNodes:
    """The node's dynamic majors and the mig-minors table (None / empty where the driver has none)."""

    caps_major: int | None = None
    uvm_major: int | None = None
    mig_minors: dict[str, int] = field(default_factory=dict)

    def gi_minor(self, gpu_minor: int, gi_id: int) -> int | None:
        return self.mig_minors.get(gi_access_name(gpu_minor, gi_id))

    def ci_minor(self, gpu_minor: int, gi_id: int, ci_id: int) -> int | None:
        return self.mig_minors.get(ci_access_name(gpu_minor, gi_id, ci_id))


def read_driver_nodes(proc_root: Path) -> DriverNodes:
    """Read /proc/devices and the mig-minors table under `proc_root`; missing files mean none."""
    try:
        minors = parse_mig_minors((proc_root / MIG_MINORS_FILE).read_text())
    except OSError:
        minors = {}
    try:
        devices = (proc_root / DEVICES_FILE).read_text()
    except OSError:
        devices = ""
    return DriverNodes(
        caps_major=parse_char_major(devices, CAPS_DEVICE_NAME),
        uvm_major=parse_char_major(devices, UVM_DEVICE_NAME),
        mig_minors=minors,
    )
