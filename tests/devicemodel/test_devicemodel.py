"""The device model: names, attributes, value rules, capacities and partitionable counters."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from dradriver.backend.select import builtin_profile_names, open_backend
from dradriver.devicemodel import (
    PossibleMig,
    build_devices,
    counter_set_name,
    gpu_device_name,
    mig_device_name,
)
from dradriver.devicemodel import attributes as published
from dradriver.devicemodel.shares import SharePolicy
from dradriver.devicemodel.values import AttributeWriter, binary_quantity, decimal_quantity, truncate_utf8
from dradriver.discovery import Gpu, MigDevice, MigPlacement, NodeInventory
from dradriver.names import dns_label_error
from dradriver.quantity import parse_quantity

DRIVER = "gpu.dradriver.dev"


def _inventory(profile: str) -> NodeInventory:
    return open_backend(profile).discover()


def test_gpu_attributes_and_capacity_exactly() -> None:
    inventory = _inventory("dgx-h100")
    devices = build_devices(inventory, driver_name=DRIVER)
    gpu0 = devices.devices[0]
    assert gpu0.name == "gpu-0"
    assert gpu0.hardware == inventory.gpus[0]
    assert gpu0.json["attributes"] == {
        "type": {"string": "gpu"},
        "uuid": {"string": inventory.gpus[0].uuid},
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": "Hopper"},
        "cudaComputeCapability": {"version": "9.0.0"},
        "computeMajor": {"int": 9},
        "computeMinor": {"int": 0},
        "driverVersion": {"version": "570.124.6"},
        "cudaDriverVersion": {"version": "12.8.0"},
        "addressingMode": {"string": "None"},
        "minor": {"int": 0},
        "gpuModuleID": {"int": 1},
        "migCapable": {"bool": True},
        "migEnabled": {"bool": False},
        "resource.kubernetes.io/pciBusID": {"string": "0000:1b:00.0"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:1a"},
        "resource.kubernetes.io/numaNode": {"int": 0},
        "numaNode": {"int": 0},
    }
    # A MIG-capable GPU also shows its largest partition's engines.
    assert gpu0.json["capacity"] == {
        "memory": {"value": "81559Mi"},
        "multiprocessors": {"value": "132"},
        "copyEngines": {"value": "8"},
        "decoders": {"value": "7"},
        "encoders": {"value": "0"},
        "jpegEngines": {"value": "7"},
        "ofaEngines": {"value": "1"},
    }
    assert "consumesCounters" not in gpu0.json
    assert devices.warnings == ()


def test_gpu_without_mig_has_no_mig_enabled_attribute() -> None:
    device = build_devices(_inventory("t4x4"), driver_name=DRIVER).devices[0]
    assert device.json["attributes"]["migCapable"] == {"bool": False}
    assert "migEnabled" not in device.json["attributes"]
    # Unknown in this profile: left out, the standard one too.
    assert not {"numaNode", "resource.kubernetes.io/numaNode"} & device.json["attributes"].keys()
    assert device.json["capacity"] == {"memory": {"value": "15Gi"}}


def test_mig_devices_replace_their_mig_enabled_gpu() -> None:
    inventory = _inventory("dgx-a100-mig")
    devices = build_devices(inventory, driver_name=DRIVER)
    names = [d.name for d in devices.devices]
    assert names[:3] == ["gpu-0-mig-3g40gb-0", "gpu-0-mig-2g20gb-4", "gpu-0-mig-1g10gb-6"]
    assert "gpu-0" not in names
    assert names[-2:] == ["gpu-6", "gpu-7"]
    assert len(names) == 4 * 3 + 2 * 7 + 2
    mig = devices.get("gpu-0-mig-2g20gb-4")
    assert mig is not None
    assert isinstance(mig.hardware, MigDevice)
    assert (mig.hardware.parent_minor, mig.hardware.placement.start) == (0, 4)
    attrs = mig.json["attributes"]
    assert attrs["type"] == {"string": "mig"}
    assert attrs["profile"] == {"string": "2g.20gb"}
    assert attrs["parentUUID"] == {"string": inventory.gpus[0].uuid}
    assert attrs["uuid"] == {"string": mig.hardware.uuid}
    assert attrs["parentMinor"] == {"int": 0}
    assert (attrs["placementStart"], attrs["placementSize"]) == ({"int": 4}, {"int": 2})
    assert attrs["driverVersion"] == {"version": "535.104.5"}
    assert mig.json["capacity"]["memory"] == {"value": "19968Mi"}
    assert mig.json["capacity"]["multiprocessors"] == {"value": "28"}
    assert devices.get("gpu-99") is None


def test_names_are_dns_labels_and_stable_when_a_gpu_disappears() -> None:
    inventory = _inventory("dgx-a100-mig")
    before = {d.name: d.hardware for d in build_devices(inventory, driver_name=DRIVER).devices}
    assert all(dns_label_error(name) is None for name in before)
    without_gpu_2 = replace(inventory, gpus=tuple(g for g in inventory.gpus if g.minor != 2))
    after = {d.name: d.hardware for d in build_devices(without_gpu_2, driver_name=DRIVER).devices}
    assert set(after) == {name for name in before if not name.startswith("gpu-2-")}
    assert all(after[name] == before[name] for name in after)


def test_mig_naming_rule() -> None:
    assert gpu_device_name(7) == "gpu-7"
    assert mig_device_name(0, "1g.10gb", 6) == "gpu-0-mig-1g10gb-6"
    assert mig_device_name(3, "1g.10gb+me", 0) == "gpu-3-mig-1g10gbme-0"
    assert mig_device_name(3, "1c.3g.40gb", 4, 2) == "gpu-3-mig-1c3g40gb-4-c2"
    assert counter_set_name(5) == "gpu-5-counters"


def test_partitionable_never_offers_a_gpu_in_mig_mode_whole() -> None:
    inventory = _inventory("a100-mig-empty")
    devices = build_devices(inventory, driver_name=DRIVER, partitionable=True)
    assert devices.get("gpu-0") is None
    placements = [d for d in devices.devices if isinstance(d.hardware, PossibleMig)]
    assert len(placements) == sum(len(p.placements) for p in inventory.gpus[0].mig_profiles)
    assert all(d.name.startswith("gpu-0-mig-") and "uuid" not in d.json["attributes"] for d in placements)
    # A GPU with MIG off stays whole and consumes no counters: dradriver never changes MIG mode.
    gpu1 = devices.get("gpu-1")
    assert gpu1 is not None
    assert "consumesCounters" not in gpu1.json
    assert [c["name"] for c in devices.counter_sets] == [counter_set_name(0)]


def test_partitionable_publishes_operator_made_mig_devices_as_they_are() -> None:
    """dgx-a100-mig's MIG GPUs are full of operator-made devices: nothing is left to create there."""
    inventory = _inventory("dgx-a100-mig")
    partitioned = build_devices(inventory, driver_name=DRIVER, partitionable=True)
    static = build_devices(inventory, driver_name=DRIVER)
    assert [d.name for d in partitioned.devices] == [d.name for d in static.devices]
    assert partitioned.counter_sets == ()
    assert not any("consumesCounters" in d.json for d in partitioned.devices)


