"""Publishing GPUs as shareable devices (consumable capacity, KEP-5075): the policy and capacities.

With a share policy (`serve --gpu-shares`), each selected full GPU, and each MIG device made on
a selected GPU, is published once with `allowMultipleAllocations: true` and exactly two
capacities, the two amounts MPS can hold a client to:

- `memory`: the device's memory; a share's amount becomes its pinned device memory limit
  (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, whole MiB): validRange min 256Mi, step 1Mi;
- `computePercent`: 100; a share's amount becomes its active thread percentage
  (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE): validRange 1..100, step 1.

What a request does not ask for defaults to one `count`-th of the device (`--gpu-share-count`),
as NVIDIA's integer shares do; so the scheduler's sums never exceed what the limits add up to.
The other capacities of a full GPU (engine counts) are left out: MPS cannot divide them, and a
capacity without a request policy would be consumed whole by every share. A shared device is
never also published whole. MIG placements still to be made (--partitionable) stay whole.
Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from dradriver.devicemodel.values import binary_quantity, decimal_quantity
from dradriver.discovery.model import Gpu, MigDevice

#: The compute capacity of a shared device, in percent of its multiprocessors.
COMPUTE_CAPACITY = "computePercent"
MEMORY_CAPACITY = "memory"
MIB = 1024 * 1024
#: The smallest memory share: below it a CUDA context alone does not fit.
MEMORY_MINIMUM = 256 * MIB
DEFAULT_COUNT = 4

Enforcement = Literal["mps", "unenforced"]
ENFORCEMENTS: tuple[Enforcement, ...] = ("mps", "unenforced")


@dataclass(frozen=True)
class SharePolicy:
    """Which GPUs are shared, how their shares are enforced, and what a share gets by default.

    `gpus` names GPUs by minor or UUID (None: every GPU); a MIG device follows its parent.
    """

    enforcement: Enforcement
    gpus: frozenset[str] | None = None
    count: int = DEFAULT_COUNT

    def selects(self, minor: int, uuid: str) -> bool:
        return self.gpus is None or str(minor) in self.gpus or uuid in self.gpus

    @property
    def enforced(self) -> bool:
        return self.enforcement == "mps"


def parse_policy(text: str, count: int = DEFAULT_COUNT) -> SharePolicy:
    """`mps`, `unenforced`, or either with `:` and a comma-separated list of GPU minors or UUIDs."""
    word, colon, gpus = text.partition(":")
    enforcement = next((e for e in ENFORCEMENTS if e == word), None)
    if enforcement is None:
        raise ValueError(f"{word!r} is not one of {', '.join(ENFORCEMENTS)}")
    names = frozenset(g.strip() for g in gpus.split(",") if g.strip())
    if colon and not names:
        raise ValueError(f"{text!r} names no GPU after ':'")
    if not 1 <= count <= 100:
        raise ValueError(f"share count {count} is not 1..100")
    return SharePolicy(enforcement, names or None, count)


def _memory_policy(memory_bytes: int, count: int) -> dict[str, Any]:
    usable = max(MEMORY_MINIMUM, memory_bytes // MIB * MIB)
    default = max(MEMORY_MINIMUM, memory_bytes // count // MIB * MIB)
    return {
        "value": binary_quantity(usable),
        "requestPolicy": {
            "default": binary_quantity(min(default, usable)),
            "validRange": {"min": binary_quantity(MEMORY_MINIMUM), "step": binary_quantity(MIB)},
        },
    }


def shared_capacity(memory_bytes: int, count: int) -> dict[str, dict[str, Any]]:
    """The capacities of a shared device with `memory_bytes` of memory."""
    return {
        MEMORY_CAPACITY: _memory_policy(memory_bytes, count),
        COMPUTE_CAPACITY: {
            "value": "100",
            "requestPolicy": {
                "default": decimal_quantity(max(1, 100 // count)),
                "validRange": {"min": "1", "max": "100", "step": "1"},
            },
        },
    }


def memory_of(hardware: Gpu | MigDevice) -> int:
    if isinstance(hardware, Gpu):
        return hardware.memory_bytes
    return hardware.resources.memory_mib * MIB


def share(device: dict[str, Any], hardware: object, policy: SharePolicy | None) -> dict[str, Any]:
    """The device as published under `policy`: shareable when the policy selects its GPU."""
    if policy is None or device.get("consumesCounters"):
        return device
    if isinstance(hardware, Gpu) and not hardware.mig_enabled:
        selected = policy.selects(hardware.minor, hardware.uuid)
    elif isinstance(hardware, MigDevice):
        selected = policy.selects(hardware.parent_minor, hardware.parent_uuid)
    else:
        return device
    if not selected:
        return device
    return device | {
        "capacity": shared_capacity(memory_of(hardware), policy.count),
        "allowMultipleAllocations": True,
    }
