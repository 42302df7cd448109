"""Which published devices an event on some hardware concerns (pure).

An event on a whole GPU concerns every device published on it (the GPU itself, its MIG
devices, its MIG placements); an event NVML attributes to one GPU instance or one compute
instance concerns only the MIG devices there, so a fault inside one MIG slice leaves its
neighbours in service. That includes MIG devices made on demand (--partitionable): `created`
says which placement each GPU instance dradriver made sits at, as prepare keeps it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from dradriver.devicemodel import PublishedDevice
from dradriver.discovery.model import Gpu, MigDevice
from dradriver.health.events import HardwareRef


@dataclass(frozen=True)
class _Placed:
    name: str
    #: Where the device sits; instance ids are None for a GPU and for a MIG placement not created yet.
    where: HardwareRef
    #: A MIG placement without a MIG device: no instance exists that an event could name.
    uncreated: bool = False


def _placed(device: PublishedDevice) -> _Placed:
    hardware = device.hardware
    if isinstance(hardware, Gpu):
        return _Placed(device.name, HardwareRef(hardware.uuid))
    if isinstance(hardware, MigDevice):
        return _Placed(device.name, _mig_ref(hardware))
    return _Placed(device.name, HardwareRef(hardware.parent.uuid), uncreated=True)


def _mig_ref(mig: MigDevice) -> HardwareRef:
    return HardwareRef(mig.parent_uuid, mig.gi_id, mig.ci_id)


#: (GPU UUID, GPU instance id) -> the published placement of a MIG device made on demand.
CreatedInstances = Callable[[], Mapping[tuple[str, int], str]]


class _Index:
    def __init__(self, devices: Iterable[PublishedDevice]) -> None:
        self.devices = tuple(_placed(d) for d in devices)
        self.by_name = {d.name: d for d in self.devices}
        self.gpu_uuids = tuple(dict.fromkeys(d.where.gpu_uuid for d in self.devices))


class HealthTargets:
    """The node's published devices, indexed by the hardware under them.

    `update` swaps in a new device list (live inventory) in one step, for every reader at once;
    `created` is read at each lookup (the ledger's): MIG devices come and go.
    """

    def __init__(self, devices: Iterable[PublishedDevice], created: CreatedInstances = dict) -> None:
        self._created = created
        self._index = _Index(devices)

    def update(self, devices: Iterable[PublishedDevice]) -> None:
        self._index = _Index(devices)

    @property
    def _devices(self) -> tuple[_Placed, ...]:
        return self._index.devices

    @property
    def _by_name(self) -> dict[str, _Placed]:
        return self._index.by_name

    @property
    def gpu_uuids(self) -> tuple[str, ...]:
        return self._index.gpu_uuids

    @property
    def device_names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self._devices)

    def devices_for(self, where: HardwareRef) -> tuple[str, ...]:
        """The devices an event at `where` concerns, in publishing order (empty if none)."""
        made = None
        if where.gpu_instance is not None:
            made = self._created().get((where.gpu_uuid, where.gpu_instance))
        return tuple(d.name for d in self._devices if _concerns(where, d) or (d.uncreated and d.name == made))

    def devices_on(self, gpu_uuid: str) -> tuple[str, ...]:
        return self.devices_for(HardwareRef(gpu_uuid))

    def gpu_of(self, device_name: str) -> str:
        """The UUID of the physical GPU a published device lives on."""
        return self._by_name[device_name].where.gpu_uuid

    def locate(self, device_name: str) -> HardwareRef | None:
        """Where a published device sits, as a source would name it in an event.

        None for an unknown name and for a MIG placement whose MIG device does not exist.
        """
        placed = self._by_name.get(device_name)
        if placed is None or not placed.uncreated:
            return placed.where if placed is not None else None
        made = [key for key, name in self._created().items() if name == device_name]
        return HardwareRef(made[0][0], made[0][1]) if made else None


def _concerns(event: HardwareRef, device: _Placed) -> bool:
    if event.gpu_uuid != device.where.gpu_uuid:
        return False
    if event.gpu_instance is None:
        return True
    if device.where.gpu_instance != event.gpu_instance:
        return False
    return event.compute_instance is None or device.where.compute_instance == event.compute_instance
