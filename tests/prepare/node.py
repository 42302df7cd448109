"""A node for in-process prepare tests: a fake GPU profile, its devices, and a GpuDriver over
real files (claims directory, CDI directory, checkpoint) in a temporary directory."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from dradriver.backend.fake.sharing import FakeSharing
from dradriver.backend.select import open_backend as open_library
from dradriver.devicemodel import build_devices
from dradriver.plugin.driver import ClaimRef
from dradriver.prepare.cdi import CdiDirectory
from dradriver.prepare.checkpoint import CheckpointData, CheckpointStore
from dradriver.prepare.claims import DirectoryClaimSource
from dradriver.prepare.devnodes import HostDeviceNodes
from dradriver.prepare.edits import common_edits
from dradriver.prepare.gpu_driver import GpuDriver
from dradriver.prepare.gpu_share_daemons import ShareDaemons
from dradriver.prepare.ledger import Ledger
from dradriver.prepare.metadata_files import MetadataFiles
from dradriver.prepare.mig import MigManager
from dradriver.prepare.preparer import NodeDevices
from tests.helpers import DRIVER


class CountingStore(CheckpointStore):
    """The checkpoint, counting its writes."""

    def __init__(self, state_dir: Path) -> None:
        super().__init__(state_dir)
        self.saves = 0

    def save(self, checkpoint: CheckpointData) -> None:
        self.saves += 1
        super().save(checkpoint)


@dataclass
class RecordedMigMetrics:
    created: int = 0
    destroyed: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)

    def mig_created(self) -> None:
        self.created += 1

    def mig_destroyed(self) -> None:
        self.destroyed += 1

    def mig_failed(self, operation: str, reason: str) -> None:
        self.failures.append((operation, reason))


@dataclass
class Node:
    root: Path
    profile: str
    boot_id: str = "boot-1"
    partitionable: bool = False
    device_metadata: bool = True

    def __post_init__(self) -> None:
        self.claims_dir = self.root / "claims"
        self.claims_dir.mkdir(exist_ok=True)
        self.cdi = CdiDirectory(self.root / "cdi", DRIVER)
        self.store = CheckpointStore(self.root / "state")
        self.sharing = FakeSharing(self.root / "state")
        self.library = open_library(self.profile)
        self.inventory = self.library.discover()
        self.devices = build_devices(self.inventory, driver_name=DRIVER, partitionable=self.partitionable)
        self.mig_metrics = RecordedMigMetrics()
        self.metadata = MetadataFiles(self.root / "device-metadata", DRIVER, enabled=self.device_metadata)

    def driver(
        self,
        *,
        claims: object = None,
        recover: bool = True,
        host_nodes: HostDeviceNodes | None = None,
        uvm_scanned: bool = True,
        shares: ShareDaemons | None = None,
    ) -> GpuDriver:
        """`uvm_scanned` False: the nvidia-uvm module was not loaded when the node was scanned."""
        node = NodeDevices.published(
            self.devices.devices,
            common_edits(self.inventory.nvidia_uvm_major if uvm_scanned else None, []),
            self.inventory.nvidia_caps_major,
        )
        driver = GpuDriver(
            driver_name=DRIVER,
            pool_name="node-1",
            ledger=Ledger(self.store, self.boot_id),
            node=lambda: node,
            claims=claims or DirectoryClaimSource(self.claims_dir),  # type: ignore[arg-type]
            cdi_dir=self.cdi,
            sharing=self.sharing,
            mig=MigManager(lambda: self.library.mig_control(self.root / "state"), self.mig_metrics),
            host_nodes=host_nodes,
            shares=shares or ShareDaemons(),
            metadata=self.metadata,
        )
        if recover:
            driver.recover()
        return driver

    def add(self, claim: dict[str, object]) -> ClaimRef:
        meta = claim["metadata"]
        assert isinstance(meta, dict)
        (self.claims_dir / f"{meta['namespace']}.{meta['name']}.yaml").write_text(yaml.safe_dump(claim))
        return ClaimRef(meta["namespace"], meta["name"], meta["uid"])

    def spec(self, ref: ClaimRef) -> dict[str, object]:
        data = self.cdi.read(ref.uid)
        assert data is not None
        return data
