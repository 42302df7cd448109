"""The host's NVIDIA device nodes: each one a spec names exists on the host before the spec is written.

The spec's nodes are minimally specified (type, major, minor), so a runtime that creates device
nodes makes them in the container whatever the host has. But a runtime that cannot (a pod in a
user namespace: runc bind-mounts the host's node at the same path instead) needs the host's node,
and on a freshly booted node the host driver has not made them all yet: /dev/nvidia-uvm and
/dev/nvidia-uvm-tools appear when something first loads CUDA on the host, /dev/nvidia-caps/* when
nvidia-modprobe runs for them (NVIDIA's DRA driver wrote specs without them, its issue 1380). So a
missing node is created as the host driver defines it (its major from /proc/devices, the minor
the driver's layout gives it), as nvidia-modprobe would; a node that exists as another device, or
a UVM node while the nvidia-uvm module is not loaded, fails the claim with one line instead of
writing a spec that cannot work.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from dradriver.discovery.nvidia_caps import DEVICES_FILE, UVM_DEVICE_NAME, parse_char_major
from dradriver.prepare.cdi import ContainerEdits, DeviceNode
from dradriver.prepare.edits import EditsError, uvm_nodes

#: As the host driver (nvidia-modprobe) makes them: every user may open them; the device cgroup
#: decides which container may.
NODE_MODE = 0o666
CAPS_DIR_MODE = 0o755
UVM_NODE = "/dev/nvidia-uvm"


class HostDeviceNodes:
    """Makes the device nodes of a claim's spec exist on the host.

    `dev_root` is where this process sees the host's /dev (the DaemonSet mounts it), `proc_root`
    where it reads the host driver's /proc files."""

    def __init__(self, dev_root: Path, proc_root: Path) -> None:
        self._dev_root = dev_root
        self._proc_root = proc_root

    def complete(self, common: ContainerEdits, devices: Iterable[ContainerEdits]) -> ContainerEdits:
        """`common` with the UVM nodes the CUDA runtime opens (read from /proc/devices now if the
        module was not loaded when the node was scanned), once every node of the spec exists on
        the host; EditsError (one line) otherwise."""
        if not any(node.path == UVM_NODE for node in common.device_nodes):
            common = common + ContainerEdits(device_nodes=uvm_nodes(self._uvm_major()))
        for node in [*common.device_nodes, *(n for edits in devices for n in edits.device_nodes)]:
            self._ensure(node)
        return common

    def _uvm_major(self) -> int:
        try:
            devices = (self._proc_root / DEVICES_FILE).read_text()
        except OSError:
            devices = ""
        major = parse_char_major(devices, UVM_DEVICE_NAME)
        if major is None:
            raise EditsError(
                f"the host driver's {UVM_DEVICE_NAME} module is not loaded ({UVM_DEVICE_NAME} is not in "
                f"{self._proc_root / DEVICES_FILE}), so CUDA could not run in the container: load it on "
                "the node (nvidia-modprobe -u -c=0) and the kubelet's next try prepares the claim"
            )
        return major

    def _ensure(self, node: DeviceNode) -> None:
        if node.type != "c" or node.major is None or node.minor is None:
            return  # a node the runtime takes from the host as it is
        wanted = os.makedev(node.major, node.minor)
        host = self._dev_root / PurePosixPath(node.path).relative_to("/dev")
        try:
            found = host.lstat()
        except FileNotFoundError:
            self._create(node, host, wanted)
            return
        except OSError as err:
            raise EditsError(f"device node {node.path}: cannot look at it on the host: {err}") from None
        if not stat.S_ISCHR(found.st_mode) or found.st_rdev != wanted:
            what = (
                f"character device {os.major(found.st_rdev)}:{os.minor(found.st_rdev)}"
                if stat.S_ISCHR(found.st_mode)
                else "not a character device"
            )
            raise EditsError(
                f"device node {node.path} on the host is {what}, but the host driver defines it as "
                f"{node.major}:{node.minor}: remove it (nvidia-modprobe makes it again)"
            )

    @staticmethod
    def _create(node: DeviceNode, host: Path, device: int) -> None:
        try:
            if not host.parent.is_dir():
                host.parent.mkdir(mode=CAPS_DIR_MODE, parents=True, exist_ok=True)
            os.mknod(host, (node.file_mode or NODE_MODE) | stat.S_IFCHR, device)
            os.chmod(host, node.file_mode or NODE_MODE)  # the umask does not apply to what the driver makes
        except FileExistsError:
            return  # another prepare made it a moment ago
        except OSError as err:
            raise EditsError(
                f"device node {node.path} is missing on the host and cannot be created: {err}"
            ) from None
