"""Build the C fake libnvidia-ml.so.1 and describe a node to it, to /proc and to /sys.

The node descriptions are derived from a `NodeInventory` (normally a fake GPU profile's), so a
test can check that the real NVML code path discovers exactly what the fake backend reports.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dradriver.backend.nvml.discovery import ADDRESSING_MODES, ARCHITECTURE_NAMES, BRAND_NAMES
from dradriver.discovery import NodeInventory
from dradriver.discovery.nvidia_caps import (
    ci_access_name,
    driver_layout_minor,
    gi_access_name,
)

SONAME = "libnvidia-ml.so.1"
#: For loading by path inside the test process: a soname of its own, so that a later
#: dlopen("libnvidia-ml.so.1") in the same process does not find the fake already loaded.
IN_PROCESS_SONAME = "libdradriver-fake-nvml.so.1"
SOURCE = Path(__file__).with_name("fake_nvml.c")
CONFIG_ENV = "FAKE_NVML_CONFIG"
#: Names the FIFO the fake reads health-event commands from (see fake_nvml.c).
EVENTS_ENV = "FAKE_NVML_EVENTS"
#: Names a file whose existence means the host driver is unloaded (see fake_nvml.c).
UNLOADED_ENV = "FAKE_NVML_UNLOADED"

# NVML return codes the tests inject.
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

_BRANDS = {name: number for number, name in BRAND_NAMES.items()}
_ARCHITECTURES = {name: number for number, name in ARCHITECTURE_NAMES.items()}
_ADDRESSING_MODES = {name: number for number, name in ADDRESSING_MODES.items()}


@dataclass(frozen=True)
class Failure:
    """Make NVML `function` return `code` for the GPU at NVML index `gpu` (None: every call)."""

    function: str
    code: int
    gpu: int | None = None


def compiler() -> str | None:
    return shutil.which("cc")


def build_library(
    out_dir: Path, soname: str = SONAME, *, telemetry: bool = False, max_gpus: int | None = None
) -> Path:
    """Compile the fake with the system C compiler into `out_dir/<soname>`; returns its path.
    `telemetry`: with the telemetry calls (FAKE_NVML_TELEMETRY); `max_gpus`: room for more GPUs
    than the default 64."""
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler (cc) on PATH")
    out_dir.mkdir(parents=True, exist_ok=True)
    library = out_dir / soname
    defines = (["-DFAKE_NVML_TELEMETRY_CALLS"] if telemetry else []) + (
        [f"-DMAX_GPUS={max_gpus}"] if max_gpus else []
    )
    subprocess.run(
        [
            cc,
            "-shared",
            "-fPIC",
            "-O1",
            "-Wall",
            "-Werror",
            *defines,
            f"-Wl,-soname,{soname}",
            "-o",
            library,
            SOURCE,
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return library


def _cuda_number(version: str) -> int:
    major, minor = (int(part) for part in version.split("."))
    return major * 1000 + minor * 10


def config_text(
    inventory: NodeInventory, failures: Sequence[Failure] = (), *, numa_from_nvml: bool = True
) -> str:
    """The fake's config for `inventory`; GPUs at odd NVML indexes leave NUMA to sysfs."""
    lines = [f"driver\t{inventory.driver_version}", f"cuda\t{_cuda_number(inventory.cuda_driver_version)}"]
    for position, gpu in enumerate(inventory.gpus):
        numa = gpu.numa_node if gpu.numa_node is not None and numa_from_nvml and position % 2 == 0 else -1
        mig_mode = -1 if not gpu.mig_capable else int(gpu.mig_enabled)
        fields = [
            "gpu",
            gpu.minor,
            gpu.uuid,
            gpu.product_name,
            _BRANDS[gpu.brand],
            _ARCHITECTURES[gpu.architecture],
            *gpu.compute_capability,
            gpu.memory_bytes,
            f"0000{gpu.pci_bus_id.upper()}",
            numa,
            mig_mode,
            -1 if gpu.addressing_mode is None else _ADDRESSING_MODES[gpu.addressing_mode],
            gpu.module_id or 0,
        ]
        lines.append("\t".join(map(str, fields)))
        for index, profile in enumerate(gpu.mig_profiles):
            r = profile.resources
            starts = ",".join(str(p.start) for p in profile.placements)
            fields = [
                "profile",
                position,
                index,
                profile.profile_id,
                profile.slice_count,
                profile.instance_count,
                r.multiprocessors,
                r.copy_engines,
                r.decoders,
                r.encoders,
                r.jpeg_engines,
                r.ofa_engines,
                r.memory_mib,
                profile.name,
                profile.placements[0].size,
                starts,
            ]
            lines.append("\t".join(map(str, fields)))
        slices = {p.profile_id: p.slice_count for p in gpu.mig_profiles}
        for mig in gpu.mig_devices:
            r = mig.resources
            fields = [
                "mig",
                position,
                mig.uuid,
                mig.gi_id,
                mig.ci_id,
                mig.gi_profile_id,
                mig.placement.start,
                mig.placement.size,
                mig.compute_placement.start,
                mig.compute_placement.size,
                slices[mig.gi_profile_id],
                mig.compute_placement.size,
                r.multiprocessors,
                r.copy_engines,
                r.decoders,
                r.encoders,
                r.jpeg_engines,
                r.ofa_engines,
                r.memory_mib,
            ]
            lines.append("\t".join(map(str, fields)))
    for failure in failures:
        gpu_field = "*" if failure.gpu is None else str(failure.gpu)
        lines.append(f"fail\t{failure.function}\t{gpu_field}\t{failure.code}")
    return "\n".join(lines) + "\n"


