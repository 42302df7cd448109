"""SliceController against an API server: the fake always, a real one when configured.

Each test publishes to a Node of its own through the real client, over real HTTP.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dradriver.kube import load_client
from dradriver.publish import SliceController, delete_node_slices
from dradriver.slices import InvalidSlicesError, build_node_slices, validate_node_pool
from tests.helpers import wait_for, write_gpu_profile
from tests.publish.apiservers import TEST_DRIVER, Backend
from tests.publish.fakeslices import desired_slices, fake_devices
from tests.publish.kubefake import FakeApiServer

Json = dict[str, Any]


class Devices:
    """The node's device set, changeable by a test; renders the desired slices and, as
    `render_node_slices` does, refuses a pool that fails `validate_node_pool`."""

    def __init__(self, node: str, count: int, **kw: Any) -> None:
        self.node = node
        self.devices = fake_devices(count, **kw)
        self.counters = bool(kw.get("counters"))

    def __call__(self) -> list[Json]:
        slices = desired_slices(self.devices, driver=TEST_DRIVER, node=self.node, counters=self.counters)
        if findings := validate_node_pool(slices, driver=TEST_DRIVER, node=self.node):
            raise InvalidSlicesError(findings)
        return slices


def versions(slices: list[Json]) -> dict[str, str]:
    return {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in slices}


def device_names(slices: list[Json]) -> list[list[str]]:
    return [[d["name"] for d in s["spec"].get("devices", [])] for s in slices]


def matches(backend: Backend, node: str, desired: Callable[[], list[Json]]) -> Callable[[], bool]:
    """The API server holds exactly the desired pool, at one generation."""

    def check() -> bool:
        slices = backend.slices(node)
        want = desired()
        return (
            device_names(slices) == device_names(want)
            and len({s["spec"]["pool"]["generation"] for s in slices}) == 1
            and all(s["spec"]["pool"]["resourceSliceCount"] == len(want) for s in slices)
        )

    return check


def test_first_publish(backend: Backend, start: Callable[..., SliceController]) -> None:
    node = backend.make_node()
    node_uid = backend.direct.node_uid(node)
    controller = start(backend.client(), node, Devices(node, 8))
    assert controller.wait_published(10)

    (slice_,) = backend.slices(node)
    assert slice_["metadata"]["name"].startswith(f"00000-{TEST_DRIVER}-{node}-")
    assert slice_["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}
    ]
    assert slice_["spec"]["nodeName"] == node
    assert slice_["spec"]["pool"] == {"name": node, "generation": 1, "resourceSliceCount": 1}
    assert device_names([slice_]) == [[f"gpu-{i}" for i in range(8)]]
    status = controller.status
    assert status.published
    assert status.in_sync
    assert status.last_error is None
    assert (status.writes.creates, status.writes.updates, status.writes.deletes) == (1, 0, 0)


def rendered(profile: str, node: str, partitionable: bool = False) -> Callable[[], list[Json]]:
    """The real renderer's slices for a fake GPU profile (name or file)."""
    slices = build_node_slices(profile, node_name=node, driver_name=TEST_DRIVER, partitionable=partitionable)
    return lambda: slices


def test_300_device_profile_is_published_as_three_slices(
    backend: Backend, start: Callable[..., SliceController], tmp_path: Path
) -> None:
    node = backend.make_node()
    profile = write_gpu_profile(tmp_path / "300-gpus.yaml", 300, product="Tesla T4")
    desired = rendered(str(profile), node)
    controller = start(backend.client(), node, desired)
    assert controller.wait_published(10)
    slices = backend.slices(node)
    assert [s["metadata"]["name"][:6] for s in slices] == ["00000-", "00001-", "00002-"]
    assert [len(s["spec"]["devices"]) for s in slices] == [128, 128, 44]
    assert {s["spec"]["pool"]["generation"] for s in slices} == {1}
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {3}
    assert matches(backend, node, desired)()


