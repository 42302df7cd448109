"""The fake backend: a profile's GPUs, with health events, MIG devices, sharing and telemetry
kept in the state directory (so `dradriver fake-event` and restarts see them)."""

from __future__ import annotations

from pathlib import Path

from dradriver import logs
from dradriver.backend.fake.discovery import inventory_from_profile
from dradriver.backend.fake.health import FakeHealthSource
from dradriver.backend.fake.mig import STATE_FILE, FakeMigControl
from dradriver.backend.fake.profile import FakeProfile
from dradriver.backend.fake.sharing import FakeSharing
from dradriver.backend.fake.telemetry import FakeTelemetry
from dradriver.discovery.model import NodeInventory
from dradriver.health.events import SourceOptions
from dradriver.health.targets import HealthTargets


class FakeBackend:
    """A `GpuBackend` serving a profile's GPUs.

    The inventory is plain instance state (never module globals). Health events come from the
    log `dradriver fake-event` writes into the state directory.
    """

    def __init__(self, profile: FakeProfile, name: str) -> None:
        self.name = name
        self._inventory = inventory_from_profile(profile, seed=name)

    def discover(self) -> NodeInventory:
        return self._inventory

    def health_source(self, targets: HealthTargets, options: SourceOptions) -> FakeHealthSource:
        if options.thresholds.enabled:
            logs.get_logger(component="health").warning(
                "fake GPUs have no sensors: thresholds are not checked"
            )
        return FakeHealthSource(options.state_dir, targets.locate)

    def mig_control(self, state_dir: Path) -> FakeMigControl:
        """MIG devices of these fake GPUs, kept in the state directory across restarts."""
        return FakeMigControl(self._inventory, state_dir / STATE_FILE)

    def sharing(self, state_dir: Path, driver_root: Path) -> FakeSharing:
        """Time slices in memory, MPS through the stand-in control daemon (no host driver)."""
        return FakeSharing(state_dir)

    def telemetry(self, state_dir: Path) -> FakeTelemetry:
        """Idle figures, and what `dradriver fake-event` set, from the state directory."""
        return FakeTelemetry(state_dir)

    def close(self) -> None:
        """Nothing to release; present for the `GpuBackend` interface."""
