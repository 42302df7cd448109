"""GpuDriver with a claim watch's copies: prepared while the claim is fetched, answered only when
the fetched claim confirms them, and the checkpoint written once where once is safe."""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from dradriver.plugin.driver import CallError, ClaimRef
from dradriver.prepare.checkpoint import CheckpointData
from tests.helpers import allocated_claim, opaque, uid
from tests.prepare.node import CountingStore, Node
from tests.prepare.test_driver import TIME_SLICING_LONG, AuthoritativeClaims, one_gpu


class WatchCopies:
    """What a claim watch hands out: copies of claims that may trail the claim files."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}

    def put(self, claim: dict[str, Any]) -> None:
        meta = claim["metadata"]
        self.claims[(meta["namespace"], meta["name"])] = copy.deepcopy(claim)

    def get(self, ref: ClaimRef) -> Mapping[str, Any] | None:
        claim = self.claims.get((ref.namespace, ref.name))
        return claim if claim is not None and claim["metadata"]["uid"] == ref.uid else None


class Fetches(AuthoritativeClaims):
    """The claim files as the API server, remembering every fetch."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.fetched: list[str] = []

    def get(self, namespace: str, name: str) -> Mapping[str, Any]:
        self.fetched.append(name)
        return super().get(namespace, name)


@pytest.fixture
def node(tmp_path: Path) -> Node:
    node = Node(tmp_path, "dgx-h100")
    node.store = CountingStore(tmp_path / "state")
    return node


def stored_devices(node: Node, ref: ClaimRef) -> list[str]:
    stored = node.store.load()
    assert stored is not None
    return [d.device for d in stored.claims[ref.uid].devices]


def spec_devices(node: Node, ref: ClaimRef) -> list[str]:
    return [str(d["name"]) for d in node.spec(ref)["devices"]]  # type: ignore[attr-defined]


def test_a_watched_claim_is_answered_once_its_fetch_confirms_it(node: Node) -> None:
    copies, source = WatchCopies(), Fetches(node.claims_dir)
    driver = node.driver(claims=source, hints=copies)
    claim = one_gpu(1, "gpu-3")
    ref = node.add(claim)
    copies.put(claim)
    assert isinstance(node.store, CountingStore)
    saves = node.store.saves

    (device,) = driver.prepare([ref])[ref.uid].devices
    assert device.device_name == "gpu-3"
    assert source.fetched == ["claim-1"]  # the copy alone is never the answer
    assert node.store.saves - saves == 1  # PrepareCompleted is the one durable write
    assert spec_devices(node, ref) == [f"{ref.uid}-gpu-3"]
    assert driver.prepare([ref])[ref.uid].devices == (device,)  # idempotent, from the checkpoint
    driver.close()


def test_a_copy_that_trails_a_reallocation_is_never_answered(node: Node) -> None:
    copies = WatchCopies()
    driver = node.driver(claims=Fetches(node.claims_dir), hints=copies)
    copies.put(one_gpu(2, "gpu-1"))  # the watch has not seen the claim allocated again...
    ref = node.add(one_gpu(2, "gpu-5"))  # ...to gpu-5, which the kubelet acts on

    (device,) = driver.prepare([ref])[ref.uid].devices
    assert device.device_name == "gpu-5"
    assert spec_devices(node, ref) == [f"{ref.uid}-gpu-5"]
    assert stored_devices(node, ref) == ["gpu-5"]
    other = node.add(one_gpu(3, "gpu-1"))
    assert driver.prepare([other])[other.uid].error == ""  # nothing was left holding gpu-1
    driver.close()


def test_the_copy_is_written_down_while_its_claim_is_fetched(node: Node) -> None:
    """The checkpoint write overlaps the API server's answer instead of following it."""
    written = threading.Event()

    class Store(CountingStore):
        def save(self, checkpoint: CheckpointData) -> None:
            super().save(checkpoint)
            written.set()

    class Answers(Fetches):
        def get(self, namespace: str, name: str) -> Mapping[str, Any]:
            self.waited = written.wait(timeout=10)
            return super().get(namespace, name)

    node.store = Store(node.root / "state")
    copies, source = WatchCopies(), Answers(node.claims_dir)
    driver = node.driver(claims=source, hints=copies)
    claim = one_gpu(13, "gpu-4")
    ref = node.add(claim)
    copies.put(claim)
    written.clear()  # the driver's start-up wrote it once

    (device,) = driver.prepare([ref])[ref.uid].devices
    assert source.waited  # the record was on disk before the claim came back
    assert device.device_name == "gpu-4"
    assert stored_devices(node, ref) == ["gpu-4"]
    driver.close()


