"""Which devices an event concerns (GPU vs MIG instance), and taints on the rendered slices."""

from __future__ import annotations

import copy
from pathlib import Path

from dradriver.backend.select import open_backend
from dradriver.devicemodel import DeviceSet, build_devices
from dradriver.health.events import HardwareRef
from dradriver.health.policy import Problem
from dradriver.health.taints import describe_taint, device_taint, with_taints
from dradriver.health.targets import HealthTargets
from dradriver.slices import render_slices, validate_slices

DRIVER = "gpu.dradriver.dev"


def device_set(profile: str, partitionable: bool = False) -> DeviceSet:
    return build_devices(open_backend(profile).discover(), driver_name=DRIVER, partitionable=partitionable)


def test_whole_gpu_event_concerns_every_device_on_it_and_mig_events_only_their_instance() -> None:
    devices = device_set("dgx-a100-mig")
    targets = HealthTargets(devices.devices)
    gpu0 = devices.devices[0].hardware.parent_uuid  # type: ignore[union-attr]
    assert len(targets.gpu_uuids) == 8
    assert targets.devices_for(HardwareRef(gpu0)) == (
        "gpu-0-mig-3g40gb-0",
        "gpu-0-mig-2g20gb-4",
        "gpu-0-mig-1g10gb-6",
    )
    assert targets.devices_for(HardwareRef(gpu0, 5, 0)) == ("gpu-0-mig-2g20gb-4",)
    assert targets.devices_for(HardwareRef(gpu0, 5)) == ("gpu-0-mig-2g20gb-4",)  # a GPU instance
    assert targets.devices_for(HardwareRef(gpu0, 5, 1)) == ()  # no such compute instance
    assert targets.devices_for(HardwareRef("GPU-unknown")) == ()
    assert targets.gpu_of("gpu-0-mig-1g10gb-6") == gpu0
    assert targets.locate("gpu-0-mig-2g20gb-4") == HardwareRef(gpu0, 5, 0)
    assert targets.locate("gpu-99") is None


def test_partitionable_gpu_event_concerns_the_gpu_and_all_placements() -> None:
    devices = device_set("mixed", partitionable=True)
    targets = HealthTargets(devices.devices)
    gpu3 = targets.gpu_of("gpu-3-mig-3g20gb-4")
    on_gpu3 = targets.devices_for(HardwareRef(gpu3))
    assert set(on_gpu3) == {d.name for d in devices.devices if d.name.startswith("gpu-3-")}
    assert "gpu-3-mig-1g5gb-3" in on_gpu3
    # An operator's MIG device sits at its instance; a free placement has no instance yet.
    assert targets.devices_for(HardwareRef(gpu3, 2, 0)) == ("gpu-3-mig-3g20gb-4",)
    assert targets.locate("gpu-3-mig-3g20gb-4") == HardwareRef(gpu3, 2, 0)
    assert targets.locate("gpu-3-mig-1g5gb-3") is None


def test_an_event_in_a_mig_device_made_on_demand_concerns_its_placement() -> None:
    devices = device_set("a100-mig-empty", partitionable=True)
    made: dict[tuple[str, int], str] = {}
    targets = HealthTargets(devices.devices, created=lambda: made)
    gpu0 = targets.gpu_of("gpu-0-mig-3g40gb-4")
    assert targets.devices_for(HardwareRef(gpu0, 2, 0)) == ()
    assert targets.locate("gpu-0-mig-3g40gb-4") is None
    made[(gpu0, 2)] = "gpu-0-mig-3g40gb-4"  # prepare made GPU instance 2 there
    assert targets.devices_for(HardwareRef(gpu0, 2, 0)) == ("gpu-0-mig-3g40gb-4",)
    assert targets.devices_for(HardwareRef(gpu0, 3)) == ()
    assert targets.locate("gpu-0-mig-3g40gb-4") == HardwareRef(gpu0, 2)
    assert "gpu-0-mig-3g40gb-4" in targets.devices_for(HardwareRef(gpu0))


def test_mixed_node() -> None:
    targets = HealthTargets(device_set("mixed").devices)
    assert targets.devices_on(targets.gpu_of("gpu-3-mig-1g5gb-2")) == (
        "gpu-3-mig-2g10gb-0",
        "gpu-3-mig-1g5gb-2",
        "gpu-3-mig-3g20gb-4",
    )
    assert targets.devices_on(targets.gpu_of("gpu-1")) == ("gpu-1",)


def test_taints_apply_without_touching_the_device_set() -> None:
    devices = device_set("dgx-h100")
    before = copy.deepcopy([d.json for d in devices.devices])
    taint = device_taint(DRIVER, Problem("79", "XID 79"), "NoSchedule")
    assert taint == {"key": "gpu.dradriver.dev/unhealthy", "value": "79", "effect": "NoSchedule"}
    assert describe_taint(taint) == "gpu.dradriver.dev/unhealthy=79:NoSchedule"
    tainted = with_taints(devices, {"gpu-3": taint})
    assert [d.json.get("taints") for d in tainted.devices] == [None] * 3 + [[taint]] + [None] * 4
    assert tainted.get("gpu-3") is tainted.devices[3]
    assert [d.json for d in devices.devices] == before
    assert with_taints(devices, {}) is devices


def test_tainted_slices_are_valid_and_split_at_64_devices(tmp_path: Path) -> None:
    profile = tmp_path / "big.yaml"
    profile.write_text(
        "driverVersion: 550.54.15\ncudaDriverVersion: '12.4'\ngpus:\n"
        "  - {productName: Tesla T4, count: 100, architecture: Turing, computeCapability: '7.5',\n"
        "     memoryMiB: 15360}\n"
    )
    devices = device_set(str(profile))
    taint = device_taint(DRIVER, Problem("gpu-lost", "lost"), "NoExecute")
    plain = render_slices(devices, node_name="node-1", driver_name=DRIVER)
    tainted = render_slices(with_taints(devices, {"gpu-7": taint}), node_name="node-1", driver_name=DRIVER)
    assert [len(s["spec"]["devices"]) for s in plain] == [100]
    assert [len(s["spec"]["devices"]) for s in tainted] == [64, 36]
    assert validate_slices(tainted) == []
    assert tainted[0]["spec"]["devices"][7]["taints"] == [taint]
