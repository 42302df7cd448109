"""The NVML backend: discovery, health events, MIG control, sharing and telemetry over NVML."""

from __future__ import annotations

from pathlib import Path

from dradriver.backend.nvml.discovery import NvmlLibrary
from dradriver.backend.nvml.health import NvmlHealthSource
from dradriver.backend.nvml.mig import NvmlMigControl
from dradriver.backend.nvml.telemetry import NvmlTelemetry
from dradriver.discovery.model import NodeInventory
from dradriver.health.events import SourceOptions
from dradriver.health.targets import HealthTargets
from dradriver.prepare.sharing import NvidiaSharing


class NvmlBackend:
    """A `GpuBackend` over NVML; NVML is initialised here and shut down by `close()`."""

    def __init__(
        self,
        *,
        library_path: str | None = None,
        proc_root: Path = Path("/proc"),
        sys_root: Path = Path("/sys"),
        searched_root: Path | None = None,
    ) -> None:
        self._library = NvmlLibrary(
            library_path=library_path, proc_root=proc_root, sys_root=sys_root, searched_root=searched_root
        )
        self._library_path = library_path
        self._proc_root = proc_root

    def discover(self) -> NodeInventory:
        return self._library.discover()

    def health_source(self, targets: HealthTargets, options: SourceOptions) -> NvmlHealthSource:
        """NVML events for the published GPUs; the source holds its own NVML reference."""
        return NvmlHealthSource(
            targets.gpu_uuids,
            thresholds=options.thresholds,
            metrics=options.metrics,
            inventory_changed=options.inventory_changed,
        )

    def mig_control(self, state_dir: Path) -> NvmlMigControl:
        """MIG reconfiguration through NVML, with an NVML reference of its own."""
        return NvmlMigControl(library_path=self._library_path, proc_root=self._proc_root)

    def sharing(self, state_dir: Path, driver_root: Path) -> NvidiaSharing:
        """nvidia-smi's compute modes and the MPS control daemon of the host driver."""
        return NvidiaSharing(driver_root, state_dir)

    def telemetry(self, state_dir: Path) -> NvmlTelemetry:
        """Utilisation, memory, power, clocks, ECC and NVLink through NVML, with its own reference."""
        return NvmlTelemetry()

    def close(self) -> None:
        self._library.close()
