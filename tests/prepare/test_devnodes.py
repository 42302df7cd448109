"""Every device node a claim's spec names exists on the host when the spec is written: made as the
host driver defines it (majors from /proc/devices), or the claim fails with one line. Real nodes
(mknod, as root) in a temporary /dev; the prepare path is GpuDriver's own."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from dradriver.discovery import MigDevice
from dradriver.prepare.devnodes import HostDeviceNodes
from tests.helpers import allocated_claim, uid
from tests.prepare.node import Node

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="making device nodes (mknod) needs root")

UVM_MAJOR = 509
CAPS_MAJOR = 237


def proc_devices(proc: Path, *, uvm: bool = True) -> Path:
    proc.mkdir(parents=True, exist_ok=True)
    lines = ["Character devices:", "  1 mem", "195 nvidia-frontend", f"{CAPS_MAJOR} nvidia-caps"]
    lines += [f"{UVM_MAJOR} nvidia-uvm"] if uvm else []
    (proc / "devices").write_text("\n".join([*lines, "", "Block devices:", "  8 sd", ""]))
    return proc


def node_of(path: Path) -> tuple[str, int, int, int]:
    info = path.lstat()
    kind = "c" if stat.S_ISCHR(info.st_mode) else "other"
    return kind, os.major(info.st_rdev), os.minor(info.st_rdev), stat.S_IMODE(info.st_mode)


def all_nodes(spec: dict[str, Any]) -> list[dict[str, Any]]:
    edits = [spec["containerEdits"], *(d["containerEdits"] for d in spec["devices"])]
    return [n for e in edits for n in e.get("deviceNodes", [])]


def test_nodes_missing_on_a_fresh_node_are_made_as_the_host_driver_defines_them(tmp_path: Path) -> None:
    """UVM not loaded when the node was scanned, loaded by the time the claim comes: the spec
    gets the UVM nodes with the major /proc/devices has now, and the host gets every node."""
    node = Node(tmp_path, "dgx-h100")
    dev = tmp_path / "dev"
    driver = node.driver(host_nodes=HostDeviceNodes(dev, proc_devices(tmp_path / "proc")), uvm_scanned=False)
    ref = node.add(allocated_claim("one", uid(1), [{"request": "gpu", "device": "gpu-3"}]))
    assert driver.prepare([ref])[ref.uid].error == ""
    spec: Any = node.spec(ref)
    paths = {n["path"]: (n["major"], n["minor"]) for n in all_nodes(spec)}
    assert paths == {
        "/dev/nvidiactl": (195, 255),
        "/dev/nvidia-uvm": (UVM_MAJOR, 0),
        "/dev/nvidia-uvm-tools": (UVM_MAJOR, 1),
        "/dev/nvidia3": (195, 3),
    }
    for path, (major, minor) in paths.items():
        assert node_of(dev / path.removeprefix("/dev/")) == ("c", major, minor, 0o666)
    driver.close()


def test_mig_caps_nodes_are_made_with_their_mode(tmp_path: Path) -> None:
    node = Node(tmp_path, "dgx-a100-mig")
    dev = tmp_path / "dev"
    driver = node.driver(host_nodes=HostDeviceNodes(dev, proc_devices(tmp_path / "proc")))
    mig = next(d for d in node.devices.devices if isinstance(d.hardware, MigDevice))
    assert isinstance(mig.hardware, MigDevice)
    ref = node.add(allocated_claim("mig", uid(2), [{"request": "mig", "device": mig.name}]))
    assert driver.prepare([ref])[ref.uid].error == ""
    caps = node.inventory.nvidia_caps_major
    for minor in (mig.hardware.gi_caps_minor, mig.hardware.ci_caps_minor):
        assert minor is not None
        assert node_of(dev / f"nvidia-caps/nvidia-cap{minor}") == ("c", caps, minor, 0o444)
    assert stat.S_IMODE((dev / "nvidia-caps").stat().st_mode) == 0o755
    driver.close()


def test_nodes_that_exist_are_left_as_they_are(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    os.mknod(dev / "nvidia3", 0o660 | stat.S_IFCHR, os.makedev(195, 3))
    before = (dev / "nvidia3").stat()
    node = Node(tmp_path, "dgx-h100")
    driver = node.driver(host_nodes=HostDeviceNodes(dev, proc_devices(tmp_path / "proc")))
    ref = node.add(allocated_claim("one", uid(3), [{"request": "gpu", "device": "gpu-3"}]))
    assert driver.prepare([ref])[ref.uid].error == ""
    after = (dev / "nvidia3").stat()
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)
    driver.close()


def test_without_the_uvm_module_the_claim_fails_with_one_line_and_no_spec(tmp_path: Path) -> None:
    node = Node(tmp_path, "dgx-h100")
    proc = proc_devices(tmp_path / "proc", uvm=False)
    driver = node.driver(host_nodes=HostDeviceNodes(tmp_path / "dev", proc), uvm_scanned=False)
    ref = node.add(allocated_claim("one", uid(4), [{"request": "gpu", "device": "gpu-3"}]))
    error = driver.prepare([ref])[ref.uid].error
    assert error == (
        f"claim default/one: the host driver's nvidia-uvm module is not loaded (nvidia-uvm is not in "
        f"{proc}/devices), so CUDA could not run in the container: load it on the node "
        "(nvidia-modprobe -u -c=0) and the kubelet's next try prepares the claim"
    )
    assert node.cdi.claim_uids() == []
    assert driver.records() == []
    # Loaded now: the kubelet's retry prepares it.
    proc_devices(proc)
    assert driver.prepare([ref])[ref.uid].error == ""
    driver.close()


def test_a_node_that_is_another_device_fails_the_claim(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    os.mknod(dev / "nvidia-uvm", 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers
    node = Node(tmp_path, "dgx-h100")
    driver = node.driver(host_nodes=HostDeviceNodes(dev, proc_devices(tmp_path / "proc")), uvm_scanned=False)
    ref = node.add(allocated_claim("one", uid(5), [{"request": "gpu", "device": "gpu-3"}]))
    error = driver.prepare([ref])[ref.uid].error
    assert error == (
        f"claim default/one: device node /dev/nvidia-uvm on the host is character device 1:3, but the "
        f"host driver defines it as {UVM_MAJOR}:0: remove it (nvidia-modprobe makes it again)"
    )
    assert node.cdi.claim_uids() == []
    driver.close()
