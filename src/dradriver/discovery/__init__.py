"""What discovery finds, whichever backend found it: the node's GPUs and MIG devices
(`model`), the host driver's files it reads (`driverroot`, `nvidia_caps`) and its one error.

The backends themselves live in `dradriver.backend` (NVML and fake GPUs).
"""

from __future__ import annotations

from dradriver.discovery.errors import DiscoveryError
from dradriver.discovery.model import (
    NVIDIA_CHAR_MAJOR,
    Gpu,
    MigDevice,
    MigPlacement,
    MigProfile,
    MigResources,
    NodeInventory,
    SkippedDevice,
)

__all__ = [
    "NVIDIA_CHAR_MAJOR",
    "DiscoveryError",
    "Gpu",
    "MigDevice",
    "MigPlacement",
    "MigProfile",
    "MigResources",
    "NodeInventory",
    "SkippedDevice",
]
