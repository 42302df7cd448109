"""The fake backend's discovery: the inventory of the GPUs a profile describes.

It is a peer of the NVML backend behind the same interface, so everything above discovery
runs unchanged on a laptop or in CI. Identifiers the profile leaves out (UUIDs, PCI addresses)
are derived deterministically from the profile's name and the GPU minor, so repeated runs and
every node using the profile see the same devices.
"""

from __future__ import annotations

import uuid
from dataclasses import fields

from dradriver.backend.fake.profile import FakeProfile, GpuGroup, MigProfileSpec
from dradriver.discovery import Gpu, MigDevice, MigPlacement, MigProfile, MigResources, NodeInventory
from dradriver.discovery.nvidia_caps import driver_layout_minor

_UUID_NAMESPACE = uuid.UUID("6f1d3c1e-8f7a-4c53-9a55-2b1f0f0de7a1")


def _derived_uuid(prefix: str, *parts: object) -> str:
    return f"{prefix}-{uuid.uuid5(_UUID_NAMESPACE, '/'.join(map(str, parts)))}"


def _default_pci_bus_id(minor: int) -> str:
    return f"{minor // 255:04x}:{minor % 255 + 1:02x}:00.0"


def mig_profile(spec: MigProfileSpec) -> MigProfile:
    return MigProfile(
        name=spec.name,
        profile_id=spec.id,
        slice_count=spec.slice_count,
        instance_count=spec.instance_count,
        # The spec names the resources as MigResources does.
        resources=MigResources(**{f.name: getattr(spec, f.name) for f in fields(MigResources)}),
        placements=tuple(MigPlacement(start, spec.placement_size) for start in spec.placement_starts),
    )


def _gpu(group: GpuGroup, position: int, minor: int, index: int, seed: str) -> Gpu:
    gpu_uuid = group.uuids[position] if group.uuids else _derived_uuid("GPU", seed, minor)
    major, minor_cc = (int(part) for part in group.compute_capability.split("."))
    profiles = tuple(mig_profile(spec) for spec in group.mig.profile_table()) if group.mig else ()
    by_name = {profile.name: profile for profile in profiles}
    mig_devices: list[MigDevice] = []
    for device_position, device in enumerate(group.mig.devices if group.mig else ()):
        profile = by_name[device.profile]
        gi = device.gi if device.gi is not None else device_position + 1
        mig_devices.append(
            MigDevice(
                uuid=_derived_uuid("MIG", gpu_uuid, gi, 0),
                parent_minor=minor,
                parent_uuid=gpu_uuid,
                gi_id=gi,
                ci_id=0,
                profile=profile.name,
                gi_profile_id=profile.profile_id,
                placement=MigPlacement(device.start, profile.placements[0].size),
                compute_placement=MigPlacement(0, profile.slice_count),
                full_gpu_instance=True,
                resources=profile.resources,
                gi_caps_minor=driver_layout_minor(minor, gi),
                ci_caps_minor=driver_layout_minor(minor, gi, 0),
            )
        )
    return Gpu(
        index=index,
        minor=minor,
        uuid=gpu_uuid,
        product_name=group.product_name,
        brand=group.brand,
        architecture=group.architecture,
        compute_capability=(major, minor_cc),
        memory_bytes=group.memory_mib * 1024 * 1024,
        pci_bus_id=group.pci_bus_ids[position] if group.pci_bus_ids else _default_pci_bus_id(minor),
        pcie_root=group.pcie_roots[position] if group.pcie_roots else None,
        numa_node=group.numa_nodes[position] if group.numa_nodes else None,
        mig_capable=group.mig is not None,
        mig_enabled=bool(group.mig and group.mig.enabled),
        mig_profiles=profiles,
        mig_devices=tuple(sorted(mig_devices, key=lambda d: (d.placement.start, d.compute_placement.start))),
        addressing_mode=group.addressing_mode,
        module_id=group.module_ids[position] if group.module_ids else None,
    )


def inventory_from_profile(profile: FakeProfile, seed: str) -> NodeInventory:
    """Expand a profile into the inventory NVML would report for such a node.

    NVML enumerates GPUs in PCI order; the fake backend numbers them in minor order.
    """
    slots = sorted(
        (
            (group, position, minor)
            for group, minors in profile.expand_minors()
            for position, minor in enumerate(minors)
        ),
        key=lambda slot: slot[2],
    )
    return NodeInventory(
        driver_version=profile.driver_version,
        cuda_driver_version=profile.cuda_driver_version,
        gpus=tuple(
            _gpu(group, position, minor, index, seed) for index, (group, position, minor) in enumerate(slots)
        ),
        nvidia_caps_major=profile.nvidia_caps_major,
        nvidia_uvm_major=profile.nvidia_uvm_major,
    )
