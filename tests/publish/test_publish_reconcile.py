"""The pool reconcile decisions (pure): matching, generation bumps, write order and contents."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dradriver.publish.reconcile import (
    Plan,
    contents_equal,
    decode_index,
    encode_index,
    generate_name,
    index_length,
    plan_pool,
)
from dradriver.slices import dropped_gates, validate_node_pool
from tests.publish.fakeslices import desired_slices, fake_devices

DRIVER = "gpu.dradriver.dev"
NODE = "node-a"
UID = "11111111-2222-3333-4444-555555555555"
Json = dict[str, Any]


def desired(*device_counts: int, **kw: Any) -> list[Json]:
    """One desired slice per count, devices named uniquely across the pool."""
    out = []
    start = 0
    for count in device_counts:
        devices = fake_devices(start + count, **kw)[start:]
        out.append(desired_slices(devices, driver=DRIVER, node=NODE)[0])
        start += count
    for slice_ in out:
        slice_["spec"]["pool"]["resourceSliceCount"] = len(out)
    return out


def stored(plan_or_desired: list[Json], generation: int = 1, *, index_width: int = 5) -> list[Json]:
    """What the API server would hold after publishing `plan_or_desired` at `generation`."""
    out = []
    for i, slice_ in enumerate(plan_or_desired):
        body = copy.deepcopy(slice_)
        body["metadata"] = {
            "name": f"{i:0{index_width}x}-{DRIVER}-{NODE}-abcde",
            "uid": f"uid-{i}",
            "resourceVersion": str(100 + i),
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": UID, "controller": True}
            ],
        }
        body["spec"]["pool"] = {
            "name": NODE,
            "generation": generation,
            "resourceSliceCount": len(plan_or_desired),
        }
        out.append(body)
    return out


def plan(existing: list[Json], want: list[Json]) -> Plan:
    return plan_pool(existing, want, driver=DRIVER, node=NODE, node_uid=UID)


def summary(p: Plan) -> tuple[int, list[str], list[int], list[int]]:
    return (
        p.generation,
        [d.name[:5] for d in p.deletes],
        [u.index for u in p.updates],
        [c.index for c in p.creates],
    )


# -- naming ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("slices", "length"), [(0, 5), (1, 5), (16, 5), (0xFFFFF + 1, 5), (0xFFFFF + 2, 6), (0x1000000 + 1, 7)]
)
def test_index_length_is_at_least_five_hex_digits(slices: int, length: int) -> None:
    assert index_length(slices) == length


@pytest.mark.parametrize(
    ("name", "length", "index"),
    [
        ("00000-gpu.dradriver.dev-node-a-x7k2p", 5, 0),
        ("0001f-gpu.dradriver.dev-node-a-x7k2p", 5, 31),
        ("000010-gpu.dradriver.dev-node-a-x7k2p", 5, None),  # wrong width: the pool grew
        ("node-a-gpu.dradriver.dev-x7k2p", 5, None),  # 1.34/1.35 naming
        ("0000g-gpu.dradriver.dev-node-a-x7k2p", 5, None),
        ("00000", 5, None),
    ],
)
def test_decode_index(name: str, length: int, index: int | None) -> None:
    assert decode_index(name, length) == index


def test_generate_name_matches_upstream_scheme() -> None:
    assert generate_name(10, 5, DRIVER, NODE) == "0000a-gpu.dradriver.dev-node-a-"
    assert encode_index(255, 6) == "0000ff"


# -- generation and writes ------------------------------------------------------------------------


def test_new_pool_is_created_at_generation_one_in_index_order() -> None:
    p = plan([], desired(128, 128, 44))
    assert summary(p) == (1, [], [], [0, 1, 2])
    first = p.creates[0].body
    assert first["metadata"] == {
        "generateName": "00000-gpu.dradriver.dev-node-a-",
        "ownerReferences": [
            {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": UID, "controller": True}
        ],
    }
    assert first["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 3}
    assert first["spec"]["nodeName"] == NODE
    assert first["spec"]["driver"] == DRIVER
    assert len(first["spec"]["devices"]) == 128


def test_rendered_generation_is_overridden() -> None:
    want = desired(4)
    want[0]["spec"]["pool"]["generation"] = 42
    assert plan([], want).generation == 1


def test_published_pool_needs_no_writes() -> None:
    want = desired(128, 10)
    p = plan(stored(want, generation=7), want)
    assert p.in_sync
    assert p.generation == 7


# Each row: existing slices (device counts, generation), desired device counts, expected
# (generation, deleted index prefixes, updated indexes, created indexes).
GENERATION_TABLE = [
    pytest.param(
        (128, 10), 3, (128, 11), (3, [], [1], []), id="one slice changes: in place, same generation"
    ),
    pytest.param((128, 10), 3, (127, 11), (4, [], [0, 1], []), id="two slices change: bump, update all"),
    pytest.param((128, 10), 3, (128, 10, 5), (4, [], [0, 1], [2]), id="new slice: bump, update kept, create"),
    pytest.param(
        (128, 10, 5), 2, (128, 10), (3, ["00002"], [0, 1], []), id="slice gone: two counts change, bump"
    ),
    pytest.param((128, 10, 5), 2, (128,), (2, ["00001", "00002"], [0], []), id="shrink to one: in place"),
    pytest.param((4,), 9, (), (9, ["00000"], [], []), id="empty desired pool: delete all"),
]


@pytest.mark.parametrize(("existing_counts", "generation", "desired_counts", "expected"), GENERATION_TABLE)
def test_generation_table(
    existing_counts: tuple[int, ...],
    generation: int,
    desired_counts: tuple[int, ...],
    expected: tuple[int, list[str], list[int], list[int]],
) -> None:
    p = plan(stored(desired(*existing_counts), generation), desired(*desired_counts))
    assert summary(p) == expected
    for body in [w.body for w in p.updates] + [w.body for w in p.creates]:
        assert body["spec"]["pool"] == {
            "name": NODE,
            "generation": expected[0],
            "resourceSliceCount": len(desired_counts),
        }


def test_update_is_full_object_with_preconditions_kept() -> None:
    existing = stored(desired(128, 10), 3)
    p = plan(existing, desired(128, 11))
    (update,) = p.updates
    assert update.body["metadata"]["name"] == existing[1]["metadata"]["name"]
    assert update.body["metadata"]["resourceVersion"] == existing[1]["metadata"]["resourceVersion"]
    assert update.body["metadata"]["uid"] == existing[1]["metadata"]["uid"]
    assert len(update.body["spec"]["devices"]) == 11


def test_deletes_carry_uid_and_resource_version() -> None:
    existing = stored(desired(1, 1), 1)
    (delete,) = plan(existing, desired(1)).deletes
    assert (delete.uid, delete.resource_version) == ("uid-1", "101")


def test_older_generation_slices_are_obsolete() -> None:
    """A half-finished earlier publish: index 1 exists at generation 1 and 2; only 2 counts."""
    want = desired(3, 3)
    existing = stored(want, 2)
    stale = stored(want, 1)[1]
    stale["metadata"]["name"] = f"00001-{DRIVER}-{NODE}-stale"
    stale["metadata"]["uid"] = "uid-stale"
    p = plan([*existing, stale], want)
    assert [d.uid for d in p.deletes] == ["uid-stale"]
    assert p.updates == ()
    assert p.creates == ()


def test_duplicate_index_keeps_one() -> None:
    want = desired(3)
    existing = stored(want, 1)
    twin = copy.deepcopy(existing[0])
    twin["metadata"].update(name=f"00000-{DRIVER}-{NODE}-zzzzz", uid="uid-twin")
    p = plan([existing[0], twin], want)
    assert [d.uid for d in p.deletes] == ["uid-twin"]
    assert p.writes == 1


def test_old_naming_scheme_is_replaced() -> None:
    """1.34/1.35 helpers named slices <node>-<driver>-<random>: not matched, recreated."""
    want = desired(3)
    old = stored(want, 4)[0]
    old["metadata"]["name"] = f"{NODE}-{DRIVER}-x7k2p"
    assert summary(plan([old], want)) == (5, [f"{NODE}"[:5]], [], [0])


def test_slices_of_another_pool_are_deleted() -> None:
    want = desired(3)
    other = stored(want, 1)[0]
    other["spec"]["pool"]["name"] = "some-other-pool"
    other["metadata"]["uid"] = "uid-other"
    p = plan([*stored(want, 1), other], want)
    assert [d.uid for d in p.deletes] == ["uid-other"]
    assert p.writes == 1


def test_foreign_edit_is_reverted_in_place() -> None:
    want = desired(128, 10)
    existing = stored(want, 2)
    existing[1]["spec"]["devices"][0]["attributes"]["productName"] = {"string": "tampered"}
    assert summary(plan(existing, want)) == (2, [], [1], [])


def test_missing_owner_reference_counts_as_change() -> None:
    want = desired(3)
    existing = stored(want, 1)
    existing[0]["metadata"]["ownerReferences"] = []
    (update,) = plan(existing, want).updates
    assert update.body["metadata"]["ownerReferences"][0]["uid"] == UID


# -- semantic comparison --------------------------------------------------------------------------


def _capacity(value: str) -> Json:
    return {"devices": [{"name": "x", "capacity": {"m": {"value": value}}}]}


def _attribute(value: str) -> Json:
    return {"devices": [{"name": "x", "attributes": {"a": {"string": value}}}]}


def _counter(value: str) -> Json:
    return {"sharedCounters": [{"name": "c", "counters": {"m": {"value": value}}}]}


@pytest.mark.parametrize(
    ("a", "b", "equal"),
    [
        pytest.param(_capacity("1Gi"), _capacity("1024Mi"), True, id="quantities by value"),
        pytest.param(_capacity("1Gi"), _capacity("1G"), False, id="binary and decimal units differ"),
        pytest.param(_counter("2"), _counter("2000m"), True, id="counters are quantities"),
        pytest.param(_attribute("1Gi"), _attribute("1024Mi"), False, id="attribute strings are not"),
        pytest.param(
            {"devices": [{"name": "x", "attributes": {}}]}, {"devices": [{"name": "x"}]}, True, id="empty map"
        ),
        pytest.param(
            {"devices": [{"name": "x", "taints": None}]}, {"devices": [{"name": "x"}]}, True, id="null"
        ),
        pytest.param(
            {"devices": [{"name": "x"}, {"name": "y"}]},
            {"devices": [{"name": "y"}, {"name": "x"}]},
            False,
            id="order matters",
        ),
    ],
)
def test_contents_equal_is_semantic(a: Json, b: Json, equal: bool) -> None:
    assert contents_equal(a, b) is equal


def _taint(time_added: str | None = None) -> Json:
    taint = {"key": "k", "value": "v", "effect": "NoSchedule"}
    if time_added:
        taint["timeAdded"] = time_added
    return {"devices": [{"name": "x", "taints": [taint]}]}


def test_taint_time_added_by_server_matches_unset() -> None:
    assert contents_equal(_taint(), _taint("2026-01-01T00:00:00Z"))
    assert contents_equal(_taint("2026-01-01T00:00:00.4Z"), _taint("2026-01-01T00:00:00Z"))
    assert not contents_equal(_taint("2026-01-01T00:00:05Z"), _taint("2026-01-01T00:00:00Z"))


def test_republishing_keeps_taint_time_added() -> None:
    want = desired(2, 2, taint=True)
    existing = stored(want, 1)
    existing[1]["spec"]["devices"][0]["taints"][0]["timeAdded"] = "2026-01-01T00:00:00Z"
    want = desired(2, 3, taint=True)  # slice 1 gains a device
    (update,) = plan(existing, want).updates
    assert update.body["spec"]["devices"][0]["taints"][0]["timeAdded"] == "2026-01-01T00:00:00Z"
    assert "timeAdded" not in update.body["spec"]["devices"][2]["taints"][0]


# -- validation: the one pool validator the renderer's output goes through --------------------------


@pytest.mark.parametrize(
    ("mutate", "path", "message"),
    [
        (
            lambda s: s[1]["spec"]["devices"].append({"name": "gpu-0"}),
            "[1].spec.devices[3]",
            "device name 'gpu-0' repeats in pool 'node-a'",
        ),
        (lambda s: s[0]["spec"].update(driver="other.example.com"), "[0].spec.driver", "must be this driver"),
        (lambda s: s[0]["spec"].update(nodeName="node-b"), "[0].spec.nodeName", "must be this node 'node-a'"),
        (lambda s: s[0]["spec"]["pool"].update(name="x"), "[0].spec.pool.name", "must be the node name"),
        (lambda s: s[0]["spec"].update(allNodes=True), "[0].spec.allNodes", "must not be set"),
        (
            lambda s: s[0]["spec"]["devices"][0].update(
                consumesCounters=[{"counterSet": "nope", "counters": {"memory": {"value": "1"}}}]
            ),
            "[0].spec.devices[0].consumesCounters[0].counterSet",
            "counter set 'nope' is not in pool 'node-a'",
        ),
    ],
)
def test_invalid_desired_pool_is_refused_with_the_field(mutate: Any, path: str, message: str) -> None:
    want = desired(3, 3)
    assert validate_node_pool(want, driver=DRIVER, node=NODE) == []
    mutate(want)
    findings = validate_node_pool(want, driver=DRIVER, node=NODE)
    assert any(f.path == path and message in f.message for f in findings), findings


def test_counter_references_are_checked() -> None:
    devices = fake_devices(2, counters=True)
    want = desired_slices(devices, driver=DRIVER, node=NODE, counters=True)
    assert validate_node_pool(want, driver=DRIVER, node=NODE) == []
    assert summary(plan([], want)) == (1, [], [], [0, 1])
    want[1]["spec"]["devices"][0]["consumesCounters"][0]["counters"]["bogus"] = {"value": "1"}
    findings = validate_node_pool(want, driver=DRIVER, node=NODE)
    assert [f.message for f in findings] == ["counter 'bogus' is not in counter set 'gpu-counters'"]


# -- dropped fields -------------------------------------------------------------------------------


def test_dropped_fields_name_the_gates() -> None:
    devices = fake_devices(2, taint=True, counters=True)
    devices[0]["allowMultipleAllocations"] = True
    devices[1]["bindingConditions"] = ["ready"]
    devices[1]["bindingFailureConditions"] = ["failed"]
    want = {"devices": devices}
    got = copy.deepcopy(want)
    for device in got["devices"]:
        for field in ("taints", "consumesCounters", "allowMultipleAllocations", "bindingConditions"):
            device.pop(field, None)
        device.pop("bindingFailureConditions", None)
    assert dropped_gates(want, got) == [
        "DRAConsumableCapacity",
        "DRADeviceBindingConditions",
        "DRADeviceTaints",
        "DRAPartitionableDevices",
    ]
    counters = {"sharedCounters": [{"name": "c", "counters": {"m": {"value": "1"}}}]}
    assert dropped_gates(counters, {}) == ["DRAPartitionableDevices"]
    assert dropped_gates({"perDeviceNodeSelection": True}, {}) == ["DRAPartitionableDevices"]
    assert dropped_gates(want, want) == []