def write_proc(inventory: NodeInventory, proc_root: Path) -> None:
    """/proc/devices with the nvidia-caps and nvidia-uvm majors, and the driver's full mig-minors table."""
    (proc_root / "driver" / "nvidia-caps").mkdir(parents=True, exist_ok=True)
    caps, uvm = inventory.nvidia_caps_major, inventory.nvidia_uvm_major
    (proc_root / "devices").write_text(
        f"Character devices:\n  1 mem\n195 nvidia\n{uvm} nvidia-uvm\n{caps} nvidia-caps\n"
        "\nBlock devices:\n  8 sd\n"
    )
    lines = ["config 1", "monitor 2"]
    for gpu in inventory.gpus:
        for gi in range(15):
            lines.append(f"{gi_access_name(gpu.minor, gi)} {driver_layout_minor(gpu.minor, gi)}")
            lines += [
                f"{ci_access_name(gpu.minor, gi, ci)} {driver_layout_minor(gpu.minor, gi, ci)}"
                for ci in range(8)
            ]
    (proc_root / "driver" / "nvidia-caps" / "mig-minors").write_text("\n".join(lines) + "\n")


def write_sys(inventory: NodeInventory, sys_root: Path) -> None:
    """/sys/bus/pci/devices/<bdf> links into /sys/devices/<root>/<bridge>/<bdf>, with numa_node."""
    links = sys_root / "bus" / "pci" / "devices"
    links.mkdir(parents=True, exist_ok=True)
    for gpu in inventory.gpus:
        root = gpu.pcie_root or "platform"
        device_dir = sys_root / "devices" / root / "0000:00:01.0" / gpu.pci_bus_id
        device_dir.mkdir(parents=True, exist_ok=True)
        (device_dir / "numa_node").write_text(f"{gpu.numa_node if gpu.numa_node is not None else -1}\n")
        (links / gpu.pci_bus_id).symlink_to(
            Path("../../..") / "devices" / root / "0000:00:01.0" / gpu.pci_bus_id
        )


class EventPipe:
    """The FIFO the fake NVML reads health-event commands from ("xid 3 79", "lost 3", ...).

    The test's end stays open (read-write, so opening never blocks) for the pipe's lifetime:
    commands written before the fake opens its end wait in the pipe instead of being lost.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        os.mkfifo(path)
        self._fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)

    def send(self, *commands: str) -> None:
        os.write(self._fd, "".join(f"{c}\n" for c in commands).encode())

    def close(self) -> None:
        os.close(self._fd)


@dataclass
class FakeDriver:
    """The fake NVML as a process under test loads it (`env`, and `serve_args`: its /proc files,
    the nvidia-uvm major among them, which prepare needs), and what drives it: its config, its
    events FIFO, and the file whose existence unloads the host driver."""

    config: Path
    events: EventPipe
    unloaded: Path
    env: dict[str, str]
    serve_args: tuple[str, ...]


def fake_driver(library: Path, directory: Path, inventory: NodeInventory) -> FakeDriver:
    """A fake host driver for `inventory`, its files in `directory`; close `events` when done."""
    config = directory / "nvml.conf"
    config.write_text(config_text(inventory))
    events = EventPipe(directory / "nvml-events")
    unloaded = directory / "driver-unloaded"
    write_proc(inventory, directory / "proc")
    env = {
        "LD_LIBRARY_PATH": str(library.parent),
        CONFIG_ENV: str(config),
        EVENTS_ENV: str(events.path),
        UNLOADED_ENV: str(unloaded),
    }
    return FakeDriver(config, events, unloaded, env, ("--proc-root", str(directory / "proc")))
