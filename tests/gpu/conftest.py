"""A real NVIDIA GPU and its host driver, found through NVML. Every test here skips without one
(CI has none); on a GPU node: `make test PYTEST_ARGS=tests/gpu` (DRADRIVER_GPU_DRIVER_ROOT names
the host driver's root when it is not one of ROOTS; DRADRIVER_GPU_DRIVER_ROOT_MOUNT, where the
plugin sees that root when it is elsewhere, as the GPU operator's /run/nvidia/driver is mounted
into the plugin's container)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from dradriver.backend.select import open_backend
from dradriver.discovery.driverroot import NVML_LIBRARY, find_binary, nvml_library
from dradriver.discovery.errors import DiscoveryError
from dradriver.discovery.model import NodeInventory

DRIVER_ROOT_ENV = "DRADRIVER_GPU_DRIVER_ROOT"
MOUNT_ENV = "DRADRIVER_GPU_DRIVER_ROOT_MOUNT"
#: A driver on the host, the GPU operator's driver container, the /usr/local/nvidia layout (GKE).
ROOTS = ("/", "/run/nvidia/driver", "/usr/local/nvidia", "/home/kubernetes/bin/nvidia")


@dataclass(frozen=True)
class HostDriver:
    root: Path
    #: Where the plugin reads `root` (the same path unless DRADRIVER_GPU_DRIVER_ROOT_MOUNT says).
    mount: Path
    inventory: NodeInventory

    def serve_args(self) -> list[str]:
        """The driver root flags of `serve` and `discover` for this layout."""
        args = ["--driver-root", str(self.root)]
        return args if self.mount == self.root else [*args, "--driver-root-mount", str(self.mount)]

    def tool(self, name: str) -> Path:
        found = find_binary(self.root, name)
        if found is None:
            pytest.skip(f"needs {name} from the host driver: not under {self.root}")
        return found


@pytest.fixture(scope="session")
def host_driver() -> HostDriver:
    roots = [os.environ[DRIVER_ROOT_ENV]] if os.environ.get(DRIVER_ROOT_ENV) else list(ROOTS)
    root = next((Path(r) for r in roots if nvml_library(Path(r)) is not None), None)
    if root is None:
        pytest.skip(
            f"needs a real NVIDIA GPU: no {NVML_LIBRARY} under {', '.join(roots)} (set {DRIVER_ROOT_ENV})"
        )
    mount = Path(os.environ.get(MOUNT_ENV) or root)
    try:
        library = open_backend(None, driver_root=mount)
        try:
            inventory = library.discover()
        finally:
            library.close()
    except DiscoveryError as err:
        pytest.skip(f"needs a real NVIDIA GPU: NVML under {mount} answers {err}")
    if not inventory.gpus:
        pytest.skip(f"needs a real NVIDIA GPU: NVML under {mount} lists none")
    return HostDriver(root, mount, inventory)
