"""Start-up recovery: the checkpoint and the CDI directory agree again, whatever happened before."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dradriver.prepare.checkpoint import CheckpointData, ClaimState
from tests.helpers import allocated_claim, opaque, uid
from tests.prepare.node import Node
from tests.prepare.test_gpu_driver import TIME_SLICING_LONG, one_gpu


def test_half_prepared_claims_are_rolled_back(tmp_path: Path) -> None:
    node = Node(tmp_path, "dgx-h100")
    driver = node.driver()
    ref = node.add(
        allocated_claim(
            "ts", uid(1), [{"request": "gpu", "device": "gpu-0"}], config=[opaque(TIME_SLICING_LONG)]
        )
    )
    assert driver.prepare([ref])[ref.uid].error == ""
    # Make it look as if we died between PrepareStarted and PrepareCompleted.
    raw = json.loads(node.store.path.read_text())
    record = raw["data"]["claims"][ref.uid]
    record["state"] = ClaimState.PREPARE_STARTED.value
    from dradriver.prepare.checkpoint import checksum

    raw["checksum"] = checksum(raw["data"])
    node.store.path.write_text(json.dumps(raw))
    report = node.driver(recover=False).recover()
    assert report.rolled_back == [ref.uid]
    assert not node.cdi.file_for(ref.uid).exists()
    assert node.sharing.timeslices == {}
    loaded = node.store.load()
    assert loaded is not None
    assert loaded.claims == {}


def test_orphaned_spec_files_and_temp_files_are_removed(tmp_path: Path) -> None:
    node = Node(tmp_path, "dgx-h100")
    driver = node.driver()
    kept = node.add(one_gpu(2, "gpu-1"))
    driver.prepare([kept])
    orphan = node.cdi.file_for(uid(3))
    orphan.write_text(node.cdi.file_for(kept.uid).read_text())
    (node.cdi.path / f".{orphan.name}.tmp").write_text("{partial")
    report = node.driver(recover=False).recover()
    assert report.orphans_removed == [uid(3)]
    assert report.temp_files_removed == 1
    assert sorted(p.name for p in node.cdi.path.iterdir()) == [node.cdi.file_for(kept.uid).name]


def test_a_corrupt_checkpoint_is_quarantined_and_state_rebuilt_from_cdi(tmp_path: Path) -> None:
    node = Node(tmp_path, "dgx-h100")
    driver = node.driver()
    ref = node.add(
        allocated_claim(
            "two", uid(4), [{"request": "a", "device": "gpu-2"}, {"request": "b", "device": "gpu-3"}]
        )
    )
    before = driver.prepare([ref])[ref.uid]
    node.store.path.write_text('{"version": 1, "checksum": "sha256:dead", "data": {}}')
    recovered = node.driver()
    quarantined = list(node.store.path.parent.glob("checkpoint.json.corrupt-*"))
    assert len(quarantined) == 1
    (record,) = recovered.records()
    assert record.recovered
    assert record.uid == ref.uid
    assert sorted(d.device for d in record.devices) == ["gpu-2", "gpu-3"]
    # The kubelet asks again: the claim is re-derived from its allocation, request names included.
    again = recovered.prepare([ref])[ref.uid]
    assert sorted((d.device_name, d.request_names) for d in again.devices) == sorted(
        (d.device_name, d.request_names) for d in before.devices
    )
    # Another claim cannot take the recovered claim's devices.
    thief = node.add(one_gpu(5, "gpu-2"))
    assert "already prepared for claim default/two" in recovered.prepare([thief])[thief.uid].error


def test_recovered_claims_can_be_unprepared_by_uid(tmp_path: Path) -> None:
    node = Node(tmp_path, "dgx-h100")
    ref = node.add(one_gpu(6, "gpu-4"))
    node.driver().prepare([ref])
    node.store.path.unlink()  # state directory wiped
    driver = node.driver()
    assert [r.uid for r in driver.records()] == [ref.uid]
    assert driver.unprepare([ref]) == {ref.uid: ""}
    assert node.cdi.claim_uids() == []


def test_a_reboot_clears_prepared_state(tmp_path: Path) -> None:
    node = Node(tmp_path, "dgx-h100")
    ref = node.add(one_gpu(7, "gpu-5"))
    node.driver().prepare([ref])
    node.boot_id = "boot-2"
    rebooted = node.driver()
    assert rebooted.records() == []
    assert node.cdi.claim_uids() == []
    assert rebooted.prepare([ref])[ref.uid].error == ""  # and the kubelet can prepare it afresh


@pytest.mark.parametrize("left", ["empty file", "no file"])
def test_a_checkpoint_lost_in_a_power_failure_takes_its_specs_along(tmp_path: Path, left: str) -> None:
    """Saves are not fsynced: after a power failure the checkpoint may be empty or missing, and
    the specs it named are the previous boot's, not claims to rebuild."""
    node = Node(tmp_path, "dgx-h100")
    ref = node.add(one_gpu(8, "gpu-6"))
    node.driver().prepare([ref])
    if left == "empty file":
        node.store.path.write_bytes(b"")
    else:
        node.store.path.unlink()
    node.boot_id = "boot-2"
    report = node.driver(recover=False).recover()
    assert report.cleared_after_reboot == [ref.uid]
    assert report.rebuilt_from_cdi == []
    assert node.cdi.claim_uids() == []
    assert node.store.load() == CheckpointData(boot_id="boot-2")
    assert node.store.last_boot() == "boot-2"


@pytest.fixture
def fsynced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths of the files and directories fsynced from now on (they are, for real)."""
    paths: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        paths.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    return paths


def synced_in(paths: list[str]) -> list[Path]:
    """The directory of each fsynced path: a temp file's, or the directory itself."""
    return [Path(p).parent if p.endswith(".tmp") else Path(p) for p in paths]


def test_the_boot_marker_is_the_only_fsynced_write(tmp_path: Path, fsynced: list[str]) -> None:
    """A boot's first start writes its marker durably; checkpoint saves and specs wait for no disk."""
    node = Node(tmp_path, "dgx-h100")
    driver = node.driver()
    marker = node.store.path.with_name("boot_id")
    assert marker.read_text() == "boot-1\n"
    assert synced_in(fsynced) == [marker.parent] * 2  # the marker's temp file, then its directory
    fsynced.clear()
    ref = node.add(one_gpu(9, "gpu-7"))
    assert driver.prepare([ref])[ref.uid].error == ""
    assert driver.unprepare([ref]) == {ref.uid: ""}
    node.driver()  # a restart in the same boot leaves the marker alone
    assert fsynced == []


def test_without_a_boot_id_every_save_is_fsynced(tmp_path: Path, fsynced: list[str]) -> None:
    """Nothing would tell a later boot that the state is void: the checkpoint must survive it."""
    node = Node(tmp_path, "dgx-h100", boot_id="")
    driver = node.driver()
    fsynced.clear()
    ref = node.add(one_gpu(10, "gpu-0"))
    assert driver.prepare([ref])[ref.uid].error == ""
    assert synced_in(fsynced) == [node.store.path.parent] * 2  # the checkpoint's temp file, its directory
    assert not node.store.path.with_name("boot_id").exists()
