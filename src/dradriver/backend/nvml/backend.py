"""The NVML backend: discovery, health events, MIG control, sharing and telemetry over NVML."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from dradriver.backend.nvml.discovery import NvmlLibrary
from dradriver.backend.nvml.health import NvmlHealthSource
from dradriver.backend.nvml.mig import NvmlMigControl
from dradriver.backend.nvml.sharing import NvidiaSharing
from dradriver.backend.nvml.telemetry import NvmlTelemetry
from dradriver.devicemodel.shares import SharePolicy
from dradriver.health.events import SourceOptions
from dradriver.health.targets import HealthTargets
from dradriver.prepare.devnodes import HostDeviceNodes
from dradriver.prepare.gpu_share_daemons import ShareDaemons, host_share_daemons


class NvmlBackend(NvmlLibrary):
    """A `GpuBackend` over NVML: the library's discovery (NVML initialised at construction and
    shut down by `close()`), and the parts it makes, each with an NVML reference of its own."""

    def health_source(self, targets: HealthTargets, options: SourceOptions) -> NvmlHealthSource:
        """NVML events for the published GPUs."""
        return NvmlHealthSource(
            targets.gpu_uuids,
            thresholds=options.thresholds,
            metrics=options.metrics,
            inventory_changed=options.inventory_changed,
        )

    def mig_control(self, state_dir: Path) -> NvmlMigControl:
        """MIG reconfiguration through NVML."""
        return NvmlMigControl(library_path=self.library_path, proc_root=self.proc_root)

    def sharing(self, state_dir: Path, driver_root: Path) -> NvidiaSharing:
        """nvidia-smi's compute modes and the MPS control daemon of the host driver."""
        return NvidiaSharing(driver_root, state_dir)

    def share_daemons(self, policy: SharePolicy | None, state_dir: Path, driver_root: Path) -> ShareDaemons:
        """The host driver's MPS control daemon per shared GPU."""
        return host_share_daemons(policy, driver_root=driver_root, state_dir=state_dir)

    def host_nodes(self, host_dev: Path, proc_root: Path) -> HostDeviceNodes:
        """The device nodes a spec names, made under the host's /dev when missing there."""
        return HostDeviceNodes(host_dev, proc_root)

    def rescan_trigger(self, kick: Callable[[], None]) -> None:
        """NVML's MIG events kick the rescan (through the health source)."""

    def telemetry(self, state_dir: Path) -> NvmlTelemetry:
        """Utilisation, memory, power, clocks, ECC and NVLink through NVML."""
        return NvmlTelemetry()
