"""NVIDIA's names, and what each becomes with dradriver: the one table `migrate` and docs/tools.md use.

Read from NVIDIA's GPU DRA driver (kubernetes-sigs/dra-driver-nvidia-gpu, formerly
NVIDIA/k8s-dra-driver-gpu) at main 95932046 (2026-08-07): `cmd/gpu-kubelet-plugin/deviceinfo.go`
and `mig.go` (attributes and capacities), the Helm chart's DeviceClasses, and
`api/nvidia.com/resource/v1beta1` (opaque config). Attributes it published up to v25.8 and then
removed (`index`, `minor`, `pcieBusID`, `parentIndex`) are listed too: older manifests use them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dradriver.devicemodel.attributes import AttributeType, DeviceType

DRIVER = "gpu.nvidia.com"
COMPUTE_DOMAIN_DRIVER = "compute-domain.nvidia.com"
STANDARD_DOMAIN = "resource.kubernetes.io"
CONFIG_API_VERSION = "resource.nvidia.com/v1beta1"
#: Classic DRA (Kubernetes <= 1.30) claim parameters.
CLASSIC_PARAMETERS_GROUP = "gpu.resource.nvidia.com"

#: NVIDIA's DeviceClasses -> the device type our class of the same purpose selects.
CLASSES: dict[str, DeviceType] = {"gpu.nvidia.com": "gpu", "mig.nvidia.com": "mig"}
COMPUTE_DOMAINS = "ComputeDomains (multi-node NVLink/IMEX) have no equivalent in dradriver"
VFIO = "VFIO passthrough has no equivalent in dradriver (GPUs are used through CDI)"
#: NVIDIA's DeviceClasses with no dradriver equivalent, and why.
UNSUPPORTED_CLASSES = {
    "vfio.gpu.nvidia.com": VFIO,
    "compute-domain-daemon.nvidia.com": COMPUTE_DOMAINS,
    "compute-domain-default-channel.nvidia.com": COMPUTE_DOMAINS,
}

#: NVIDIA's health taint keys (KEP-5055) -> how a toleration of them is written for dradriver,
#: whose one taint key is `<driver>/unhealthy` with the reason as value (an XID number, gpu-lost).
TAINT_XID = "gpu.nvidia.com/xid"
TAINT_GPU_LOST = "gpu.nvidia.com/gpu-lost"
TAINT_UNMONITORED = "gpu.nvidia.com/unmonitored"


@dataclass(frozen=True)
class Attribute:
    """An attribute NVIDIA's driver publishes, and its dradriver equivalent.

    `name` is bare (NVIDIA's domain) or qualified (`resource.kubernetes.io/...`). `ours` is the
    name dradriver publishes it under (bare: our domain), None when there is no equivalent, with
    `note` saying why; a mapping that changes the name says what differs in `note`.
    """

    name: str
    type: AttributeType
    devices: frozenset[DeviceType]
    ours: str | None
    note: str = ""
    legacy: bool = False

    @property
    def renamed(self) -> bool:
        return self.ours is not None and self.ours != self.name


_BOTH: frozenset[DeviceType] = frozenset({"gpu", "mig"})
_GPU: frozenset[DeviceType] = frozenset({"gpu"})
_MIG: frozenset[DeviceType] = frozenset({"mig"})
_FABRIC = (
    "a Fabric Manager partition id (NVIDIA's FabricManagerPartitioning gate); dradriver does not manage them"
)

ATTRIBUTES: tuple[Attribute, ...] = (
    Attribute("type", "string", _BOTH, "type", "`gpu` or `mig`; NVIDIA's `vfio` has no equivalent"),
    Attribute("uuid", "string", _BOTH, "uuid"),
    Attribute("parentUUID", "string", _MIG, "parentUUID"),
    Attribute("profile", "string", _MIG, "profile"),
    Attribute("productName", "string", _BOTH, "productName"),
    Attribute("brand", "string", _BOTH, "brand"),
    Attribute("architecture", "string", _BOTH, "architecture"),
    Attribute("cudaComputeCapability", "version", _BOTH, "cudaComputeCapability"),
    Attribute("driverVersion", "version", _BOTH, "driverVersion"),
    Attribute("cudaDriverVersion", "version", _BOTH, "cudaDriverVersion"),
    Attribute("addressingMode", "string", _BOTH, "addressingMode"),
    Attribute("resource.kubernetes.io/pciBusID", "string", _BOTH, "resource.kubernetes.io/pciBusID"),
    Attribute("resource.kubernetes.io/pcieRoot", "string", _BOTH, "resource.kubernetes.io/pcieRoot"),
    Attribute("resource.kubernetes.io/numaNode", "int", _BOTH, "resource.kubernetes.io/numaNode"),
    Attribute("gpuModuleID", "int", _GPU, "gpuModuleID"),
    Attribute("partition1", "int", _GPU, None, _FABRIC),
    Attribute("partition2", "int", _GPU, None, _FABRIC),
    Attribute("partition4", "int", _GPU, None, _FABRIC),
    Attribute("partition8", "int", _GPU, None, _FABRIC),
    Attribute("deviceID", "string", _GPU, None, "VFIO devices only: no equivalent"),
    Attribute("vendorID", "string", _GPU, None, "VFIO devices only: no equivalent"),
    Attribute("iommuFDEnabled", "bool", _GPU, None, "VFIO devices only: no equivalent"),
    # Published up to v25.8 (NVIDIA/k8s-dra-driver-gpu), removed since.
    Attribute(
        "index",
        "int",
        _GPU,
        "minor",
        "NVIDIA's NVML index (removed after v25.8: it shifts when a GPU drops off the bus); "
        "dradriver's minor is the stable N of /dev/nvidiaN, the same number on most nodes",
        legacy=True,
    ),
    Attribute("minor", "int", _GPU, "minor", legacy=True),
    Attribute(
        "pcieBusID", "string", _BOTH, "resource.kubernetes.io/pciBusID", "the standard name", legacy=True
    ),
    Attribute(
        "parentIndex",
        "int",
        _MIG,
        "parentMinor",
        "the parent's NVML index (removed after v25.8); dradriver's parentMinor is its stable minor",
        legacy=True,
    ),
)

#: A MIG device's `index` (its position on the parent, up to v25.8) has no stable equivalent.
MIG_INDEX_NOTE = (
    "a MIG device's NVML index (published up to v25.8) has no equivalent; select on profile or placementStart"
)

BY_NAME: dict[str, Attribute] = {a.name: a for a in ATTRIBUTES}

#: Capacities with the same name in dradriver (quantities).
CAPACITIES = ("memory", "multiprocessors", "copyEngines", "decoders", "encoders", "jpegEngines", "ofaEngines")
MEMORY_SLICE = re.compile(r"memorySlice\d+")
UNSUPPORTED_CAPACITIES = {
    "memorySlice": "dradriver publishes a MIG device's memory slices as the attributes placementStart and "
    "placementSize, not as capacities",
    "shares": "consumable shares (NVIDIA's --consumable-shares N) have no capacity to select on in "
    "dradriver: its shared GPUs have memory and computePercent",
    "addressableMemory": "VFIO devices only: no equivalent",
}


#: NVIDIA's consumable shares (its --consumable-shares flag) in dradriver (serve --gpu-shares).
SHARE_MEMORY_NOTE = (
    "a share of the GPU's memory where dradriver serve runs with --gpu-shares (NVIDIA's --consumable-shares "
    "memory), MPS holding the share to it; elsewhere a whole GPU with at least that much memory"
)
ONE_SHARE_NOTE = (
    "one of N integer shares is what a dradriver share gets by default: 1/N of the GPU's memory and "
    "compute (serve --gpu-shares mps --gpu-share-count N, N as NVIDIA's --consumable-shares N)"
)
MANY_SHARES_PROBLEM = (
    "{amount} integer shares have no exact equivalent: a dradriver share names its amounts; ask "
    "capacity.requests memory and computePercent (a share asking nothing gets 1/N of the GPU)"
)


def attribute(name: str) -> Attribute | None:
    return BY_NAME.get(name)
