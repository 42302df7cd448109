"""What a GPU reading is, who holds each device, and how a reading is split between pods (pure).

A `DeviceSample` is one reading of one published device (a GPU or a MIG device); a field is None
where the backend cannot tell (NVML's NOT_SUPPORTED: MIG devices have no utilisation counters,
consumer GPUs no ECC). A `Holder` is the prepared claim that holds a device and the pods its
ResourceClaim reserves it for. `pod_shares` splits a device's reading per pod from the processes
on it, each mapped to its pod through its cgroup; what cannot be split stays a device figure.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from dradriver.devicemodel import PossibleMig, PublishedDevice
from dradriver.discovery import Gpu, MigDevice
from dradriver.plugin.driver import ClaimRef
from dradriver.prepare.checkpoint import ClaimRecord, ClaimState, ShareRecord
from dradriver.prepare.gpu_shares import sharing_label

#: NVML's clock event ("throttle") reason bits -> the names the metrics use.
THROTTLE_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}

# The pod UID in a cgroup path: systemd's `kubepods-besteffort-pod<uid with _>.slice` or
# cgroupfs' `/kubepods/besteffort/pod<uid>/<container>`.
_POD_IN_CGROUP = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")


@dataclass(frozen=True)
class ProcessSample:
    """A process using a device: its framebuffer memory and, where NVML keeps it, its SM share."""

    pid: int
    used_bytes: int | None = None
    sm_util_percent: float | None = None


@dataclass(frozen=True)
class DeviceSample:
    sm_util_percent: float | None = None
    memory_util_percent: float | None = None
    fb_used_bytes: int | None = None
    fb_total_bytes: int | None = None
    power_watts: float | None = None
    temperature_celsius: float | None = None
    sm_clock_hz: float | None = None
    memory_clock_hz: float | None = None
    #: Names of the active clock event reasons (THROTTLE_REASONS), None when unknown.
    throttle_reasons: frozenset[str] | None = None
    ecc_corrected: int | None = None
    ecc_uncorrected: int | None = None
    #: Per NVLink link: up or not; empty on a GPU without NVLink.
    nvlink_up: tuple[bool, ...] | None = None
    processes: tuple[ProcessSample, ...] | None = None


@dataclass(frozen=True)
class Target:
    """A published device to read: its name, its UUID and the UUID of the GPU it is on."""

    device: str
    uuid: str
    gpu_uuid: str
    kind: str  # "gpu" or "mig"
    #: Its memory as the device model knows it (what a fake backend reports as total).
    memory_bytes: int = 0


@dataclass(frozen=True)
class PodRef(ClaimRef):
    """A pod a claim is reserved for: namespace, name and UID, shown as `namespace/name`."""


@dataclass(frozen=True)
class Holder:
    """The prepared claim holding a device (a shared device: one holder per share)."""

    claim_namespace: str
    claim_name: str
    claim_uid: str
    pods: tuple[PodRef, ...] = ()
    sharing: str = ""
    #: When the claim was prepared (Unix seconds): where its allocated time starts.
    prepared_at: float = 0.0
    #: The share of the GPU it holds (consumable capacity); None: the whole device.
    share: ShareRecord | None = None
    #: Allocated for administrative access (monitoring): it consumes nothing.
    admin_access: bool = False

    @property
    def claim(self) -> str:
        return f"{self.claim_namespace}/{self.claim_name}"


@dataclass(frozen=True)
class PodShare:
    """One pod's part of a device's reading: what its processes use."""

    pod: PodRef
    used_bytes: int | None
    sm_util_percent: float | None
    processes: int


@dataclass
class Reading:
    """Everything a scrape reports for one device."""

    target: Target
    sample: DeviceSample | None
    holders: list[Holder] = field(default_factory=list)
    shares: list[PodShare] = field(default_factory=list)


def throttle_names(mask: int) -> frozenset[str]:
    return frozenset(name for bit, name in THROTTLE_REASONS.items() if mask & bit)


def pod_uid_of_cgroup(text: str) -> str | None:
    """The UID of the pod a process belongs to, from its /proc/<pid>/cgroup; None outside a pod."""
    match = _POD_IN_CGROUP.search(text)
    return match.group(1).replace("_", "-") if match else None


def targets(published: Iterable[PublishedDevice], records: Iterable[ClaimRecord]) -> list[Target]:
    """The devices to read: every published GPU and MIG device, and each MIG device made for a
    claim on a published placement (--partitionable), under the placement's name."""
    found: list[Target] = []
    placements: dict[str, PossibleMig] = {}
    for device in published:
        hardware = device.hardware
        if isinstance(hardware, Gpu):
            found.append(Target(device.name, hardware.uuid, hardware.uuid, "gpu", hardware.memory_bytes))
        elif isinstance(hardware, MigDevice):
            memory = hardware.resources.memory_mib * 1024 * 1024
            found.append(Target(device.name, hardware.uuid, hardware.parent_uuid, "mig", memory))
        else:
            placements[device.name] = hardware
    for record in records:
        for held in record.devices:
            placement = placements.get(held.device)
            if placement is not None and held.mig is not None and held.uuid:
                memory = placement.profile.resources.memory_mib * 1024 * 1024
                found.append(Target(held.device, held.uuid, placement.parent.uuid, "mig", memory))
    return found


