"""The container edits that expose GPUs and MIG devices: pure, from discovery's hardware facts.

Every device node is minimally specified (type, major, minor), so the runtime creates it in the
container without looking at the host: the same spec works on a GPU node and, with the fake
backend's majors and minors, on a machine without NVIDIA hardware or driver.

`CUDA_VISIBLE_DEVICES` is deliberately not set: CDI replaces an env var that several devices or
claims set, so the last one would win and hide the others. The device nodes decide what CUDA
sees; each injected device's UUID is in `DRADRIVER_DEVICE_<NAME>` for tools and logs.
"""

from __future__ import annotations

from collections.abc import Sequence

from dradriver.discovery import NVIDIA_CHAR_MAJOR, Gpu, MigDevice
from dradriver.prepare.cdi import ContainerEdits, DeviceNode, Mount
from dradriver.prepare.hostdriver import driver_env

#: /dev/nvidiactl is 195:255 on every driver.
NVIDIACTL_MINOR = 255
#: Read-only access nodes, as the driver creates them for MIG capabilities.
CAPS_FILE_MODE = 0o444


class EditsError(Exception):
    pass


def device_env_name(device_name: str) -> str:
    return "DRADRIVER_DEVICE_" + device_name.upper().replace("-", "_")


def gpu_node(minor: int) -> DeviceNode:
    return DeviceNode(path=f"/dev/nvidia{minor}", type="c", major=NVIDIA_CHAR_MAJOR, minor=minor)


def check_mig_access(name: str, caps_major: int | None, *minors: int | None) -> None:
    """A MIG device is usable in a container only with its nvidia-caps access nodes; checked
    before a MIG device is created for a claim, too."""
    if caps_major is None or None in minors:
        raise EditsError(
            f"MIG device {name}: the driver did not list its nvidia-caps access nodes "
            "(/proc/devices, /proc/driver/nvidia-caps/mig-minors), so a container could not use it"
        )


def device_edits(name: str, hardware: Gpu | MigDevice, caps_major: int | None) -> ContainerEdits:
    env = (f"{device_env_name(name)}={hardware.uuid}",)
    if isinstance(hardware, Gpu):
        return ContainerEdits(env=env, device_nodes=(gpu_node(hardware.minor),))
    check_mig_access(name, caps_major, hardware.gi_caps_minor, hardware.ci_caps_minor)
    assert caps_major is not None
    caps = tuple(
        DeviceNode(
            path=f"/dev/nvidia-caps/nvidia-cap{minor}",
            type="c",
            major=caps_major,
            minor=minor,
            file_mode=CAPS_FILE_MODE,
        )
        for minor in (hardware.gi_caps_minor, hardware.ci_caps_minor)
    )
    return ContainerEdits(env=env, device_nodes=(gpu_node(hardware.parent_minor), *caps))


def uvm_nodes(uvm_major: int) -> tuple[DeviceNode, ...]:
    """/dev/nvidia-uvm and /dev/nvidia-uvm-tools, which the CUDA runtime opens."""
    return (
        DeviceNode(path="/dev/nvidia-uvm", type="c", major=uvm_major, minor=0),
        DeviceNode(path="/dev/nvidia-uvm-tools", type="c", major=uvm_major, minor=1),
    )


def control_nodes(uvm_major: int | None) -> tuple[DeviceNode, ...]:
    """/dev/nvidiactl always; the UVM nodes when their major is known (on a real node the
    prepare step adds them later, see `prepare.devnodes`)."""
    nvidiactl = DeviceNode(path="/dev/nvidiactl", type="c", major=NVIDIA_CHAR_MAJOR, minor=NVIDIACTL_MINOR)
    return (nvidiactl, *(uvm_nodes(uvm_major) if uvm_major is not None else ()))


def common_edits(uvm_major: int | None, driver_mounts: Sequence[Mount]) -> ContainerEdits:
    """Applied once per claim spec: control nodes, the driver's user-space files and the
    environment they need, and NVIDIA_VISIBLE_DEVICES=void so a legacy nvidia-container-runtime
    hook does nothing."""
    return ContainerEdits(
        env=("NVIDIA_VISIBLE_DEVICES=void", *driver_env(driver_mounts)),
        device_nodes=control_nodes(uvm_major),
        mounts=tuple(driver_mounts),
    )
