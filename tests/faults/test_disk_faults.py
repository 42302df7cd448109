"""The checkpoint is the commit point: a full, read-only or failing disk under the state or CDI
directory fails the claims of the call one by one, naming the directory and the errno, and leaves
memory and disk as they were, so that the kubelet's retry does the work again (real tmpfs mounts;
EIO, which no mount produces on demand, by fault injection)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from dradriver.files.write import StorageError
from dradriver.prepare import checkpoint
from dradriver.prepare.gpu_driver import GpuDriver
from tests.faults.mounts import fill, remount, tmpfs
from tests.faults.prepared import one_claim_prepared, one_gpu
from tests.helpers import ServeProcess, allocated_claim, opaque, uid
from tests.prepare.node import Node
from tests.robustness.common import snapshot

TIME_SLICED_LONG: dict[str, object] = {
    "apiVersion": "gpu.dradriver.dev/v1alpha1",
    "kind": "GpuConfig",
    "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}},
}


def prepared(driver: GpuDriver) -> list[str]:
    return sorted(r.uid for r in driver.records())


def test_a_full_state_disk_fails_the_prepare_and_its_retry_prepares_again(node: Node) -> None:
    with one_claim_prepared(node, "state", "1m") as (driver, kept, state):
        recorded = node.store.path.read_bytes()
        filler = fill(state)
        ref = node.add(one_gpu(2, "gpu-1"))
        results = driver.prepare([kept, ref])
        assert results[kept.uid].error == ""  # prepared before: still prepared
        error = results[ref.uid].error
        assert f"claim default/claim-2: not prepared: cannot write the checkpoint in {state}: ENOSPC" in error
        assert prepared(driver) == [kept.uid]
        assert driver.held_devices() == {"gpu-0"}
        assert not node.cdi.file_for(ref.uid).exists()
        assert node.store.path.read_bytes() == recorded
        assert sorted(p.name for p in node.cdi.path.iterdir()) == [node.cdi.file_for(kept.uid).name]
        # The kubelet's retry is not answered from memory: it fails again, then prepares.
        assert "ENOSPC" in driver.prepare([ref])[ref.uid].error
        filler.unlink()
        assert driver.prepare([ref])[ref.uid].error == ""
        stored = node.store.load()
        assert stored is not None
        assert sorted(stored.claims) == sorted([kept.uid, ref.uid])


def test_a_full_state_disk_fails_the_unprepare_and_keeps_the_claim_whole(node: Node) -> None:
    with one_claim_prepared(node, "state", "1m") as (driver, ref, state):
        spec = node.cdi.file_for(ref.uid).read_bytes()
        recorded = node.store.path.read_bytes()
        filler = fill(state)
        error = driver.unprepare([ref])[ref.uid]
        assert f"claim default/claim-1: not unprepared: cannot write the checkpoint in {state}: ENOSPC" in (
            error
        )
        assert node.cdi.file_for(ref.uid).read_bytes() == spec
        assert [p.name for p in node.cdi.path.iterdir()] == [node.cdi.file_for(ref.uid).name]
        assert node.store.path.read_bytes() == recorded
        assert prepared(driver) == [ref.uid]
        assert "ENOSPC" in driver.unprepare([ref])[ref.uid]  # the retry does the work again
        filler.unlink()
        assert driver.unprepare([ref]) == {ref.uid: ""}
        assert not node.cdi.file_for(ref.uid).exists()
        driver.close()
        # After a restart nothing stale blocks the GPU.
        restarted = node.driver()
        other = node.add(one_gpu(2, "gpu-0"))
        assert prepared(restarted) == []
        assert restarted.prepare([other])[other.uid].error == ""
        restarted.close()


def test_a_read_only_state_dir_fails_the_prepare_with_erofs(node: Node) -> None:
    state = node.root / "state"
    with tmpfs(state):
        driver = node.driver()
        ref = node.add(one_gpu(1, "gpu-0"))
        remount(state, "ro")
        error = driver.prepare([ref])[ref.uid].error
        assert f"cannot write the checkpoint in {state}: EROFS" in error
        assert prepared(driver) == []
        assert driver.held_devices() == set()
        assert list(node.cdi.path.iterdir()) == []
        remount(state, "rw")
        assert driver.prepare([ref])[ref.uid].error == ""
        driver.close()


def test_a_full_device_metadata_dir_fails_the_prepare_and_its_retry_prepares_again(node: Node) -> None:
    with one_claim_prepared(node, "device-metadata", "1m") as (driver, kept, directory):
        filler = fill(directory)
        ref = node.add(one_gpu(2, "gpu-1"))
        error = driver.prepare([ref])[ref.uid].error
        assert error.startswith(
            f"claim default/claim-2: cannot write the device metadata in {directory}: ENOSPC"
        ), error
        assert prepared(driver) == [kept.uid]
        assert not node.cdi.file_for(ref.uid).exists()
        assert sorted(p.name for p in directory.iterdir()) == sorted([f"{kept.uid}_gpu.json", filler.name])
        filler.unlink()
        assert driver.prepare([ref])[ref.uid].error == ""
        assert (directory / f"{ref.uid}_gpu.json").is_file()


def test_a_read_only_cdi_dir_is_a_per_claim_error_and_reserves_nothing(node: Node) -> None:
    cdi_dir = node.root / "cdi"
    with tmpfs(cdi_dir):
        driver = node.driver()
        first, second = node.add(one_gpu(1, "gpu-0")), node.add(one_gpu(2, "gpu-0"))
        remount(cdi_dir, "ro")
        error = driver.prepare([first])[first.uid].error
        assert f"claim default/claim-1: cannot write the CDI spec in {cdi_dir}: EROFS" in error
        assert driver.held_devices() == set()
        stored = node.store.load()
        assert stored is not None
        assert stored.claims == {}
        remount(cdi_dir, "rw")
        assert driver.prepare([second])[second.uid].error == ""  # gpu-0 was not held by the failure
        driver.close()


def test_a_read_only_cdi_dir_fails_the_unprepare_and_keeps_the_claim(node: Node) -> None:
    with one_claim_prepared(node, "cdi") as (driver, ref, cdi_dir):
        remount(cdi_dir, "ro")
        error = driver.unprepare([ref])[ref.uid]
        assert f"cannot remove the CDI spec of claim {ref.uid} in {cdi_dir}: EROFS" in error
        assert node.cdi.file_for(ref.uid).exists()
        stored = node.store.load()
        assert stored is not None
        assert list(stored.claims) == [ref.uid]
        remount(cdi_dir, "rw")
        assert driver.unprepare([ref]) == {ref.uid: ""}
        assert list(cdi_dir.iterdir()) == []
        driver.close()


def test_a_failed_unprepare_leaves_the_claims_sharing_in_place(node: Node) -> None:
    cdi_dir = node.root / "cdi"
    with tmpfs(cdi_dir):
        driver = node.driver()
        time_sliced = opaque(TIME_SLICED_LONG)
        ref = node.add(
            allocated_claim("ts", uid(1), [{"request": "gpu", "device": "gpu-5"}], config=[time_sliced])
        )
        assert driver.prepare([ref])[ref.uid].error == ""
        applied = dict(node.sharing.timeslices)
        assert list(applied.values()) == ["Long"]
        remount(cdi_dir, "ro")
        assert "EROFS" in driver.unprepare([ref])[ref.uid]
        assert node.sharing.timeslices == applied  # still prepared, still time-sliced
        remount(cdi_dir, "rw")
        assert driver.unprepare([ref]) == {ref.uid: ""}
        assert node.sharing.timeslices == {}
        driver.close()


def test_an_io_error_on_the_checkpoint_fails_the_claim_and_changes_nothing(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    driver = node.driver()
    kept, ref = node.add(one_gpu(1, "gpu-0")), node.add(one_gpu(2, "gpu-1"))
    assert driver.prepare([kept])[kept.uid].error == ""
    before = snapshot(node.root)

    def failing_write(target: Path, data: bytes, **_: object) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO), str(target))

    monkeypatch.setattr(checkpoint, "write_atomically", failing_write)
    assert "cannot write the checkpoint" in driver.prepare([ref])[ref.uid].error
    assert "EIO" in driver.unprepare([kept])[kept.uid]
    assert snapshot(node.root) == before
    assert prepared(driver) == [kept.uid]
    driver.close()


def test_start_up_on_a_full_disk_fails_before_it_changes_anything(node: Node) -> None:
    with one_claim_prepared(node, "state", "1m") as (driver, _, state):
        driver.close()
        orphan = node.cdi.file_for(uid(9))
        orphan.write_text("{}")  # a spec no record names: recovery would remove it
        fill(state)
        before = snapshot(node.root)
        with pytest.raises(StorageError, match=f"cannot write the checkpoint in {state}: ENOSPC"):
            node.driver()
        assert snapshot(node.root) == before
        # serve says so in one line and exits 1, with nothing changed either.
        serve = ServeProcess(node.root, ["--state-dir", str(state), "--log-format", "json"])
        serve.start(wait=False)
        assert serve.proc is not None
        assert serve.proc.wait(60) == 1
        failures = [line for line in serve.log().splitlines() if '"level": "error"' in line]
        assert len(failures) == 1, serve.log()
        assert f"--state-dir {state}: cannot take the lock" in failures[0]  # the first write it tries
        assert "ENOSPC (No space left on device)" in failures[0]
        after = snapshot(node.root)
        assert {k: v for k, v in after.items() if k.startswith(("cdi", "state"))} == {
            k: v for k, v in before.items() if k.startswith(("cdi", "state"))
        }
