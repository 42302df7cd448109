"""What each claim costs: allocated and busy device-seconds per device it holds (pure).

Allocated time is derived from the claim's prepare time in the checkpoint, so it needs no state
of its own and carries on across a `serve` restart. Busy time is the device's SM utilisation
integrated over the readings, so its running totals are kept by whoever feeds the tracker (the
service persists them before they are served; counted only while `serve` reads the device).

A holder pays for its weight of the device: 1 for a whole device or a MIG device, a share's
dominant fraction (the larger of its memory and compute fractions: the scheduler sums both, so a
share blocks the GPU to that extent), 0 for administrative access (it consumes nothing).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from dradriver.devicemodel.shares import MIB
from dradriver.telemetry.model import Holder, Reading, Target


@dataclass(frozen=True)
class Cost:
    """The running totals of one holder on one device."""

    target: Target
    holder: Holder
    weight: float
    allocated_seconds: float
    busy_seconds: float


def weight(holder: Holder, target: Target) -> float:
    if holder.admin_access:
        return 0.0
    if holder.share is None:
        return 1.0
    compute = holder.share.thread_percentage / 100
    memory = holder.share.memory_mib * MIB / target.memory_bytes if target.memory_bytes else 0.0
    return min(max(compute, memory), 1.0)


def busy_ratio(reading: Reading, holder: Holder, share: float) -> float | None:
    """The holder's busy fraction of the device now (at most its weight); None where unknown.

    A share is busy as much as its pods' processes use the device where NVML lists them, else
    its weight of the device's utilisation; a whole device as much as the device is."""
    sample = reading.sample
    if sample is None or sample.sm_util_percent is None:
        return None
    if holder.share is not None and sample.processes is not None:
        mine = [s.sm_util_percent for s in reading.shares if s.pod in holder.pods]
        ratio = sum(v for v in mine if v is not None) / 100
    elif holder.share is not None:
        ratio = sample.sm_util_percent / 100 * share
    else:
        ratio = sample.sm_util_percent / 100
    return min(max(ratio, 0.0), share)


def key(holder: Holder, target: Target) -> str:
    """What a holder's busy total is kept under: `<claim UID>/<device>`."""
    return f"{holder.claim_uid}/{target.device}"


class CostTracker:
    """Feeds on readings; `update` returns each holder's totals and whether a busy total changed."""

    def __init__(self, busy: Mapping[str, float]) -> None:
        self.busy = dict(busy)
        self._last: float | None = None

    def update(self, taken_at: float, readings: Sequence[Reading]) -> tuple[list[Cost], bool]:
        previous, self._last = self._last, taken_at
        costs: list[Cost] = []
        changed = False
        for reading, holder in _held(readings):
            share = weight(holder, reading.target)
            if share == 0:
                continue
            name = key(holder, reading.target)
            ratio = busy_ratio(reading, holder, share)
            # The first reading of this process counts nothing: the time before it is unknown.
            since = taken_at if previous is None else max(previous, holder.prepared_at)
            if ratio and taken_at > since:
                self.busy[name] = self.busy.get(name, 0.0) + ratio * (taken_at - since)
                changed = True
            allocated = max(taken_at - holder.prepared_at, 0.0) * share
            costs.append(Cost(reading.target, holder, share, allocated, self.busy.get(name, 0.0)))
        held = {key(c.holder, c.target) for c in costs}
        for gone in set(self.busy) - held:
            del self.busy[gone]
            changed = True
        return costs, changed


def _held(readings: Iterable[Reading]) -> Iterable[tuple[Reading, Holder]]:
    for reading in readings:
        for holder in reading.holders:
            yield reading, holder
