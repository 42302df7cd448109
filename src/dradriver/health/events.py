"""What health sources report, and the interface every source (NVML, fake GPUs) implements.

Sources speak hardware (GPU UUIDs, MIG instance ids), never published device names: which
devices an event concerns is decided once, in `targets`, for every source alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from dradriver.health.config import Thresholds


@dataclass(frozen=True)
class HardwareRef:
    """A GPU, a GPU instance in it, or one compute instance (a MIG device) in that.

    The instance ids are NVML's; None means "the whole" (NVML reports 0xFFFFFFFF).
    """

    gpu_uuid: str
    gpu_instance: int | None = None
    compute_instance: int | None = None


@dataclass(frozen=True)
class XidEvent:
    where: HardwareRef
    xid: int
    #: Unix seconds.
    at: float
    #: NVML's recovery action for the GPU right after the XID (`recovery.RecoveryAction`, or a
    #: newer number); None where the host driver does not report one.
    recovery: int | None = None


@dataclass(frozen=True)
class GpuLostEvent:
    """The GPU stopped answering (fell off the bus, or marked lost on a fake node)."""

    where: HardwareRef
    detail: str
    at: float


ThresholdKind = Literal["temperature", "ecc"]


@dataclass(frozen=True)
class ThresholdEvent:
    """A polled value crossed its configured limit."""

    where: HardwareRef
    kind: ThresholdKind
    detail: str
    at: float


@dataclass(frozen=True)
class RecoveryEvent:
    """NVML reports a recovery action needed on a GPU, with no XID to go with it: found when the
    source starts watching the GPU (it failed before, e.g. under the `serve` this one replaced)."""

    where: HardwareRef
    #: `recovery.RecoveryAction`, or a newer number.
    action: int
    at: float


HealthEvent = XidEvent | GpuLostEvent | ThresholdEvent | RecoveryEvent


class HealthMetrics(Protocol):
    """Counters the health machinery moves; must be cheap and never raise."""

    def xid(self, code: int, xid_class: str) -> None: ...

    def nvml_error(self, call: str) -> None: ...


class NoMetrics:
    """When metrics are not served nothing is counted."""

    def xid(self, code: int, xid_class: str) -> None:
        """Not counted."""

    def nvml_error(self, call: str) -> None:
        """Not counted."""


@dataclass(frozen=True)
class SourceOptions:
    """What a source may need besides the GPUs to watch."""

    #: The daemon's state directory (the fake backend's event log lives there).
    state_dir: Path
    thresholds: Thresholds
    metrics: HealthMetrics
    #: Called when the source learns that the node's devices changed (NVML's MIG config event):
    #: the live inventory rescans at once instead of at its next interval.
    inventory_changed: Callable[[], None] = field(default=lambda: None)


class HealthSource(Protocol):
    """Reports what happens to the node's GPUs; used from one thread only."""

    #: "nvml" or "fake", for logs and health.json.
    name: str

    def unmonitored(self) -> Mapping[str, str]:
        """GPU UUID -> why its health cannot be watched (their devices are reported UNKNOWN)."""
        ...

    def next_events(self, timeout: float) -> list[HealthEvent]:
        """Block up to `timeout` seconds for events; an empty list when none came."""
        ...

    def check(self, gpu_uuid: str) -> str | None:
        """Re-check a GPU before it is trusted again: None if fine, else what is still wrong
        (a recovery action still needed, where the host driver reports one)."""
        ...

    def watch(self, gpu_uuids: Sequence[str]) -> None:
        """The published GPUs changed (live inventory): watch these from now on."""
        ...

    def driver_problem(self) -> str | None:
        """Why no GPU can be watched now (the host driver unloaded or being upgraded), or None:
        every device is unhealthy for as long as it lasts, and healthy again when it ends."""
        ...

    def close(self) -> None: ...
