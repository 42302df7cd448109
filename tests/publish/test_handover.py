"""Two instances of the driver publishing one node's pool (a surge rollout): the newer owns it.

Both controllers run against the same API server (the fake always, a real one when configured)
with the real client; `alive` stands for the instances whose registration socket answers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dradriver.publish import SliceController
from dradriver.publish.handover import Marker, annotation_key, marker_of, newest_other
from tests.helpers import wait_for
from tests.publish.apiservers import TEST_DRIVER, Backend
from tests.publish.fakeslices import desired_slices, fake_devices

Json = dict[str, Any]
OLD = Marker(1_000, "0b6f6f3e-0000-4000-8000-000000000001")
NEW = Marker(2_000, "0b6f6f3e-0000-4000-8000-000000000002")


def pool(node: str, memory: str) -> Callable[[], list[Json]]:
    slices = desired_slices(fake_devices(8, memory=memory), driver=TEST_DRIVER, node=node)
    return lambda: slices


def memory_of(backend: Backend, node: str) -> set[str]:
    return {d["capacity"]["memory"]["value"] for s in backend.slices(node) for d in s["spec"]["devices"]}


def writes(controller: SliceController) -> int:
    return controller.status.writes.total


def test_markers_order_by_start_time_and_parse_back() -> None:
    assert OLD < NEW
    assert Marker.parse(NEW.format()) == NEW
    assert Marker.parse("123/") == Marker(123, "")
    assert Marker.parse("not-a-marker") is None
    assert Marker.parse(None) is None
    slices = [{"metadata": {"annotations": {annotation_key(TEST_DRIVER): m.format()}}} for m in (OLD, NEW)]
    assert marker_of(slices[0], TEST_DRIVER) == OLD
    assert newest_other(slices, TEST_DRIVER, OLD) == NEW
    assert newest_other(slices, TEST_DRIVER, NEW) is None


def test_newer_instance_takes_the_pool_and_the_older_stops_writing(
    backend: Backend, start: Callable[..., SliceController]
) -> None:
    node = backend.make_node()
    alive = {OLD.instance}
    old = start(backend.client(), node, pool(node, "80Gi"), marker=OLD, instance_alive=alive.__contains__)
    assert old.wait_published(10)
    assert {marker_of(s, TEST_DRIVER) for s in backend.slices(node)} == {OLD}

    alive.add(NEW.instance)
    new = start(backend.client(), node, pool(node, "40Gi"), marker=NEW, instance_alive=alive.__contains__)
    assert new.wait_published(10)
    assert memory_of(backend, node) == {"40Gi"}
    assert {marker_of(s, TEST_DRIVER) for s in backend.slices(node)} == {NEW}

    # The old instance saw the change (its watch), and yields instead of writing it back.
    wait_for(lambda: old.status.superseded_by == NEW.format(), 10, "the old instance to yield")
    before = writes(old)
    old.resync()
    assert old.wait_published(10)
    assert writes(old) == before
    assert memory_of(backend, node) == {"40Gi"}
    assert new.status.in_sync
    assert new.status.superseded_by is None

    # A failed rollout: the new pod goes away; the old instance publishes its pool again.
    new.stop()
    alive.discard(NEW.instance)
    wait_for(lambda: memory_of(backend, node) == {"80Gi"}, 15, "the old instance to take the pool back")
    assert old.status.superseded_by is None


def test_agreeing_instances_hand_over_without_a_write(
    backend: Backend, start: Callable[..., SliceController]
) -> None:
    node = backend.make_node()
    alive = {OLD.instance, NEW.instance}
    old = start(backend.client(), node, pool(node, "80Gi"), marker=OLD, instance_alive=alive.__contains__)
    assert old.wait_published(10)
    versions = {s["metadata"]["resourceVersion"] for s in backend.slices(node)}
    new = start(backend.client(), node, pool(node, "80Gi"), marker=NEW, instance_alive=alive.__contains__)
    assert new.wait_published(10)
    assert writes(new) == 0
    assert {s["metadata"]["resourceVersion"] for s in backend.slices(node)} == versions


def test_a_dead_newer_instance_does_not_freeze_the_pool(
    backend: Backend, start: Callable[..., SliceController]
) -> None:
    """A marker left by an instance that no longer serves (crashed, rolled back) is ignored."""
    node = backend.make_node()
    dead = start(backend.client(), node, pool(node, "40Gi"), marker=NEW, instance_alive=lambda _: False)
    assert dead.wait_published(10)
    dead.stop()
    old = start(backend.client(), node, pool(node, "80Gi"), marker=OLD, instance_alive=lambda _: False)
    assert old.wait_published(10)
    assert memory_of(backend, node) == {"80Gi"}
    assert old.status.superseded_by is None
