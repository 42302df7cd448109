"""The device model: a node's inventory as `resource.k8s.io/v1` Devices (pure, no I/O).

`build_devices` decides what is published and how: which hardware becomes a device, its name,
its attributes and capacities, and (with `partitionable`) the shared counters that make MIG
placements and the full GPU exclude each other. Every published device keeps a reference to
the hardware it stands for, so prepare can map a device name from an allocation back to a GPU,
a MIG device, or a MIG placement still to be created.

Publishing rules:
- a GPU without MIG mode is one `gpu` device;
- a GPU with MIG mode enabled publishes its MIG devices; the full GPU is never offered (it
  cannot run work while MIG is on);
- with `partitionable`, a GPU with MIG mode enabled and a known profile table also publishes
  every MIG placement that is still free, each consuming its share of one counter set per GPU;
  MIG devices that exist (made by an operator) are published as they are and their share is
  taken out of the counter set, so nothing that overlaps them can be allocated. A GPU with MIG
  mode off stays one `gpu` device: dradriver never changes the MIG mode (it needs a GPU reset).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from dradriver.devicemodel.naming import counter_set_name, gpu_device_name, mig_device_name
from dradriver.devicemodel.shares import SharePolicy, share
from dradriver.devicemodel.values import AttributeWriter, binary_quantity, decimal_quantity
from dradriver.discovery.model import Gpu, MigDevice, MigPlacement, MigProfile, MigResources, NodeInventory
from dradriver.names import dns_label_error, driver_name_error

__all__ = [
    "DeviceSet",
    "GpuInstance",
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
#: The standard NUMA node (KEP-6072, GA in 1.37): what aligns a GPU with another driver's NIC or CPUs.
NUMA_NODE_ATTRIBUTE = "resource.kubernetes.io/numaNode"
#: Upstream ResourceSliceMaxCountersPerCounterSet (1.35+).
MAX_COUNTERS_PER_SET = 32


@dataclass(frozen=True, slots=True)
class PossibleMig:
    """A free MIG placement published with --partitionable: its MIG device is created on prepare."""

    parent: Gpu
    profile: MigProfile
    placement: MigPlacement


#: A GPU instance by its parent GPU's UUID and its GPU instance id.
GpuInstance = tuple[str, int]


#: What the device model publishes under a name: hardware, or a MIG placement (--partitionable).
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
    out.integer(NUMA_NODE_ATTRIBUTE, gpu.numa_node)
    out.integer("numaNode", gpu.numa_node)  # deprecated: the standard one above replaces it


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


def _counters(resources: MigResources, memory_bytes: int, memory_slices: Iterable[int]) -> dict[str, int]:
    """Counter amounts by name (dash-case DNS labels); zero counts are left out, they constrain nothing."""
    counts = {
        "memory": memory_bytes,
        "multiprocessors": resources.multiprocessors,
        "copy-engines": resources.copy_engines,
        "decoders": resources.decoders,
        "encoders": resources.encoders,
        "jpeg-engines": resources.jpeg_engines,
        "ofa-engines": resources.ofa_engines,
    }
    out = {name: count for name, count in counts.items() if count > 0}
    out.update({f"memory-slice-{index}": 1 for index in memory_slices})
    return out


def _counter_json(amounts: dict[str, int]) -> dict[str, dict[str, str]]:
    return {
        name: {"value": binary_quantity(count) if name == "memory" else decimal_quantity(count)}
        for name, count in amounts.items()
    }


def _slices(placement: MigPlacement) -> range:
    return range(placement.start, placement.start + placement.size)


def _static_instances(gpu: Gpu, created: Collection[GpuInstance]) -> dict[int, MigDevice] | None:
    """The GPU instances an operator made (one MIG device each stands for its instance), by id.

    None when one of them has a profile the GPU's table does not list: its resources are unknown.
    """
    known = {profile.profile_id for profile in gpu.mig_profiles}
    instances: dict[int, MigDevice] = {}
    for mig in gpu.mig_devices:
        if (gpu.uuid, mig.gi_id) in created:
            continue
        if mig.gi_profile_id not in known:
            return None
        instances.setdefault(mig.gi_id, mig)
    return instances


def _partitioned_gpu(
    gpu: Gpu, inventory: NodeInventory, created: Collection[GpuInstance]
) -> tuple[dict[str, Any] | None, list[tuple[dict[str, Any], Hardware]], list[str]] | None:
    """The GPU's counter set (None when no placement is left), its devices and warnings.

    Operator-made MIG devices are published as they are and use up their GPU instance's share
    of the counters for good; every placement that is still free is published consuming its
    share, so the scheduler can never allocate two placements (or a placement and an existing
    MIG device) that overlap. MIG devices dradriver created for claims count as free placements:
    the claim that holds one has the placement allocated, which consumes the same counters.
    None when the GPU cannot be described by one counter set.
    """
    largest = _largest_profile(gpu)
    slice_count = max(
        (p.start + p.size for profile in gpu.mig_profiles for p in profile.placements), default=0
    )
    static = _static_instances(gpu, created)
    if largest is None or slice_count == 0 or static is None:
        return None
    profiles = {profile.profile_id: profile for profile in gpu.mig_profiles}
    remaining = _counters(largest.resources, gpu.memory_bytes, range(slice_count))
    for instance in static.values():
        profile = profiles[instance.gi_profile_id]
        for name, used in _counters(profile.resources, _memory(profile), _slices(instance.placement)).items():
            remaining[name] = remaining.get(name, 0) - used
    remaining = {name: count for name, count in remaining.items() if count > 0}
    if len(remaining) > MAX_COUNTERS_PER_SET:
        return None

    warnings: list[str] = []
    devices: list[tuple[dict[str, Any], Hardware]] = []
    for mig in gpu.mig_devices:
        if (gpu.uuid, mig.gi_id) not in created:
            mig_json, more = _mig_device(mig, gpu, inventory)
            devices.append((mig_json, mig))
            warnings += more
    set_name = counter_set_name(gpu.minor)
    placements = 0
    for profile in gpu.mig_profiles:
        # Highest start first: small instances fill the top, keeping the low placements that only
        # the large profiles can use (4g, 7g start at 0) free for as long as possible.
        for placement in sorted(profile.placements, key=lambda p: -p.start):
            consumed = _counters(profile.resources, _memory(profile), _slices(placement))
            if any(remaining.get(name, 0) < amount for name, amount in consumed.items()):
                continue  # overlaps an existing MIG device, or could never fit beside them
            name = mig_device_name(gpu.minor, profile.name, placement.start)
            out = AttributeWriter(name)
            out.string("type", "mig")
            _mig_attributes(out, gpu, inventory, profile.name, placement)
            device = {
                "name": name,
                "attributes": out.attributes,
                "capacity": _resource_capacity(profile.resources),
                "consumesCounters": [{"counterSet": set_name, "counters": _counter_json(consumed)}],
            }
            devices.append((device, PossibleMig(gpu, profile, placement)))
            warnings += out.warnings
            placements += 1
    counter_set = {"name": set_name, "counters": _counter_json(remaining)} if placements else None
    return counter_set, devices, warnings


def _memory(profile: MigProfile) -> int:
    return profile.resources.memory_mib * 1024 * 1024


def build_devices(
    inventory: NodeInventory,
    *,
    driver_name: str,
    partitionable: bool = False,
    created: Collection[GpuInstance] = frozenset(),
    shares: SharePolicy | None = None,
) -> DeviceSet:
    """Every device the node publishes, GPUs in minor order, each GPU's MIG devices after it.

    `created` names the GPU instances dradriver created for claims (with --partitionable); they
    are published as the free placements they were made from. Devices whose name would not be
    a DNS label, or repeats an earlier name, are left out with a warning rather than making
    the whole slice invalid.
    """
    if (err := driver_name_error(driver_name)) is not None:
        raise ValueError(f"invalid driver name {driver_name!r}: {err}")
    candidates: list[tuple[dict[str, Any], Hardware]] = []
    counter_sets: list[dict[str, Any]] = []
    warnings: list[str] = []
    for gpu in sorted(inventory.gpus, key=lambda g: g.minor):
        partitioned = _partitioned_gpu(gpu, inventory, created) if partitionable and gpu.mig_enabled else None
        if partitioned is not None:
            counter_set, devices, more = partitioned
            if counter_set is not None:
                counter_sets.append(counter_set)
            candidates += devices
            warnings += more
            continue
        if partitionable and gpu.mig_enabled:
            warnings.append(
                f"GPU {gpu.minor}: cannot be partitioned (no MIG placements known, a MIG device of a profile "
                f"its table lacks, or more than {MAX_COUNTERS_PER_SET} counters needed); its MIG devices are "
                "published as they are"
            )
        if gpu.mig_enabled:
            if not gpu.mig_devices and not partitionable:
                warnings.append(
                    f"GPU {gpu.minor}: MIG mode is on but it has no MIG devices, so nothing is published for "
                    "it (create MIG devices, or run with --partitionable to create them on demand)"
                )
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
            published.append(PublishedDevice(name, share(device_json, hardware, shares), hardware))
    return DeviceSet(driver_name, tuple(published), tuple(counter_sets), tuple(warnings))