@pytest.mark.parametrize(
    ("truth", "message"),
    [
        ("deleted", "retrieve claim default/claim-4"),
        ("replaced", "claim default/claim-4 got replaced"),
        ("deallocated", "claim default/claim-4 not allocated"),
    ],
)
def test_a_failed_fetch_fails_the_call_and_undoes_what_the_copies_prepared(
    node: Node, truth: str, message: str
) -> None:
    copies = WatchCopies()
    driver = node.driver(claims=Fetches(node.claims_dir), hints=copies)
    fine, failing = one_gpu(5, "gpu-6"), one_gpu(4, "gpu-2")
    copies.put(fine)
    copies.put(failing)
    refs = [node.add(fine), ClaimRef("default", "claim-4", uid(4))]
    if truth == "replaced":
        node.add(
            one_gpu(40, "gpu-2") | {"metadata": {"namespace": "default", "name": "claim-4", "uid": uid(40)}}
        )
    elif truth == "deallocated":
        node.add(failing | {"status": {}})

    with pytest.raises(CallError, match=message):
        driver.prepare(refs)
    assert driver.records() == []
    assert node.cdi.claim_uids() == []
    assert node.store.load() == CheckpointData(boot_id="boot-1")
    driver.close()


@pytest.mark.parametrize("watched", [False, True])
def test_a_claim_prepared_for_another_allocation_is_prepared_again(node: Node, watched: bool) -> None:
    """Prepared, then deallocated and allocated again under the same UID before the kubelet
    unprepared it (a force-deleted pod), or prepared from a copy just before a crash."""
    copies = WatchCopies()
    driver = node.driver(claims=Fetches(node.claims_dir), hints=copies if watched else None)
    first = one_gpu(6, "gpu-1")
    ref = node.add(first)
    copies.put(first)
    assert driver.prepare([ref])[ref.uid].error == ""

    node.add(one_gpu(6, "gpu-4"))  # copies still say gpu-1
    (device,) = driver.prepare([ref])[ref.uid].devices
    assert device.device_name == "gpu-4"
    assert spec_devices(node, ref) == [f"{ref.uid}-gpu-4"]
    assert stored_devices(node, ref) == ["gpu-4"]
    driver.close()


def test_copies_never_release_a_holder_nor_apply_sharing(node: Node) -> None:
    copies = WatchCopies()
    driver = node.driver(claims=Fetches(node.claims_dir), hints=copies)
    holder = node.add(one_gpu(7, "gpu-2"))
    assert driver.prepare([holder])[holder.uid].error == ""
    released = one_gpu(7, "gpu-2")
    released["status"]["reservedFor"] = []  # type: ignore[index]
    node.add(released)  # would be released for a claim that really got gpu-2

    copies.put(one_gpu(8, "gpu-2"))  # a stale copy
    ref = node.add(one_gpu(8, "gpu-3"))
    assert [d.device_name for d in driver.prepare([ref])[ref.uid].devices] == ["gpu-3"]
    assert holder.uid in {r.uid for r in driver.records()}  # a copy is no reason to release it

    shared = allocated_claim(
        "ts", uid(9), [{"request": "gpu", "device": "gpu-5"}], config=[opaque(TIME_SLICING_LONG)]
    )
    copies.put(shared)
    assert isinstance(node.store, CountingStore)
    saves = node.store.saves
    shared_ref = node.add(shared)
    assert driver.prepare([shared_ref])[shared_ref.uid].error == ""
    assert node.sharing.timeslices  # applied once the fetch confirmed the claim
    assert node.store.saves - saves == 2  # PrepareStarted first: sharing changes the GPU itself
    driver.close()


def test_without_copies_the_claim_is_fetched_first_as_before(node: Node) -> None:
    source = Fetches(node.claims_dir)
    driver = node.driver(claims=source, hints=WatchCopies())
    ref = node.add(one_gpu(10, "gpu-7"))  # the watch has not seen it yet
    assert [d.device_name for d in driver.prepare([ref])[ref.uid].devices] == ["gpu-7"]
    assert source.fetched == ["claim-10"]
    driver.close()


def test_a_holder_whose_claim_was_allocated_other_devices_is_released(node: Node) -> None:
    """Its pod force-deleted, the claim was allocated again (same UID, another GPU) before the
    kubelet unprepared it: its old GPU goes to the claim the scheduler gave it to."""
    driver = node.driver(claims=Fetches(node.claims_dir))
    holder = node.add(one_gpu(11, "gpu-2"))
    assert driver.prepare([holder])[holder.uid].error == ""
    node.add(one_gpu(11, "gpu-6"))  # still reserved for a pod, but on gpu-6 now
    new = node.add(one_gpu(12, "gpu-2"))
    assert driver.prepare([new])[new.uid].error == ""
    assert {r.uid for r in driver.records()} == {new.uid}
    driver.close()
