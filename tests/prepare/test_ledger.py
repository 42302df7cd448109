"""The ledger: who holds which device, when reservations reach the disk, a reservation whose
write fails, and a checkpoint another instance wrote."""

from __future__ import annotations

from pathlib import Path

import pytest

from dradriver.files.write import StorageError
from dradriver.plugin.driver import ClaimRef
from dradriver.prepare.checkpoint import (
    CheckpointData,
    CheckpointStore,
    ClaimRecord,
    ClaimState,
    DeviceRecord,
)
from dradriver.prepare.ledger import Ledger
from dradriver.prepare.plan import ClaimPlan, PlannedDevice
from tests.helpers import uid
from tests.prepare.node import CountingStore, Node


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path, "a100-mig-empty", partitionable=True)  # GPU 0 in MIG mode, GPU 1 not


def reservation(node: Node, n: int, *devices: str, sharing: str = "") -> tuple[ClaimPlan, ClaimRecord]:
    """Claim n's plan for these devices and its PrepareStarted record."""
    hardware = {d.name: d.hardware for d in node.devices.devices}
    ref = ClaimRef("default", f"claim-{n}", uid(n))
    planned = tuple(PlannedDevice(d, "node-1", hardware[d], ("gpu",), False, None, None) for d in devices)
    record = ClaimRecord(
        uid=ref.uid,
        namespace=ref.namespace,
        name=ref.name,
        state=ClaimState.PREPARE_STARTED,
        devices=tuple(DeviceRecord(pool="node-1", device=d, sharing=sharing) for d in devices),
    )
    return ClaimPlan(ref, planned), record


def test_a_device_held_by_another_claim_or_overlapping_it_is_refused_naming_the_holder(node: Node) -> None:
    hardware = {d.name: d.hardware for d in node.devices.devices}
    ledger = Ledger(CheckpointStore(node.root / "state"), "boot-1")
    assert ledger.reserve([reservation(node, 1, "gpu-0-mig-3g40gb-0")], [], hardware) == {}
    conflicts = ledger.reserve(
        [
            reservation(node, 2, "gpu-0-mig-3g40gb-0"),
            reservation(node, 3, "gpu-0-mig-1g10gb-2"),  # memory slices inside claim 1's
            reservation(node, 4, "gpu-0-mig-3g40gb-4"),  # beside them
            reservation(node, 5, "gpu-1"),
        ],
        [],
        hardware,
    )
    assert set(conflicts) == {uid(2), uid(3)}
    assert f"already prepared for claim default/claim-1 ({uid(1)})" in conflicts[uid(3)]
    assert {r.uid for r in ledger.records()} == {uid(1), uid(4), uid(5)}
    assert ledger.held_devices() == {"gpu-0-mig-3g40gb-0", "gpu-0-mig-3g40gb-4", "gpu-1"}


def test_reservations_reach_the_disk_only_when_recovery_needs_them(node: Node) -> None:
    hardware = {d.name: d.hardware for d in node.devices.devices}
    store = CountingStore(node.root / "state")
    ledger = Ledger(store, "boot-1")
    ledger.reserve([reservation(node, 1, "gpu-1")], [], hardware)
    assert store.saves == 0  # a crash leaves only a spec without a record: an orphan
    ledger.reserve([reservation(node, 2, "gpu-0-mig-3g40gb-4", sharing="MPS")], [], hardware)
    assert store.saves == 1  # sharing changes the device: recovery must know to undo it
    ledger.reserve([reservation(node, 1, "gpu-0-mig-3g40gb-0")], [uid(1)], hardware)
    assert store.saves == 2  # an earlier record replaced
    stored = store.load()
    assert stored is not None
    assert {u: [d.device for d in r.devices] for u, r in stored.claims.items()} == {
        uid(1): ["gpu-0-mig-3g40gb-0"],
        uid(2): ["gpu-0-mig-3g40gb-4"],
    }


class FailingStore(CheckpointStore):
    """A checkpoint whose writes fail (ENOSPC) while `full` is set."""

    full = False

    def save(self, checkpoint: CheckpointData) -> None:
        if self.full:
            raise StorageError("cannot write the checkpoint: ENOSPC")
        super().save(checkpoint)


def test_a_reservation_whose_write_fails_leaves_the_records_as_they_were(node: Node) -> None:
    hardware = {d.name: d.hardware for d in node.devices.devices}
    store = FailingStore(node.root / "state")
    ledger = Ledger(store, "boot-1")
    ledger.reserve([reservation(node, 1, "gpu-0-mig-3g40gb-0")], [], hardware)
    ledger.reserve([reservation(node, 2, "gpu-1")], [], hardware)
    before = {r.uid: r for r in ledger.records()}
    store.full = True
    with pytest.raises(StorageError, match="ENOSPC"):  # claim 1 replaced, claim 3 shares a GPU
        ledger.reserve(
            [
                reservation(node, 1, "gpu-0-mig-3g40gb-4"),
                reservation(node, 3, "gpu-0-mig-1g10gb-0", sharing="MPS"),
            ],
            [uid(1)],
            hardware,
        )
    assert {r.uid: r for r in ledger.records()} == before
    assert ledger.held_devices() == {"gpu-0-mig-3g40gb-0", "gpu-1"}


def test_the_checkpoint_another_instance_wrote_is_taken_once(node: Node) -> None:
    hardware = {d.name: d.hardware for d in node.devices.devices}
    ours = Ledger(CheckpointStore(node.root / "state"), "boot-1")
    theirs = Ledger(CheckpointStore(node.root / "state"), "boot-1")
    theirs.reserve([reservation(node, 1, "gpu-1")], [], hardware)
    theirs.persist()
    assert ours.reload_if_changed() == 1
    assert [r.uid for r in ours.records()] == [uid(1)]
    assert ours.reload_if_changed() is None  # unchanged since
