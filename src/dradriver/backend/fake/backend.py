"""The fake backend: a profile's GPUs, with health events, MIG devices, sharing and telemetry
kept in the state directory (so `dradriver fake-event` and restarts see them)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from dradriver import logs
from dradriver.backend.fake.discovery import inventory_from_profile
from dradriver.backend.fake.health import FakeHealthSource
from dradriver.backend.fake.mig import STATE_FILE, FakeMigControl
from dradriver.backend.fake.profile import FakeProfile
from dradriver.backend.fake.profile_watch import ProfileFileTrigger
from dradriver.backend.fake.sharing import FakeSharing
from dradriver.backend.fake.telemetry import FakeTelemetry
from dradriver.devicemodel.shares import SharePolicy
from dradriver.discovery.model import NodeInventory
from dradriver.health.events import SourceOptions
from dradriver.health.targets import HealthTargets
from dradriver.prepare.gpu_share_daemons import SHARES_DIRECTORY, ShareDaemons
from dradriver.prepare.sharing_settings import MPS_STANDIN, MpsDaemons


class FakeBackend:
    """A `GpuBackend` serving a profile's GPUs.

    The inventory is plain instance state (never module globals). Health events come from the
    log `dradriver fake-event` writes into the state directory.
    """

    def __init__(self, profile: FakeProfile, name: str, profile_file: Path | None = None) -> None:
        self.name = name
        self._inventory = inventory_from_profile(profile, seed=name)
        #: The profile's file, followed for changes (None: a built-in profile).
        self._profile_file = profile_file

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

    def share_daemons(self, policy: SharePolicy | None, state_dir: Path, driver_root: Path) -> ShareDaemons:
        """The stand-in MPS daemon per shared GPU, told each client's limits."""
        return ShareDaemons(policy, MpsDaemons(MPS_STANDIN, state_dir / SHARES_DIRECTORY), register=True)

    def host_nodes(self, host_dev: Path, proc_root: Path) -> None:
        """Fake GPUs have no device nodes on any host."""

    def rescan_trigger(self, kick: Callable[[], None]) -> ProfileFileTrigger | None:
        """A profile file's changes (a built-in profile never changes)."""
        return None if self._profile_file is None else ProfileFileTrigger(self._profile_file, kick)

    def telemetry(self, state_dir: Path) -> FakeTelemetry:
        """Idle figures, and what `dradriver fake-event` set, from the state directory."""
        return FakeTelemetry(state_dir)

    def close(self) -> None:
        """Nothing to release; present for the `GpuBackend` interface."""
