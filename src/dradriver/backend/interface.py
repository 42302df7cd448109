"""What every GPU backend offers: discovery, health events, MIG control, sharing and telemetry."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from dradriver.discovery.model import NodeInventory

if TYPE_CHECKING:  # annotations only; the parts' modules are loaded by the backends that make them
    from dradriver.health.events import HealthSource, SourceOptions
    from dradriver.health.targets import HealthTargets
    from dradriver.mig import MigControl
    from dradriver.prepare.sharing_settings import SharingControl
    from dradriver.telemetry.sampler import TelemetryReader


class GpuBackend(Protocol):
    """A node's GPUs. `close()` releases what discovery holds (NVML shutdown); every part the
    other methods make holds what it needs itself (its own NVML reference), so it may be made
    after `close()` and outlives it."""

    def discover(self) -> NodeInventory: ...

    def health_source(self, targets: HealthTargets, options: SourceOptions) -> HealthSource:
        """Watch the health of the GPUs under `targets`."""
        ...

    def mig_control(self, state_dir: Path) -> MigControl:
        """Create and destroy MIG devices on these GPUs (--partitionable)."""
        ...

    def sharing(self, state_dir: Path, driver_root: Path) -> SharingControl:
        """Time-slicing and MPS for shared claims; `driver_root` is where the host driver's
        files (nvidia-smi, the MPS control daemon) are seen."""
        ...

    def telemetry(self, state_dir: Path) -> TelemetryReader:
        """Read utilisation, memory, power and the like of these devices."""
        ...

    def close(self) -> None: ...
