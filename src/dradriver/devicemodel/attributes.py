"""What the device model publishes, as a table: attribute and capacity names, types, device types.

`build_devices` writes the devices; this table says, without any device at hand, which names a
selector may look up (`dradriver migrate` checks translated selectors against it). A test keeps
the two equal over every built-in fake profile. Bare names live in the driver's domain;
qualified ones are the upstream standard attributes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

AttributeType = Literal["string", "int", "bool", "version"]
DeviceType = Literal["gpu", "mig"]
BOTH: frozenset[DeviceType] = frozenset({"gpu", "mig"})
GPU: frozenset[DeviceType] = frozenset({"gpu"})
MIG: frozenset[DeviceType] = frozenset({"mig"})


@dataclass(frozen=True)
class AttributeSpec:
    """One attribute: its name as published, its value type, and the device types that carry it.

    `always` is False for attributes published only when the hardware reports the fact.
    """

    name: str
    type: AttributeType
    devices: frozenset[DeviceType]
    always: bool = True


ATTRIBUTES: tuple[AttributeSpec, ...] = (
    AttributeSpec("type", "string", BOTH),
    AttributeSpec("uuid", "string", BOTH, always=False),  # not on a MIG placement not created yet
    AttributeSpec("parentUUID", "string", MIG),
    AttributeSpec("profile", "string", MIG),
    AttributeSpec("productName", "string", BOTH),
    AttributeSpec("brand", "string", BOTH),
    AttributeSpec("architecture", "string", BOTH),
    AttributeSpec("cudaComputeCapability", "version", BOTH),
    AttributeSpec("computeMajor", "int", BOTH),
    AttributeSpec("computeMinor", "int", BOTH),
    AttributeSpec("driverVersion", "version", BOTH),
    AttributeSpec("cudaDriverVersion", "version", BOTH),
    AttributeSpec("addressingMode", "string", BOTH, always=False),
    AttributeSpec("minor", "int", GPU),
    AttributeSpec("gpuModuleID", "int", GPU, always=False),
    AttributeSpec("migCapable", "bool", GPU),
    AttributeSpec("migEnabled", "bool", GPU, always=False),
    AttributeSpec("parentMinor", "int", MIG),
    AttributeSpec("placementStart", "int", MIG),
    AttributeSpec("placementSize", "int", MIG),
    AttributeSpec("resource.kubernetes.io/pciBusID", "string", BOTH),
    AttributeSpec("resource.kubernetes.io/pcieRoot", "string", BOTH, always=False),
    AttributeSpec("resource.kubernetes.io/numaNode", "int", BOTH, always=False),
    AttributeSpec("numaNode", "int", BOTH, always=False),  # deprecated for the standard one
)

#: Capacity names (quantities). The engine counts are on MIG devices and on MIG-capable GPUs.
CAPACITIES: dict[str, frozenset[DeviceType]] = {
    "memory": BOTH,
    "multiprocessors": BOTH,
    "copyEngines": BOTH,
    "decoders": BOTH,
    "encoders": BOTH,
    "jpegEngines": BOTH,
    "ofaEngines": BOTH,
    # Only on shared devices (serve --gpu-shares), in percent of the device's multiprocessors.
    "computePercent": BOTH,
}

BY_NAME: dict[str, AttributeSpec] = {a.name: a for a in ATTRIBUTES}
