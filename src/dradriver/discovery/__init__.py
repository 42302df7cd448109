"""GPU discovery: one small interface, two backends (NVML and fake GPUs).

`open_library(None)` talks to the NVIDIA driver through NVML; `open_library("dgx-h100")` or
`open_library("/path/profile.yaml")` serves a fake node. Both return a `DeviceLibrary` whose
`discover()` gives a `NodeInventory`; nothing above this package knows which one it has.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

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

if TYPE_CHECKING:
    from dradriver.health.events import HealthSource, SourceOptions
    from dradriver.health.targets import HealthTargets
    from dradriver.mig import MigControl
    from dradriver.telemetry.sampler import TelemetryReader

__all__ = [
    "NVIDIA_CHAR_MAJOR",
    "DeviceLibrary",
    "DiscoveryError",
    "Gpu",
    "MigDevice",
    "MigPlacement",
    "MigProfile",
    "MigResources",
    "NodeInventory",
    "SkippedDevice",
    "builtin_profile_names",
    "open_library",
]


class DeviceLibrary(Protocol):
    """A source of GPU inventory and of health events; `close()` releases it (NVML shutdown)."""

    def discover(self) -> NodeInventory: ...

    def health_source(self, targets: HealthTargets, options: SourceOptions) -> HealthSource:
        """Watch the health of the GPUs under `targets`.

        The source holds what it needs itself (its own NVML reference), so it may be created
        after `close()` and outlives it.
        """
        ...

    def mig_control(self, state_dir: Path) -> MigControl:
        """Create and destroy MIG devices on these GPUs (--partitionable); like `health_source`,
        the result holds what it needs itself and outlives `close()`."""
        ...

    def telemetry(self, state_dir: Path) -> TelemetryReader:
        """Read utilisation, memory, power and the like of these devices; like `health_source`,
        the reader holds what it needs itself and outlives `close()`."""
        ...

    def close(self) -> None: ...


def builtin_profile_names() -> list[str]:
    from dradriver.backend.fake.profiles import names

    return names()


def _looks_like_path(value: str) -> bool:
    return "/" in value or value.endswith((".yaml", ".yml", ".json"))


def open_library(
    fake_gpus: str | None,
    *,
    driver_root: Path | None = None,
    nvml_library: str | None = None,
    proc_root: Path = Path("/proc"),
    sys_root: Path = Path("/sys"),
) -> DeviceLibrary:
    """The fake backend for a profile name or file, else NVML.

    NVML is the host driver's libnvidia-ml.so.1 under `driver_root` (where this process sees the
    driver root: a container has no NVML of its own), else whatever the loader finds;
    `nvml_library` names the file outright. `proc_root`/`sys_root` let tests (and containers with
    host mounts) point at other trees. Raises DiscoveryError with a one-line reason when neither
    can be opened.
    """
    if fake_gpus is None:
        from dradriver.backend.nvml.discovery import NvmlLibrary
        from dradriver.discovery.driverroot import nvml_library as find_nvml

        if nvml_library is None and driver_root is not None:
            found = find_nvml(driver_root)
            nvml_library = str(found) if found is not None else None
        return NvmlLibrary(
            library_path=nvml_library, proc_root=proc_root, sys_root=sys_root, searched_root=driver_root
        )

    from dradriver.backend.fake.discovery import FakeLibrary
    from dradriver.backend.fake.profile import load_builtin_profile, load_profile_file

    if fake_gpus in builtin_profile_names():
        return FakeLibrary(load_builtin_profile(fake_gpus), name=fake_gpus)
    path = Path(fake_gpus)
    if path.is_file() or _looks_like_path(fake_gpus):
        return FakeLibrary(load_profile_file(path), name=path.stem)
    raise DiscoveryError(
        f"unknown fake GPU profile {fake_gpus!r}: not a built-in profile "
        f"({', '.join(builtin_profile_names())}) and no such file"
    )