def test_instances_dradriver_created_stay_free_placements() -> None:
    """A MIG device made for a claim is published as the placement it came from, so the slices do
    not change when it is created or destroyed; the claim's allocation holds its counters."""
    empty = _inventory("a100-mig-empty")
    gpu0 = empty.gpus[0]
    three_g = next(p for p in gpu0.mig_profiles if p.name == "3g.40gb")
    created = MigDevice(
        uuid="MIG-created",
        parent_minor=0,
        parent_uuid=gpu0.uuid,
        gi_id=2,
        ci_id=0,
        profile="3g.40gb",
        gi_profile_id=three_g.profile_id,
        placement=MigPlacement(4, 4),
        compute_placement=MigPlacement(0, 3),
        full_gpu_instance=True,
        resources=three_g.resources,
        gi_caps_minor=None,
        ci_caps_minor=None,
    )
    with_device = replace(empty, gpus=(replace(gpu0, mig_devices=(created,)), *empty.gpus[1:]))
    before = build_devices(empty, driver_name=DRIVER, partitionable=True)
    ours = build_devices(with_device, driver_name=DRIVER, partitionable=True, created={(gpu0.uuid, 2)})
    assert [d.json for d in ours.devices] == [d.json for d in before.devices]
    assert ours.counter_sets == before.counter_sets
    # Not ours: an operator's device, published as it is, with the placements it overlaps gone.
    theirs = build_devices(with_device, driver_name=DRIVER, partitionable=True)
    assert isinstance(theirs.get("gpu-0-mig-3g40gb-4").hardware, MigDevice)  # type: ignore[union-attr]
    assert theirs.get("gpu-0-mig-1g10gb-5") is None


def test_mig_mode_without_mig_devices_warns_when_not_partitionable() -> None:
    devices = build_devices(_inventory("a100-mig-empty"), driver_name=DRIVER)
    assert [d.name for d in devices.devices] == ["gpu-1"]
    assert any("GPU 0: MIG mode is on but it has no MIG devices" in w for w in devices.warnings)


def test_value_rules_truncate_and_drop_with_warnings() -> None:
    out = AttributeWriter("gpu-0")
    out.string("productName", "NVIDIA " + "é" * 40)  # 7 + 80 bytes
    out.string("brand", "")
    out.version("driverVersion", "570.124.06")
    out.version("cudaDriverVersion", "12.8.1.4")
    out.version("odd", "v2")
    out.integer("huge", 2**63)
    published = out.attributes["productName"]["string"]
    assert len(published.encode()) <= 64
    assert published == "NVIDIA " + "é" * 28  # cut at a character boundary, never mid-character
    assert "brand" not in out.attributes
    assert out.attributes["driverVersion"] == {"version": "570.124.6"}
    assert "cudaDriverVersion" not in out.attributes
    assert out.attributes["odd"] == {"version": "2.0.0"}
    assert "huge" not in out.attributes
    assert len(out.warnings) == 3
    assert all(w.startswith("device gpu-0: attribute ") for w in out.warnings)


