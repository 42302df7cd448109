"""The device model: a node's inventory as `resource.k8s.io/v1` Devices (pure, no I/O).

`build_devices` decides what is published and how: which hardware becomes a device, its name,
its attributes and capacities, and (with `partitionable`) the shared counters that make MIG
placements and the full GPU exclude each other. Every published device keeps a reference to
the hardware it stands for, so prepare can map a device name from an allocation back to a GPU,
a MIG device, or a MIG placement still to be created.

Publishing rules:
- a GPU without MIG mode is one `gpu` device;
- a GPU with MIG mode enabled publishes its MIG devices (the full GPU cannot run work while
  MIG is on, so it is not offered);
- with `partitionable`, a GPU with MIG mode enabled and a known profile table instead publishes
  the full GPU plus every possible MIG placement, all consuming one counter set per GPU
  (MIG devices that already exist are attached to their placement).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dradriver.devicemodel.naming import counter_set_name, gpu_device_name, mig_device_name
from dradriver.devicemodel.values import AttributeWriter, binary_quantity, decimal_quantity
from dradriver.discovery.model import Gpu, MigDevice, MigPlacement, MigProfile, MigResources, NodeInventory
from dradriver.names import dns_label_error, driver_name_error

__all__ = [
    "DeviceSet",
    "Hardware",
    "PossibleMig",
    "PublishedDevice",
    "build_devices",
    "counter_set_name",
    "gpu_device_name",
    "mig_device_name",
]

PCI_BUS_ID_ATTRIBUTE = "resource.kubernetes.io/pciBusID"
PCIE_ROOT_ATTRIBUTE = "resource.kubernetes.io/pcieRoot"
#: Upstream ResourceSliceMaxCountersPerCounterSet (1.35+).
MAX_COUNTERS_PER_SET = 32


@dataclass(frozen=True, slots=True)
class PossibleMig:
    """A MIG placement published with --partitionable; `existing` is set if the MIG device exists."""

    parent: Gpu
    profile: MigProfile
    placement: MigPlacement
    existing: MigDevice | None = None


Hardware = Gpu | MigDevice | PossibleMig


@dataclass(frozen=True, slots=True)
class PublishedDevice:
    """One published device: its name, its v1 Device JSON and the hardware behind it."""

    name: str
    json: dict[str, Any]
    hardware: Hardware


@dataclass(frozen=True)
class DeviceSet:
    """A node's devices in publishing order, plus counter sets and the warnings building them raised."""

    driver_name: str
    devices: tuple[PublishedDevice, ...]
    counter_sets: tuple[dict[str, Any], ...] = ()
    warnings: tuple[str, ...] = ()
    _by_name: dict[str, PublishedDevice] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {device.name: device for device in self.devices})

    def get(self, name: str) -> PublishedDevice | None:
        """The device published under `name` (what an allocation result names), if any."""
        return self._by_name.get(name)


def _resource_capacity(resources: MigResources) -> dict[str, dict[str, str]]:
    return {
        "memory": {"value": binary_quantity(resources.memory_mib * 1024 * 1024)},
        "multiprocessors": {"value": decimal_quantity(resources.multiprocessors)},
        "copyEngines": {"value": decimal_quantity(resources.copy_engines)},
        "decoders": {"value": decimal_quantity(resources.decoders)},
        "encoders": {"value": decimal_quantity(resources.encoders)},
        "jpegEngines": {"value": decimal_quantity(resources.jpeg_engines)},
        "ofaEngines": {"value": decimal_quantity(resources.ofa_engines)},
    }


def _largest_profile(gpu: Gpu) -> MigProfile | None:
    return max(gpu.mig_profiles, key=lambda p: (p.slice_count, p.resources.memory_mib), default=None)


def _common_attributes(out: AttributeWriter, gpu: Gpu, inventory: NodeInventory) -> None:
    """Facts a MIG device shares with its parent GPU."""
    major, minor = gpu.compute_capability
    out.string("productName", gpu.product_name)
    out.string("brand", gpu.brand)
    out.string("architecture", gpu.architecture)
    out.version("cudaComputeCapability", f"{major}.{minor}")
    out.integer("computeMajor", major)
    out.integer("computeMinor", minor)
    out.version("driverVersion", inventory.driver_version)
    out.version("cudaDriverVersion", inventory.cuda_driver_version)
    out.string("addressingMode", gpu.addressing_mode)


