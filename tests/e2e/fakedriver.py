"""A fake NVIDIA host driver laid out on the node, for the GPU DaemonSets (`base`, `gpu-operator`).

Under the driver root it puts what a real installation has where the distribution puts it: the
C fake `libnvidia-ml.so.1` (tests/fakenvml) with its config beside it, so that serve's real NVML
path loads it from the driver root inside the pod; the C fake `libcuda.so.<version>` serving the
profile's GPUs, and its SONAME link, which the CDI specs mount into containers; and the stand-in
`nvidia-smi` (an ELF binary: `-L` lists what libcuda sees, other calls are recorded in /tmp, the
plugin pod's own emptyDir). The host driver's /proc files (the nvidia-uvm and nvidia-caps majors,
the mig-minors table) go to a directory under the driver root, which the plugin reads through
`serve_env`, as no kernel module registers them here. The device nodes of the profile's GPUs go
to the host's /dev; the UVM nodes are left to the plugin to make, as on a freshly booted node.
Only what did not exist is created, and exactly that is removed again (the UVM nodes too).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from dradriver.backend.select import open_backend
from dradriver.discovery import NVIDIA_CHAR_MAJOR, NodeInventory
from tests.fakenvml import cuda
from tests.fakenvml.harness import build_library, config_text, write_proc

LIB_DIR = "usr/lib/x86_64-linux-gnu"
#: The host driver's /proc files, under the driver root.
PROC_DIR = "var/lib/dradriver-e2e/proc"
#: Where the stand-in nvidia-smi writes, inside the plugin container.
NVIDIA_SMI_LOG = "/tmp/nvidia-smi.calls"
NVIDIACTL_MINOR = 255
#: The nodes a spec names that the plugin makes on the host when missing.
UVM_NODES = (Path("/dev/nvidia-uvm"), Path("/dev/nvidia-uvm-tools"))


@dataclass
class FakeHostDriver:
    root: Path
    inventory: NodeInventory
    created: list[Path] = field(default_factory=list)

    @property
    def version(self) -> str:
        return self.inventory.driver_version

    @property
    def serve_env(self) -> dict[str, str]:
        """The plugin's settings for this driver: its /proc files, under the mounted driver root."""
        return {"DRADRIVER_PROC_ROOT": f"/driver-root/{PROC_DIR}"}


def _create(created: list[Path], path: Path) -> None:
    if path.exists() or path.is_symlink():
        raise FileExistsError(f"{path} exists: refusing to lay a fake driver over a real one")
    created.append(path)


def _make_dirs(made_dirs: list[Path], *directories: Path) -> None:
    for directory in directories:
        missing = [p for p in [directory, *directory.parents] if not p.exists()]
        for path in reversed(missing):
            path.mkdir()
            made_dirs.append(path)


@contextlib.contextmanager
def fake_host_driver(root: Path, profile: str, build_dir: Path) -> Iterator[FakeHostDriver]:
    inventory = open_backend(profile).discover()
    driver = FakeHostDriver(root, inventory)
    made_dirs: list[Path] = []
    uvm_made_here = [node for node in UVM_NODES if not node.exists()]
    try:
        proc = root / PROC_DIR
        _make_dirs(made_dirs, root / LIB_DIR, root / "usr/bin", proc)
        write_proc(inventory, proc)
        driver.created += [proc / "devices", proc / "driver/nvidia-caps/mig-minors"]
        made_dirs += [proc / "driver", proc / "driver/nvidia-caps"]
        library = build_library(build_dir)
        fakes = cuda.build(build_dir / "cuda")
        lib_dir = root / LIB_DIR
        nvml = lib_dir / f"libnvidia-ml.so.{driver.version}"
        _create(driver.created, nvml)
        shutil.copy(library, nvml)
        _create(driver.created, lib_dir / "libnvidia-ml.so.1")
        (lib_dir / "libnvidia-ml.so.1").symlink_to(nvml.name)
        _create(driver.created, lib_dir / "fake-nvml.conf")
        (lib_dir / "fake-nvml.conf").write_text(config_text(inventory))
        libcuda = lib_dir / f"libcuda.so.{driver.version}"
        _create(driver.created, libcuda)
        cuda.with_table(fakes.libcuda, inventory, libcuda)
        _create(driver.created, lib_dir / "libcuda.so.1")
        (lib_dir / "libcuda.so.1").symlink_to(libcuda.name)
        smi = root / "usr/bin/nvidia-smi"
        _create(driver.created, smi)
        shutil.copy(fakes.nvidia_smi, smi)
        nodes = [(f"/dev/nvidia{g.minor}", g.minor) for g in inventory.gpus]
        for node, minor in [*nodes, ("/dev/nvidiactl", NVIDIACTL_MINOR)]:
            device = Path(node)
            if device.exists():
                continue
            os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_CHAR_MAJOR, minor))
            driver.created.append(device)
        yield driver
    finally:
        for path in reversed([*driver.created, *uvm_made_here]):
            path.unlink(missing_ok=True)
        for directory in reversed(made_dirs):
            with contextlib.suppress(OSError):
                directory.rmdir()
