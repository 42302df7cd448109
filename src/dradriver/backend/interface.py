"""What every GPU backend offers: discovery, health events, MIG control, sharing, shares,
telemetry, the host's device nodes and what kicks a rescan. Where fake and real GPUs differ, the
backend decides; nothing else asks which one it has."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from dradriver.discovery.model import NodeInventory

if TYPE_CHECKING:  # annotations only; the parts' modules are loaded by the backends that make them
    from dradriver.devicemodel.shares import SharePolicy
    from dradriver.health.events import HealthSource, SourceOptions
    from dradriver.health.targets import HealthTargets
    from dradriver.mig import MigControl
    from dradriver.prepare.devnodes import HostDeviceNodes
    from dradriver.prepare.gpu_share_daemons import ShareDaemons
    from dradriver.prepare.sharing_settings import SharingControl
    from dradriver.telemetry.sampler import TelemetryReader


class Startable(Protocol):
    def start(self) -> None: ...

    def stop(self) -> None: ...


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

    def share_daemons(self, policy: SharePolicy | None, state_dir: Path, driver_root: Path) -> ShareDaemons:
        """The per-GPU MPS daemons that hold GPU shares (--gpu-shares) to their limits."""
        ...

    def host_nodes(self, host_dev: Path, proc_root: Path) -> HostDeviceNodes | None:
        """The host's /dev, where the device nodes a spec names must exist (None: no host's)."""
        ...

    def rescan_trigger(self, kick: Callable[[], None]) -> Startable | None:
        """What calls `kick` when the GPUs change outside NVML's events (None: nothing)."""
        ...

    def telemetry(self, state_dir: Path) -> TelemetryReader:
        """Read utilisation, memory, power and the like of these devices."""
        ...

    def close(self) -> None: ...
