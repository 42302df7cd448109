"""What is published after a scan (pure): scans win, except for hardware a prepared claim holds."""

from __future__ import annotations

import dataclasses

from dradriver.backend.fake.discovery import inventory_from_profile
from dradriver.backend.fake.profile import load_builtin_profile
from dradriver.devicemodel import DeviceSet, PossibleMig, build_devices
from dradriver.discovery import MigDevice, NodeInventory
from dradriver.health.board import Health
from dradriver.health.policy import HealthTracker, Problem
from dradriver.inventory import LiveDevices, effective_devices

DRIVER = "gpu.dradriver.dev"


def node(profile: str = "dgx-h100") -> NodeInventory:
    return inventory_from_profile(load_builtin_profile(profile), seed=profile)


def devices(inventory: NodeInventory, partitionable: bool = False) -> DeviceSet:
    return build_devices(inventory, driver_name=DRIVER, partitionable=partitionable)


def without_gpu(inventory: NodeInventory, minor: int) -> NodeInventory:
    return dataclasses.replace(inventory, gpus=tuple(g for g in inventory.gpus if g.minor != minor))


def names(published: LiveDevices) -> list[str]:
    return [d.name for d in published.devices.devices]


def test_idle_devices_follow_the_scan() -> None:
    full = devices(node())
    result = effective_devices(devices(without_gpu(node(), 3)), LiveDevices(full, {}), held=set())
    assert "gpu-3" not in names(result)
    assert result.gone == {}
    back = effective_devices(full, result, held=set())
    assert back == LiveDevices(full, {})


def test_a_held_device_whose_gpu_vanished_stays_published_as_it_was() -> None:
    full = devices(node())
    before = full.get("gpu-3")
    result = effective_devices(devices(without_gpu(node(), 3)), LiveDevices(full, {}), held={"gpu-3"})
    assert result.devices.get("gpu-3") == before
    assert result.gone == {"gpu-3": f"GPU {before.hardware.uuid} is no longer on the node"}  # type: ignore[union-attr]
    # Still gone at the next scan; back when the GPU returns; dropped once unheld.
    again = effective_devices(devices(without_gpu(node(), 3)), result, held={"gpu-3"})
    assert again == result
    assert effective_devices(full, result, held={"gpu-3"}) == LiveDevices(full, {})
    assert "gpu-3" not in names(effective_devices(devices(without_gpu(node(), 3)), result, held=set()))


def test_a_gpu_swapped_under_the_same_minor_is_a_vanished_gpu() -> None:
    inventory = node()
    swapped = dataclasses.replace(
        inventory,
        gpus=tuple(dataclasses.replace(g, uuid="GPU-swapped") if g.minor == 0 else g for g in inventory.gpus),
    )
    full = devices(inventory)
    result = effective_devices(devices(swapped), LiveDevices(full, {}), held={"gpu-0"})
    assert result.devices.get("gpu-0") == full.get("gpu-0")  # the one the claim has
    assert set(result.gone) == {"gpu-0"}


def test_a_held_mig_device_destroyed_behind_our_back_is_kept_and_gone() -> None:
    """An operator's MIG device a claim holds (published as itself, --partitionable or not)."""
    inventory = node("dgx-a100-mig")
    full = devices(inventory, partitionable=True)
    held = next(d for d in full.devices if isinstance(d.hardware, MigDevice))
    mig = held.hardware
    assert isinstance(mig, MigDevice)
    parent = mig.parent_minor
    destroyed = dataclasses.replace(
        inventory,
        gpus=tuple(
            dataclasses.replace(g, mig_devices=()) if g.minor == parent else g for g in inventory.gpus
        ),
    )
    result = effective_devices(devices(destroyed, partitionable=True), LiveDevices(full, {}), {held.name})
    assert result.devices.get(held.name) == held
    assert result.gone[held.name] == f"MIG device {mig.uuid} is no longer on the node"


def test_a_held_placement_whose_gpu_goes_keeps_its_counter_set() -> None:
    inventory = node("a100-mig-empty")
    full = devices(inventory, partitionable=True)
    held = next(d for d in full.devices if isinstance(d.hardware, PossibleMig))
    assert isinstance(held.hardware, PossibleMig)
    gone_gpu = without_gpu(inventory, held.hardware.parent.minor)
    result = effective_devices(devices(gone_gpu, partitionable=True), LiveDevices(full, {}), {held.name})
    assert result.devices.get(held.name) == held
    assert "is no longer on the node" in result.gone[held.name]
    counter_sets = {s["name"] for s in result.devices.counter_sets}
    assert {c["counterSet"] for c in held.json["consumesCounters"]} <= counter_sets


def test_pinned_problems_are_never_rechecked_and_clear_when_the_hardware_is_back() -> None:
    tracker = HealthTracker(quiet_period=1, recheck_interval=1)
    gone = Problem("device-gone", "GPU X is no longer on the node")
    (change,) = tracker.pin({"gpu-3": gone})
    assert (change.device, change.health, change.changed) == ("gpu-3", Health.UNHEALTHY, True)
    assert tracker.pin({"gpu-3": gone}) == []
    assert tracker.due(now=10_000) == []
    assert tracker.next_recheck() is None
    assert tracker.problems() == {"gpu-3": gone}
    (back,) = tracker.unpin(["gpu-3", "gpu-4"], wall=0)
    assert (back.device, back.health) == ("gpu-3", Health.HEALTHY)
    assert tracker.problems() == {}
