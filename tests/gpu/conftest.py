"""A real NVIDIA GPU and its host driver, found through NVML. Every test here skips without one
(CI has none); on a GPU node: `make test PYTEST_ARGS=tests/gpu` (DRADRIVER_GPU_DRIVER_ROOT names
the host driver's root when it is not one of ROOTS)."""

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
#: A driver on the host, the GPU operator's driver container, the /usr/local/nvidia layout (GKE).
ROOTS = ("/", "/run/nvidia/driver", "/usr/local/nvidia", "/home/kubernetes/bin/nvidia")


@dataclass(frozen=True)
class HostDriver:
    root: Path
    inventory: NodeInventory

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
    try:
        library = open_backend(None, driver_root=root)
        try:
            inventory = library.discover()
        finally:
            library.close()
    except DiscoveryError as err:
        pytest.skip(f"needs a real NVIDIA GPU: NVML under {root} answers {err}")
    if not inventory.gpus:
        pytest.skip(f"needs a real NVIDIA GPU: NVML under {root} lists none")
    return HostDriver(root, inventory)