def _pci_attributes(out: AttributeWriter, gpu: Gpu) -> None:
    out.string(PCI_BUS_ID_ATTRIBUTE, gpu.pci_bus_id)
    out.string(PCIE_ROOT_ATTRIBUTE, gpu.pcie_root)
    out.integer("numaNode", gpu.numa_node)


def _gpu_device(gpu: Gpu, inventory: NodeInventory) -> tuple[dict[str, Any], list[str]]:
    name = gpu_device_name(gpu.minor)
    out = AttributeWriter(name)
    out.string("type", "gpu")
    out.string("uuid", gpu.uuid)
    _common_attributes(out, gpu, inventory)
    out.integer("minor", gpu.minor)
    out.integer("gpuModuleID", gpu.module_id)
    out.boolean("migCapable", gpu.mig_capable)
    if gpu.mig_capable:
        out.boolean("migEnabled", gpu.mig_enabled)
    _pci_attributes(out, gpu)
    largest = _largest_profile(gpu)
    capacity = _resource_capacity(largest.resources) if largest else {}
    capacity["memory"] = {"value": binary_quantity(gpu.memory_bytes)}
    return {"name": name, "attributes": out.attributes, "capacity": capacity}, out.warnings


def _mig_attributes(
    out: AttributeWriter, gpu: Gpu, inventory: NodeInventory, profile: str, placement: MigPlacement
) -> None:
    out.string("parentUUID", gpu.uuid)
    out.string("profile", profile)
    _common_attributes(out, gpu, inventory)
    out.integer("parentMinor", gpu.minor)
    out.integer("placementStart", placement.start)
    out.integer("placementSize", placement.size)
    _pci_attributes(out, gpu)


def _mig_device(mig: MigDevice, gpu: Gpu, inventory: NodeInventory) -> tuple[dict[str, Any], list[str]]:
    name = mig_device_name(
        gpu.minor,
        mig.profile,
        mig.placement.start,
        None if mig.full_gpu_instance else mig.compute_placement.start,
    )
    out = AttributeWriter(name)
    out.string("type", "mig")
    out.string("uuid", mig.uuid)
    _mig_attributes(out, gpu, inventory, mig.profile, mig.placement)
    return {
        "name": name,
        "attributes": out.attributes,
        "capacity": _resource_capacity(mig.resources),
    }, out.warnings


def _counters(resources: MigResources, memory_bytes: int, memory_slices: range) -> dict[str, dict[str, str]]:
    """Counter values (dash-case DNS labels); zero counts are left out, they constrain nothing."""
    counts = {
        "multiprocessors": resources.multiprocessors,
        "copy-engines": resources.copy_engines,
        "decoders": resources.decoders,
        "encoders": resources.encoders,
        "jpeg-engines": resources.jpeg_engines,
        "ofa-engines": resources.ofa_engines,
    }
    out = {"memory": {"value": binary_quantity(memory_bytes)}}
    out.update({name: {"value": decimal_quantity(count)} for name, count in counts.items() if count > 0})
    out.update({f"memory-slice-{index}": {"value": "1"} for index in memory_slices})
    return out


