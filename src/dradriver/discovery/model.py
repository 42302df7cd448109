"""What discovery found on a node: GPUs, their MIG devices and the MIG profiles they support.

Plain frozen data with no behaviour beyond lookups, shared by every backend (NVML, fake) and
read by the device model, prepare and CDI code. It carries every hardware fact those need
(minors for /dev/nvidia<minor>, nvidia-caps minors for MIG access nodes, PCI bus ids), so
that nothing downstream has to ask NVML again.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Character device major of /dev/nvidia<minor> and /dev/nvidiactl (fixed by the NVIDIA driver).
NVIDIA_CHAR_MAJOR = 195


@dataclass(frozen=True, slots=True)
class MigPlacement:
    """Where a GPU instance sits: its first memory slice and how many slices it spans."""

    start: int
    size: int


@dataclass(frozen=True, slots=True)
class MigResources:
    """The engines and memory of one MIG partition (a profile, or a concrete MIG device)."""

    memory_mib: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int


@dataclass(frozen=True, slots=True)
class MigProfile:
    """A GPU instance profile the GPU supports, as `nvidia-smi mig -lgip` lists it.

    `name` is NVML's name without the "MIG " prefix, e.g. "1g.10gb" or "1g.10gb+me";
    `profile_id` is NVML's profile id (19 for 1g.10gb on A100/H100), not the profile index.
    """

    name: str
    profile_id: int
    slice_count: int
    instance_count: int
    resources: MigResources
    placements: tuple[MigPlacement, ...]


@dataclass(frozen=True, slots=True)
class MigDevice:
    """A MIG device that exists now: one compute instance inside one GPU instance.

    `profile` is "<g>g.<mem>gb[+attrs]" when the compute instance spans its GPU instance, and
    "<c>c.<g>g.<mem>gb[+attrs]" when it uses only c of the GPU instance's g compute slices;
    `compute_placement` is the compute instance's place inside its GPU instance.
    The nvidia-caps minors name /dev/nvidia-caps/nvidia-cap<minor>, the access nodes a
    container needs besides /dev/nvidia<parent_minor>; None when the driver did not list them.
    """

    uuid: str
    parent_minor: int
    parent_uuid: str
    gi_id: int
    ci_id: int
    profile: str
    gi_profile_id: int
    placement: MigPlacement
    compute_placement: MigPlacement
    full_gpu_instance: bool
    resources: MigResources
    gi_caps_minor: int | None
    ci_caps_minor: int | None


@dataclass(frozen=True, slots=True)
class Gpu:
    """A physical GPU.

    `minor` (the N of /dev/nvidiaN) names the device because it stays put when a sibling GPU
    falls off the bus, unlike NVML's `index`, which is kept for diagnostics only.
    `pci_bus_id` is the lowercase extended BDF "0000:18:00.0".
    """

    index: int
    minor: int
    uuid: str
    product_name: str
    brand: str
    architecture: str
    compute_capability: tuple[int, int]
    memory_bytes: int
    pci_bus_id: str
    pcie_root: str | None
    numa_node: int | None
    mig_capable: bool
    mig_enabled: bool
    mig_profiles: tuple[MigProfile, ...] = ()
    mig_devices: tuple[MigDevice, ...] = ()
    #: Memory addressing mode on coherent platforms ("HMM", "ATS", "None"); None when NVML has none.
    addressing_mode: str | None = None
    #: The GPU's module (baseboard slot) id, None when NVML reports none.
    module_id: int | None = None


@dataclass(frozen=True, slots=True)
class SkippedDevice:
    """A device discovery could not read; it is left out and reported, never fatal."""

    index: int
    reason: str


@dataclass(frozen=True, slots=True)
class NodeInventory:
    """Everything discovery found on the node, GPUs ordered by minor.

    `driver_version` and `cuda_driver_version` are as the driver reports them ("570.124.06",
    "12.8"); the device model normalises them. `nvidia_caps_major` is the character major of
    /dev/nvidia-caps/* (dynamic, read from /proc/devices), None when MIG is not in use;
    `nvidia_uvm_major` likewise for /dev/nvidia-uvm (None when the UVM module is not loaded).
    """

    driver_version: str
    cuda_driver_version: str
    gpus: tuple[Gpu, ...]
    nvidia_caps_major: int | None = None
    nvidia_uvm_major: int | None = None
    skipped: tuple[SkippedDevice, ...] = ()
