"""One share of a shared GPU (consumable capacity) as prepare sees it: pure, no I/O.

The scheduler records what each share consumes (`consumedCapacity`); `share_limits` turns the
two capacities `devicemodel.shares` publishes into the MPS client limits of that share, and
`share_edits` into the container edits of its CDI device: the GPU's MPS pipe directory and the
client's own limits, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT and CUDA_MPS_ACTIVE_THREAD_PERCENTAGE.
The limit names device ordinal 0: a client sees the devices of the MPS server it connects to,
and each GPU has its own control daemon, so its GPU is the client's only one.

Checks made before anything is touched: a share carries both amounts, a claim holds at most one
share (a CUDA process connects to one MPS server), and no sharing config applies to a share (it
is MPS already).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from dradriver.devicemodel.shares import COMPUTE_CAPACITY, MEMORY_CAPACITY, MIB
from dradriver.prepare.cdi import ContainerEdits, Mount
from dradriver.prepare.sharing_settings import MPS_PIPE_IN_CONTAINER, PIPE_MOUNT_OPTIONS
from dradriver.quantity import Quantity, QuantityError

if TYPE_CHECKING:
    from dradriver.prepare.checkpoint import ClaimRecord, DeviceRecord, ShareRecord


class ShareError(ValueError):
    """A share that cannot be prepared as allocated; the message names the claim and device."""


@dataclass(frozen=True)
class ShareLimits:
    """What one share's MPS client is held to."""

    memory_mib: int
    thread_percentage: int


def share_limits(where: str, consumed: Mapping[str, str]) -> ShareLimits:
    """The limits of a share from its allocation result's consumedCapacity."""
    amounts: dict[str, Fraction] = {}
    for name in (MEMORY_CAPACITY, COMPUTE_CAPACITY):
        text = consumed.get(name)
        if text is None:
            raise ShareError(
                f"{where}: the allocation's consumedCapacity has no {name!r}: the device was not "
                "published by serve --gpu-shares"
            )
        try:
            amounts[name] = Quantity.parse(text).exact()
        except QuantityError as err:
            raise ShareError(f"{where}: consumedCapacity[{name}]: {err}") from None
    memory = int(amounts[MEMORY_CAPACITY] // MIB)
    percentage = int(amounts[COMPUTE_CAPACITY])
    if memory < 1 or not 1 <= percentage <= 100:
        raise ShareError(
            f"{where}: consumedCapacity memory {consumed[MEMORY_CAPACITY]} and {COMPUTE_CAPACITY} "
            f"{consumed[COMPUTE_CAPACITY]} cannot be MPS limits (at least 1Mi, 1..100)"
        )
    return ShareLimits(memory, percentage)


@dataclass(frozen=True)
class PlannedShare:
    """What the checks need of a planned device."""

    name: str
    share_id: str | None
    has_sharing_config: bool


def check_shares(claim: str, devices: Sequence[PlannedShare]) -> None:
    shares = [d for d in devices if d.share_id is not None]
    if len(shares) > 1:
        raise ShareError(
            f"claim {claim}: it was allocated {len(shares)} shares ({', '.join(d.name for d in shares)}); "
            "a claim can hold one share, as a CUDA process connects to one MPS server"
        )
    for device in shares:
        if device.has_sharing_config:
            raise ShareError(
                f"claim {claim}: a GpuConfig/MigDeviceConfig sharing setting applies to {device.name}, "
                "which is a share (already MPS, limited by what the claim requested); remove the setting"
            )


def share_edits(limits: ShareLimits, host_pipe: str) -> ContainerEdits:
    """The edits of a share's CDI device: the GPU's MPS pipe and the client's limits."""
    return ContainerEdits(
        env=(
            f"CUDA_MPS_PIPE_DIRECTORY={MPS_PIPE_IN_CONTAINER}",
            f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={limits.thread_percentage}",
            f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={limits.memory_mib}M",
        ),
        mounts=(Mount(host_pipe, MPS_PIPE_IN_CONTAINER, PIPE_MOUNT_OPTIONS),),
    )


UNENFORCED_ENV = "DRADRIVER_SHARE_UNENFORCED"


def unenforced_edits(limits: ShareLimits) -> ContainerEdits:
    """Under --gpu-shares unenforced: nothing holds the client; the container is told its amounts."""
    return ContainerEdits(
        env=(f"{UNENFORCED_ENV}=memory={limits.memory_mib}Mi,computePercent={limits.thread_percentage}",)
    )


def share_json(share: ShareRecord) -> dict[str, Any]:
    """A share's record as `status` and `top` show it."""
    return {
        "memory": f"{share.memory_mib}Mi",
        COMPUTE_CAPACITY: share.thread_percentage,
        "enforcement": "mps" if share.enforced else "unenforced",
    }


def sharing_label(device: DeviceRecord) -> str:
    """What a prepared device's sharing is: its claim-level setting, or the share it is."""
    if device.share is None or device.share_id is None:
        return device.sharing
    return describe_share(share_json(device.share), device.share_id)


def shares_by_enforcement(records: Iterable[ClaimRecord]) -> list[tuple[str, str]]:
    """(device, enforcement) of every prepared share, for the metrics."""
    return [
        (d.device, "mps" if d.share.enforced else "unenforced")
        for r in records
        for d in r.devices
        if d.share is not None
    ]


def describe_share(share: Mapping[str, Any], share_id: str) -> str:
    """One share in a table cell: `share 1a2b3c4d 20480Mi 25% mps`."""
    return f"share {share_id[:8]} {share['memory']} {share[COMPUTE_CAPACITY]}% {share['enforcement']}"
