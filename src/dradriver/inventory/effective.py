"""What to publish after a scan, given what was published and what prepared claims hold (pure).

A scan is authoritative for everything no claim holds: new devices appear, vanished ones go. A
device a prepared claim holds is never silently dropped: if its hardware vanished (a GPU gone,
an operator's MIG device destroyed behind our back, a GPU swapped for another under the same
minor) the
device as it was published stays published, and is reported gone (unhealthy, tainted) until its
claim is unprepared; only then does the scan's view of that name, if any, replace it.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass

from dradriver.devicemodel import DeviceSet, Hardware, PossibleMig, PublishedDevice
from dradriver.discovery import Gpu


@dataclass(frozen=True)
class LiveDevices:
    """The device set to publish and, for the devices kept although gone, what happened to them."""

    devices: DeviceSet
    gone: dict[str, str]


def identity(hardware: Hardware) -> tuple[str, ...]:
    """What must stay the same for a device name to still mean the same hardware."""
    if isinstance(hardware, PossibleMig):
        return ("placement", hardware.parent.uuid, hardware.profile.name, str(hardware.placement.start))
    return ("gpu" if isinstance(hardware, Gpu) else "mig", hardware.uuid)


def _vanished(before: PublishedDevice, now: PublishedDevice | None) -> str | None:
    """Why the hardware `before` stood for is not there any more, or None if it is."""
    if now is None or identity(now.hardware) != identity(before.hardware):
        what = "GPU" if isinstance(before.hardware, Gpu) else "MIG device"
        uuid = _uuid(before.hardware)
        return (
            f"{what} {uuid} is no longer on the node" if uuid else f"{before.name} is no longer on the node"
        )
    return None


def _uuid(hardware: Hardware) -> str:
    return "" if isinstance(hardware, PossibleMig) else hardware.uuid


def effective_devices(scanned: DeviceSet, published: LiveDevices, held: Set[str]) -> LiveDevices:
    """The devices to publish now (see the module docstring); `held`: names prepared claims hold."""
    kept: dict[str, PublishedDevice] = {}
    gone: dict[str, str] = {}
    for before in published.devices.devices:
        if before.name not in held:
            continue
        reason = _vanished(before, scanned.get(before.name))
        if reason is not None:
            kept[before.name] = before
            gone[before.name] = reason
    if not kept:
        return LiveDevices(scanned, {})
    devices = [kept.get(d.name, d) for d in scanned.devices] + [
        d for name, d in kept.items() if scanned.get(name) is None
    ]
    # Kept devices may consume counters of a GPU that went with them: keep those sets too.
    needed = {c["counterSet"] for d in kept.values() for c in d.json.get("consumesCounters") or []}
    have = {s["name"] for s in scanned.counter_sets}
    counter_sets = list(scanned.counter_sets) + [
        s for s in published.devices.counter_sets if s["name"] in needed - have
    ]
    return LiveDevices(
        DeviceSet(scanned.driver_name, tuple(devices), tuple(counter_sets), scanned.warnings), gone
    )