def holders_by_device(
    records: Iterable[ClaimRecord], pods_of: Callable[[str], Sequence[PodRef]]
) -> dict[str, list[Holder]]:
    """Published device name -> the prepared claims holding it; `pods_of(uid)` names the pods a
    claim is reserved for (as its ResourceClaim said when last read)."""
    found: dict[str, list[Holder]] = {}
    for record in records:
        if record.state is not ClaimState.PREPARE_COMPLETED:
            continue
        pods = tuple(pods_of(record.uid))
        for device in record.devices:
            found.setdefault(device.device, []).append(
                Holder(
                    record.namespace,
                    record.name,
                    record.uid,
                    pods,
                    sharing_label(device),
                    record.prepared_at.timestamp(),
                    device.share if device.share_id is not None else None,
                    device.admin_access,
                )
            )
    return found


def pod_shares(
    sample: DeviceSample, holders: Sequence[Holder], pod_of_pid: Callable[[int], str | None]
) -> list[PodShare]:
    """The device's processes summed per pod of its holders (processes of no such pod are left
    out: they are not the claim's). Empty when NVML lists no processes."""
    pods = {pod.uid: pod for holder in holders for pod in holder.pods}
    totals: dict[str, list[float | int | None]] = {}
    counts: dict[str, int] = {}
    for process in sample.processes or ():
        uid = pod_of_pid(process.pid)
        if uid is None or uid not in pods:
            continue
        used, sm = totals.setdefault(uid, [None, None])
        if process.used_bytes is not None:
            used = (used or 0) + process.used_bytes
        if process.sm_util_percent is not None:
            sm = (sm or 0.0) + process.sm_util_percent
        totals[uid] = [used, sm]
        counts[uid] = counts.get(uid, 0) + 1
    return [
        PodShare(
            pods[uid],
            int(used) if used is not None else None,
            float(sm) if sm is not None else None,
            counts[uid],
        )
        for uid, (used, sm) in sorted(totals.items(), key=lambda item: str(pods[item[0]]))
    ]


def readings(
    targets: Sequence[Target],
    samples: Mapping[str, DeviceSample],
    holders: Mapping[str, Sequence[Holder]],
    pod_of_pid: Callable[[int], str | None],
) -> list[Reading]:
    """One reading per target (its sample None when it could not be read)."""
    result = []
    for target in targets:
        sample = samples.get(target.uuid)
        held = list(holders.get(target.device, ()))
        shares = pod_shares(sample, held, pod_of_pid) if sample is not None and held else []
        result.append(Reading(target, sample, held, shares))
    return result