def test_truncate_utf8() -> None:
    assert truncate_utf8("abc") == "abc"
    assert truncate_utf8("a" * 70) == "a" * 64
    assert truncate_utf8("😀" * 17) == "😀" * 16
    assert truncate_utf8("\ud800x") == "?x"  # a lone surrogate cannot be sent as UTF-8


@pytest.mark.parametrize(
    ("count", "binary", "decimal"),
    [
        (0, "0", "0"),
        (14, "14", "14"),
        (1000, "1k", "1k"),
        (1024, "1Ki", "1024"),
        (1536, "1536", "1536"),
        (81559 * 2**20, "81559Mi", "85520809984"),
        (80 * 2**30, "80Gi", "85899345920"),
        (2**60, "1Ei", "1152921504606846976"),
        (2**63 - 1024, "9007199254740991Ki", "9223372036854774784"),
        (2**70, "1180591620717411303424", "1180591620717411303424"),  # a binary suffix would be capped
        (10**21, "1000E", "1000E"),
        (-(2**30), "-1Gi", "-1073741824"),
        (1100, "1100", "1100"),
        (120_000, "120k", "120k"),
    ],
)
def test_quantities_are_in_kubernetes_canonical_form(count: int, binary: str, decimal: str) -> None:
    assert binary_quantity(count) == binary
    assert decimal_quantity(count) == decimal
    assert parse_quantity(binary) == count
    assert parse_quantity(decimal) == count


def test_unpublishable_devices_are_left_out_with_a_warning() -> None:
    inventory = _inventory("t4x4")
    twin = replace(inventory.gpus[1], uuid="GPU-twin", minor=0)  # a second GPU claiming minor 0
    devices = build_devices(replace(inventory, gpus=(*inventory.gpus, twin)), driver_name=DRIVER)
    assert [d.name for d in devices.devices] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert devices.get("gpu-0").hardware.uuid != "GPU-twin"  # type: ignore[union-attr]
    assert devices.warnings == ("device 'gpu-0' left out: an earlier device has the same name",)


def test_odd_hardware_values_never_make_invalid_devices() -> None:
    gpu: Gpu = replace(
        _inventory("t4x4").gpus[0],
        product_name="x" * 100,
        architecture="",
        compute_capability=(7, 5),
    )
    inventory = NodeInventory(driver_version="R535 beta", cuda_driver_version="12.2", gpus=(gpu,))
    devices = build_devices(inventory, driver_name=DRIVER)
    attrs = devices.devices[0].json["attributes"]
    assert attrs["productName"] == {"string": "x" * 64}
    assert "architecture" not in attrs
    assert "driverVersion" not in attrs
    assert any("driverVersion" in w and "left out" in w for w in devices.warnings)


def test_invalid_driver_name_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"invalid driver name 'GPU\.Example\.com'"):
        build_devices(_inventory("t4x4"), driver_name="GPU.Example.com")


def test_the_published_attribute_table_is_what_the_device_model_writes() -> None:
    """devicemodel.attributes (what tools without devices rely on) equals what build_devices
    publishes over every built-in profile, both modes, plus GPUs with an addressing mode: one in
    MIG mode (its MIG devices carry it) and one not (offered whole)."""
    gpus = _inventory("dgx-h100-mig").gpus
    gh200 = replace(gpus[0], addressing_mode="ATS")
    assert not gpus[-1].mig_enabled
    whole = replace(gpus[-1], addressing_mode="ATS")
    inventories = [_inventory(p) for p in builtin_profile_names()]
    inventories.append(NodeInventory("580.65.06", "13.0", (gh200, whole)))
    seen: dict[tuple[str, str], set[str]] = {}
    capacities: dict[str, set[str]] = {}
    for inventory in inventories:
        for partitionable, shares in itertools.product((False, True), (None, SharePolicy("mps"))):
            built = build_devices(inventory, driver_name=DRIVER, partitionable=partitionable, shares=shares)
            for device in built.devices:
                attributes = device.json["attributes"]
                kind = attributes["type"]["string"]
                for name, value in attributes.items():
                    (value_type,) = value
                    seen.setdefault((name, value_type), set()).add(kind)
                for name in device.json.get("capacity", {}):
                    capacities.setdefault(name, set()).add(kind)
                missing = [
                    a.name
                    for a in published.ATTRIBUTES
                    if a.always and kind in a.devices and a.name not in attributes
                ]
                assert missing == [], f"{device.name} lacks {missing}"
    assert seen == {(a.name, a.type): set(a.devices) for a in published.ATTRIBUTES}
    assert capacities == {name: set(kinds) for name, kinds in published.CAPACITIES.items()}
