"""The device model: names, attributes, value rules, capacities and partitionable counters."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dradriver.devicemodel import (
    PossibleMig,
    build_devices,
    counter_set_name,
    gpu_device_name,
    mig_device_name,
)
from dradriver.devicemodel import attributes as published
from dradriver.devicemodel.values import AttributeWriter, binary_quantity, decimal_quantity, truncate_utf8
from dradriver.discovery import Gpu, MigDevice, NodeInventory, builtin_profile_names, open_library
from dradriver.names import dns_label_error
from dradriver.quantity import parse_quantity

DRIVER = "gpu.dradriver.dev"


def _inventory(profile: str) -> NodeInventory:
    return open_library(profile).discover()


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
        "minor": {"int": 0},
        "migCapable": {"bool": True},
        "migEnabled": {"bool": False},
        "resource.kubernetes.io/pciBusID": {"string": "0000:1b:00.0"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:1a"},
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
    assert "numaNode" not in device.json["attributes"]  # unknown in this profile: left out
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


def test_partitionable_publishes_full_gpu_and_every_placement() -> None:
    inventory = _inventory("dgx-a100-mig")
    devices = build_devices(inventory, driver_name=DRIVER, partitionable=True)
    gpu0 = [d for d in devices.devices if d.name == "gpu-0" or d.name.startswith("gpu-0-")]
    profiles = inventory.gpus[0].mig_profiles
    assert len(gpu0) == 1 + sum(len(p.placements) for p in profiles)
    assert gpu0[0].name == "gpu-0"
    # MIG devices that exist keep their static name and are attached to their placement.
    existing = {
        d.name: d.hardware for d in gpu0 if isinstance(d.hardware, PossibleMig) and d.hardware.existing
    }
    assert set(existing) == {"gpu-0-mig-3g40gb-0", "gpu-0-mig-2g20gb-4", "gpu-0-mig-1g10gb-6"}
    assert devices.get("gpu-0-mig-7g80gb-0") is not None
    # GPUs with MIG off are not partitioned.
    assert "consumesCounters" not in devices.get("gpu-7").json  # type: ignore[union-attr]
    assert [c["name"] for c in devices.counter_sets] == [counter_set_name(m) for m in range(6)]


def test_partitionable_counters_make_overlapping_placements_exclusive() -> None:
    devices = build_devices(_inventory("dgx-a100-mig"), driver_name=DRIVER, partitionable=True)
    counters = devices.counter_sets[0]["counters"]
    assert counters["memory"] == {"value": "80Gi"}
    assert counters["multiprocessors"] == {"value": "98"}
    assert {f"memory-slice-{i}" for i in range(8)} <= set(counters)
    assert "encoders" not in counters  # zero on A100: constrains nothing

    def consumed(name: str) -> dict[str, dict[str, str]]:
        device = devices.get(name)
        assert device is not None
        [consumption] = device.json["consumesCounters"]
        assert consumption["counterSet"] == "gpu-0-counters"
        return dict(consumption["counters"])

    assert consumed("gpu-0") == counters
    three_g = consumed("gpu-0-mig-3g40gb-4")
    assert {k for k in three_g if k.startswith("memory-slice-")} == {f"memory-slice-{i}" for i in range(4, 8)}
    assert three_g["memory"] == {"value": "40192Mi"}

    def fits(names: list[str]) -> bool:
        total: dict[str, float] = {}
        for name in names:
            for counter, value in consumed(name).items():
                total[counter] = total.get(counter, 0) + float(parse_quantity(value["value"]) or 0)
        return all(total[c] <= float(parse_quantity(counters[c]["value"]) or 0) for c in total)

    assert fits(["gpu-0-mig-3g40gb-0", "gpu-0-mig-3g40gb-4"])
    assert fits([f"gpu-0-mig-1g10gb-{i}" for i in range(7)])
    assert not fits(["gpu-0", "gpu-0-mig-1g10gb-0"])
    assert not fits(["gpu-0-mig-4g40gb-0", "gpu-0-mig-2g20gb-2"])  # overlapping memory slices
    assert not fits(["gpu-0-mig-1g10gbme-0", "gpu-0-mig-1g10gbme-1"])  # one OFA engine


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
    publishes over every built-in profile, both modes, plus a MIG GPU with an addressing mode."""
    gh200 = replace(_inventory("dgx-h100-mig").gpus[0], addressing_mode="ATS")
    inventories = [_inventory(p) for p in builtin_profile_names()]
    inventories.append(NodeInventory("580.65.06", "13.0", (gh200,)))
    seen: dict[tuple[str, str], set[str]] = {}
    capacities: dict[str, set[str]] = {}
    for inventory in inventories:
        for partitionable in (False, True):
            for device in build_devices(inventory, driver_name=DRIVER, partitionable=partitionable).devices:
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
