"""A fake NVIDIA host driver laid out on the node, for the GPU DaemonSets (`base`, `gpu-operator`).

Under the driver root it puts what a real installation has where the distribution puts it: the
C fake `libnvidia-ml.so.1` (tests/fakenvml) with its config beside it, so that serve's real NVML
path loads it from the driver root inside the pod; `libcuda.so.<version>` and its SONAME link,
which the CDI specs mount into containers; and a stand-in `nvidia-smi` that records its argument
lists in /tmp (the plugin pod's own emptyDir). The device nodes of the profile's GPUs go to the
host's /dev. Only what did not exist is created, and exactly that is removed again.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from dradriver.discovery import NVIDIA_CHAR_MAJOR, NodeInventory, open_library
from tests.fakenvml.harness import build_library, config_text

LIB_DIR = "usr/lib/x86_64-linux-gnu"
#: Where the stand-in nvidia-smi writes, inside the plugin container.
NVIDIA_SMI_LOG = "/tmp/nvidia-smi.calls"
NVIDIACTL_MINOR = 255


@dataclass
class FakeHostDriver:
    root: Path
    inventory: NodeInventory
    created: list[Path] = field(default_factory=list)

    @property
    def version(self) -> str:
        return self.inventory.driver_version


def _create(created: list[Path], path: Path) -> None:
    if path.exists() or path.is_symlink():
        raise FileExistsError(f"{path} exists: refusing to lay a fake driver over a real one")
    created.append(path)


@contextlib.contextmanager
def fake_host_driver(root: Path, profile: str, build_dir: Path) -> Iterator[FakeHostDriver]:
    inventory = open_library(profile).discover()
    driver = FakeHostDriver(root, inventory)
    made_dirs: list[Path] = []
    try:
        for directory in (root / LIB_DIR, root / "usr/bin"):
            missing = [p for p in [directory, *directory.parents] if not p.exists()]
            for path in reversed(missing):
                path.mkdir()
                made_dirs.append(path)
        library = build_library(build_dir)
        lib_dir = root / LIB_DIR
        nvml = lib_dir / f"libnvidia-ml.so.{driver.version}"
        _create(driver.created, nvml)
        shutil.copy(library, nvml)
        _create(driver.created, lib_dir / "libnvidia-ml.so.1")
        (lib_dir / "libnvidia-ml.so.1").symlink_to(nvml.name)
        _create(driver.created, lib_dir / "fake-nvml.conf")
        (lib_dir / "fake-nvml.conf").write_text(config_text(inventory))
        cuda = lib_dir / f"libcuda.so.{driver.version}"
        _create(driver.created, cuda)
        shutil.copy(library, cuda)  # any ELF file: containers only need to see it mounted
        _create(driver.created, lib_dir / "libcuda.so.1")
        (lib_dir / "libcuda.so.1").symlink_to(cuda.name)
        smi = root / "usr/bin/nvidia-smi"
        _create(driver.created, smi)
        smi.write_text(f'#!/bin/sh\necho "$@" >> {NVIDIA_SMI_LOG}\n')
        smi.chmod(0o755)
        nodes = [(f"/dev/nvidia{g.minor}", g.minor) for g in inventory.gpus]
        for node, minor in [*nodes, ("/dev/nvidiactl", NVIDIACTL_MINOR)]:
            device = Path(node)
            if device.exists():
                continue
            os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_CHAR_MAJOR, minor))
            driver.created.append(device)
        yield driver
    finally:
        for path in reversed(driver.created):
            path.unlink(missing_ok=True)
        for directory in reversed(made_dirs):
            with contextlib.suppress(OSError):
                directory.rmdir()