def test_partitionable_profile_with_counter_slice(
    backend: Backend, start: Callable[..., SliceController], tmp_path: Path
) -> None:
    node = backend.make_node()
    profile = write_gpu_profile(tmp_path / "mig.yaml", 6, mig_empty=True)
    desired = rendered(str(profile), node, partitionable=True)
    controller = start(backend.client(), node, desired)
    assert controller.wait_published(10)
    time.sleep(0.5)
    slices = backend.slices(node)
    assert matches(backend, node, desired)()
    if not controller.status.dropped_features:  # a real server may have DRAPartitionableDevices off
        assert [len(s["spec"].get("sharedCounters", [])) for s in slices] == [0, 0, 0, 6]
        assert [s["spec"].get("sharedCounters") for s in slices] == [
            s["spec"].get("sharedCounters") for s in desired()
        ]
    assert controller.status.writes.total == 4


def test_restart_adopts_slices_without_writes(
    backend: Backend, start: Callable[..., SliceController]
) -> None:
    node = backend.make_node()
    devices = Devices(node, 200)
    first = start(backend.client(), node, devices)
    assert first.wait_published(10)
    first.stop()
    before = versions(backend.slices(node))
    requests_before = len(backend.fake.requests) if backend.fake else 0

    second = start(backend.client(), node, devices)
    assert second.wait_published(10)
    time.sleep(1.0)  # any echo of a write would have arrived by now
    assert second.status.writes.total == 0
    assert second.status.published
    assert versions(backend.slices(node)) == before
    if backend.fake:
        assert [r for r in backend.fake.requests_since(requests_before) if r.write] == []


def test_slices_deleted_by_someone_else_are_republished(
    backend: Backend, start: Callable[..., SliceController]
) -> None:
    node = backend.make_node()
    devices = Devices(node, 200)
    controller = start(backend.client(), node, devices)
    assert controller.wait_published(10)

    # As the kubelet does when it starts, or 30 s after the driver disconnected:
    assert delete_node_slices(backend.direct, driver_name=TEST_DRIVER, node_name=node) == 2
    wait_for(lambda: len(backend.slices(node)) == 2, 10, "the deleted slices to be recreated")
    wait_for(matches(backend, node, devices), 5, "the desired pool")
    # Counted once the API server's answer is back, which may follow the slice's appearance.
    wait_for(lambda: controller.status.writes.creates == 4, 10, "both re-creates counted")

    victim = backend.slices(node)[1]["metadata"]
    backend.direct.delete_resource_slice(victim["name"])  # one slice lost: the pool is re-versioned
    wait_for(
        lambda: {s["spec"]["pool"]["generation"] for s in backend.slices(node)} == {2},
        10,
        "generation 2 on every slice",
    )
    wait_for(matches(backend, node, devices), 5, "the desired pool")


def test_foreign_edit_is_reverted(backend: Backend, start: Callable[..., SliceController]) -> None:
    node = backend.make_node()
    devices = Devices(node, 200)
    controller = start(backend.client(), node, devices)
    assert controller.wait_published(10)

    edited = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", **backend.slices(node)[1]}
    edited["spec"]["devices"] = edited["spec"]["devices"][:-1]
    before = len(backend.fake.requests) if backend.fake else 0
    backend.direct.update_resource_slice(edited)
    wait_for(lambda: controller.status.writes.updates == 1, 10, "one update")
    wait_for(matches(backend, node, devices), 5, "the desired pool")
    slices = backend.slices(node)
    assert {s["spec"]["pool"]["generation"] for s in slices} == {1}  # one slice changed: updated in place
    assert controller.status.writes.total == 3
    if backend.fake:  # the watch said which slice changed; its content came by one GET
        name = edited["metadata"]["name"]
        gets = [r for r in backend.fake.requests_since(before) if r.method == "GET" and not r.collection]
        assert [r.path.rsplit("/", 1)[-1] for r in gets] == [name]