def _partitioned_gpu(
    gpu: Gpu, inventory: NodeInventory
) -> tuple[dict[str, Any], list[tuple[dict[str, Any], Hardware]], list[str]] | None:
    """The GPU's counter set, its devices (full GPU first, then placements) and warnings.

    None when the GPU's MIG profile table cannot be expressed in one counter set.
    """
    largest = _largest_profile(gpu)
    slice_count = max(
        (p.start + p.size for profile in gpu.mig_profiles for p in profile.placements), default=0
    )
    if largest is None or slice_count == 0:
        return None
    set_name = counter_set_name(gpu.minor)
    counter_set = {
        "name": set_name,
        "counters": _counters(largest.resources, gpu.memory_bytes, range(slice_count)),
    }
    if len(counter_set["counters"]) > MAX_COUNTERS_PER_SET:
        return None
    warnings: list[str] = []
    devices: list[tuple[dict[str, Any], Hardware]] = []

    gpu_json, gpu_warnings = _gpu_device(gpu, inventory)
    # The full GPU consumes every counter, so no partition can be allocated beside it.
    all_counters = _counters(largest.resources, gpu.memory_bytes, range(slice_count))
    gpu_json["consumesCounters"] = [{"counterSet": set_name, "counters": all_counters}]
    devices.append((gpu_json, gpu))
    warnings += gpu_warnings

    existing = {(m.profile, m.placement.start): m for m in gpu.mig_devices if m.full_gpu_instance}
    for mig in gpu.mig_devices:
        if not mig.full_gpu_instance:
            warnings.append(
                f"MIG device {mig.uuid} ({mig.profile}) on GPU {gpu.minor} uses part of its GPU instance "
                "and has no placement device in partitionable mode; not published"
            )
    for profile in gpu.mig_profiles:
        for placement in profile.placements:
            name = mig_device_name(gpu.minor, profile.name, placement.start)
            found = existing.get((profile.name, placement.start))
            out = AttributeWriter(name)
            out.string("type", "mig")
            out.string("uuid", found.uuid if found else None)
            _mig_attributes(out, gpu, inventory, profile.name, placement)
            memory_slices = range(placement.start, placement.start + placement.size)
            consumed = _counters(profile.resources, profile.resources.memory_mib * 1024 * 1024, memory_slices)
            device = {
                "name": name,
                "attributes": out.attributes,
                "capacity": _resource_capacity(profile.resources),
                "consumesCounters": [{"counterSet": set_name, "counters": consumed}],
            }
            devices.append((device, PossibleMig(gpu, profile, placement, found)))
            warnings += out.warnings
    return counter_set, devices, warnings


def build_devices(inventory: NodeInventory, *, driver_name: str, partitionable: bool = False) -> DeviceSet:
    """Every device the node publishes, GPUs in minor order, each GPU's MIG devices after it.

    Devices whose name would not be a DNS label, or repeats an earlier name, are left out
    with a warning rather than making the whole slice invalid.
    """
    if (err := driver_name_error(driver_name)) is not None:
        raise ValueError(f"invalid driver name {driver_name!r}: {err}")
    candidates: list[tuple[dict[str, Any], Hardware]] = []
    counter_sets: list[dict[str, Any]] = []
    warnings: list[str] = []
    for gpu in sorted(inventory.gpus, key=lambda g: g.minor):
        partitioned = _partitioned_gpu(gpu, inventory) if partitionable and gpu.mig_enabled else None
        if partitioned is not None:
            counter_set, devices, more = partitioned
            counter_sets.append(counter_set)
            candidates += devices
            warnings += more
            continue
        if partitionable and gpu.mig_enabled:
            warnings.append(
                f"GPU {gpu.minor}: cannot be partitioned (no MIG placements known, or more than "
                f"{MAX_COUNTERS_PER_SET} counters needed); its MIG devices are published as they are"
            )
        if gpu.mig_enabled:
            for mig in gpu.mig_devices:
                mig_json, more = _mig_device(mig, gpu, inventory)
                candidates.append((mig_json, mig))
                warnings += more
        else:
            gpu_json, more = _gpu_device(gpu, inventory)
            candidates.append((gpu_json, gpu))
            warnings += more

    published: list[PublishedDevice] = []
    seen: set[str] = set()
    for device_json, hardware in candidates:
        name = device_json["name"]
        if (err := dns_label_error(name)) is not None:
            warnings.append(f"device {name!r} left out: its name is not a DNS label: {err}")
        elif name in seen:
            warnings.append(f"device {name!r} left out: an earlier device has the same name")
        else:
            seen.add(name)
            published.append(PublishedDevice(name, device_json, hardware))
    return DeviceSet(driver_name, tuple(published), tuple(counter_sets), tuple(warnings))