def test_the_slice_watch_carries_metadata_alone(backend: Backend) -> None:
    """What the controller's watch relies on: the API server strips the content it sends."""
    node = backend.make_node()
    selector = f"spec.driver={TEST_DRIVER},spec.nodeName={node}"
    rv = backend.direct.list_resource_slices(selector)["metadata"]["resourceVersion"]
    slice_ = desired_slices(fake_devices(2), driver=TEST_DRIVER, node=node)[0]
    created = backend.direct.create_resource_slice(slice_)
    with backend.direct.watch_resource_slices(selector, rv, metadata_only=True) as stream:
        event = next(iter(stream))
    assert event.type == "ADDED"
    assert event.object["kind"] == "PartialObjectMetadata"
    assert event.object["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    assert "spec" not in event.object


@pytest.mark.parametrize(
    ("before", "after", "writes", "generation"),
    [
        pytest.param(200, 201, (0, 1, 0), 1, id="one slice grows: one in-place update"),
        pytest.param(200, 300, (1, 2, 0), 2, id="new slice: bump, update both, create one"),
        pytest.param(300, 100, (0, 1, 2), 1, id="shrink to one slice: delete two, update one"),
    ],
)
def test_device_set_change_makes_exactly_the_expected_writes(
    backend: Backend,
    start: Callable[..., SliceController],
    before: int,
    after: int,
    writes: tuple[int, int, int],
    generation: int,
) -> None:
    node = backend.make_node()
    devices = Devices(node, before)
    controller = start(backend.client(), node, devices)
    assert controller.wait_published(10)
    published = controller.status.writes

    devices.devices = fake_devices(after)
    controller.resync()
    assert controller.wait_published(10)
    time.sleep(0.5)
    now = controller.status.writes
    assert (
        now.creates - published.creates,
        now.updates - published.updates,
        now.deletes - published.deletes,
    ) == writes
    assert matches(backend, node, devices)()
    assert {s["spec"]["pool"]["generation"] for s in backend.slices(node)} == {generation}


def test_steady_state_makes_no_requests_but_one_watch(
    backend: Backend, start: Callable[..., SliceController]
) -> None:
    node = backend.make_node()
    client, proxy = backend.proxied_client()
    controller = start(client, node, Devices(node, 16))
    assert controller.wait_published(10)
    wait_for(lambda: controller.status.watching, 5, "the watch to open")
    writes = controller.status.writes.total
    requests = len(backend.fake.requests) if backend.fake else 0
    # GET node, LIST, POST and the watch took turns on one connection (HTTP/1.1 has no streams).
    assert proxy.connections == 1
    connections = proxy.connections
    time.sleep(3)
    assert controller.status.writes.total == writes
    assert proxy.connections == connections  # the watch connection stays open
    if backend.fake:
        assert backend.fake.requests_since(requests) == []
        lists = [r for r in backend.fake.requests if r.path.endswith("/resourceslices") and r.method == "GET"]
        assert [r.watch for r in lists] == [False, True]
        assert "as=PartialObjectMetadata" in lists[1].accept
        order = [(r.method, r.path.rsplit("/", 1)[-1], r.watch) for r in backend.fake.requests]
        assert order[-4:] == [
            ("GET", node, False),
            ("GET", "resourceslices", False),
            ("POST", "resourceslices", False),
            ("GET", "resourceslices", True),
        ]


def test_apiserver_unreachable_for_20s_is_recovered_without_restart(
    backend: Backend, start: Callable[..., SliceController]
) -> None:
    node = backend.make_node()
    client, proxy = backend.proxied_client()
    devices = Devices(node, 200)
    controller = start(client, node, devices)
    assert controller.wait_published(10)

    proxy.cut()
    outage_end = time.monotonic() + 20
    # While we cannot reach it, the kubelet wipes our slices and the device set changes.
    delete_node_slices(backend.direct, driver_name=TEST_DRIVER, node_name=node)
    devices.devices = fake_devices(150)
    controller.resync()
    wait_for(lambda: controller.status.last_error is not None, 15, "an error during the outage")
    assert not controller.status.watching
    time.sleep(max(0.0, outage_end - time.monotonic()))
    assert backend.slices(node) == []

    proxy.restore()
    recovered = time.monotonic()
    assert controller.wait_published(15)
    wait_for(matches(backend, node, devices), 10, "the desired pool")
    assert time.monotonic() - recovered < 10
    wait_for(lambda: controller.status.watching, 10, "the watch to be back")
    assert controller.status.last_error is None


def test_missing_node_is_waited_for(backend: Backend, start: Callable[..., SliceController]) -> None:
    node = backend.make_node(create=False)
    controller = start(backend.client(), node, Devices(node, 4))
    wait_for(lambda: "does not exist" in (controller.status.last_error or ""), 10, "the missing-Node error")
    assert f"Node {node!r}" in (controller.status.last_error or "")
    assert not controller.wait_published(0.5)
    backend.direct.request(
        "POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}
    )
    assert controller.wait_published(15)
    assert len(backend.slices(node)) == 1


def test_stop_while_the_node_is_missing_ends_both_threads(
    backend: Backend, start: Callable[..., SliceController]
) -> None:
    node = backend.make_node(create=False)
    before = set(threading.enumerate())
    controller = start(backend.client(), node, Devices(node, 4))
    wait_for(lambda: "does not exist" in (controller.status.last_error or ""), 10, "the missing-Node error")
    assert not controller.status.watching  # the list and the watch wait for the Node
    controller.stop()
    assert [t.name for t in set(threading.enumerate()) - before if t.name.startswith("slice-")] == []


def test_invalid_desired_slices_are_not_published(
    backend: Backend, start: Callable[..., SliceController]
) -> None:
    node = backend.make_node()
    devices = Devices(node, 4)
    devices.devices.append(dict(devices.devices[0]))  # a duplicate device name
    controller = start(backend.client(), node, devices)
    wait_for(
        lambda: "Duplicate value: device name 'gpu-0'" in (controller.status.last_error or ""),
        10,
        "the invalid-pool error",
    )
    assert backend.slices(node) == []
    devices.devices.pop()
    controller.resync()
    assert controller.wait_published(10)


def test_dropped_fields_are_reported_once_without_update_loop(
    gates_off_backend: Backend, start: Callable[..., SliceController]
) -> None:
    backend = gates_off_backend
    node = backend.make_node()
    devices = Devices(node, 4, taint=True, counters=True)
    controller = start(backend.client(), node, devices)
    assert controller.wait_published(10)
    writes = controller.status.writes.total
    time.sleep(1.5)
    status = controller.status
    assert status.writes.total == writes == 2
    assert status.dropped_features == ("DRADeviceTaints", "DRAPartitionableDevices")
    assert status.last_error is None
    assert [w[:17] for w in status.warnings] == ["ResourceSlice #0:", "ResourceSlice #1:"]
    assert status.warnings[1].endswith(
        "disabled: DRADeviceTaints DRAPartitionableDevices; publishing what it stores instead"
    )
    stored = backend.slices(node)
    assert all("taints" not in d for s in stored for d in s["spec"].get("devices", []))
    if backend.fake:
        events = backend.fake.objects("events")
        assert [e["reason"] for e in events] == ["DroppedFields", "DroppedFields"]  # one per slice, once

    # Republishing after a wipe uses the stored form: no new reports.
    delete_node_slices(backend.direct, driver_name=TEST_DRIVER, node_name=node)
    wait_for(lambda: len(backend.slices(node)) == 2, 10, "the stored form republished")
    if backend.fake:
        time.sleep(0.5)
        assert len(backend.fake.objects("events")) == 2


def test_stop_leaves_slices_and_delete_node_slices_removes_them(
    backend: Backend, start: Callable[..., SliceController]
) -> None:
    node = backend.make_node()
    controller = start(backend.client(), node, Devices(node, 200))
    assert controller.wait_published(10)
    controller.stop()
    assert len(backend.slices(node)) == 2
    assert delete_node_slices(backend.direct, driver_name=TEST_DRIVER, node_name=node) == 2
    assert backend.slices(node) == []


def test_watches_ended_at_once_are_not_retried_in_a_tight_loop(
    tmp_path: Path, start: Callable[..., SliceController]
) -> None:
    fake = FakeApiServer(max_watch_seconds=0).start()
    try:
        client = load_client(str(fake.write_kubeconfig(tmp_path / "kubeconfig")))
        assert client is not None
        fake.create("nodes", None, {"metadata": {"name": "node-a"}})
        controller = start(client, "node-a", Devices("node-a", 4))
        assert controller.wait_published(10)
        time.sleep(2)
        watches = [r for r in fake.requests if r.watch]
        assert 2 <= len(watches) <= 12
        client.close()
    finally:
        fake.stop()
