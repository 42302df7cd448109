"""Reads every published device on a timer, off the scrape and off the DRA calls.

A scrape never touches NVML nor formats a device series: each reading is rendered to the
Prometheus text format once, in the sampler's thread, and a scrape appends those bytes, so its
cost does not grow with the devices. A slow or hung NVML call delays the next reading, never a
prepare (the sampler holds no lock of the driver's; it copies the prepared claims' records, as
`status` does).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field, replace
from pathlib import Path
from typing import Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from dradriver import logs
from dradriver.periodic import Periodic
from dradriver.prepare.checkpoint import ClaimRecord
from dradriver.telemetry.cost import Cost
from dradriver.telemetry.exposition import cost_families, families
from dradriver.telemetry.model import (
    DeviceSample,
    Holder,
    PodRef,
    Reading,
    Target,
    holders_by_device,
    pod_uid_of_cgroup,
    readings,
)

log = logs.get_logger(component="telemetry")


class TelemetryReader(Protocol):
    """A backend's reading of its devices; `close()` releases it (NVML shutdown)."""

    def read(self, targets: Sequence[Target]) -> dict[str, DeviceSample]:
        """UUID -> sample, for each target that could be read (failures are left out)."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Snapshot:
    taken_at: float = 0.0  # time.time() of the reading
    read_seconds: float = 0.0
    readings: list[Reading] = field(default_factory=list)
    #: Each holder's running cost totals (set by `on_reading`).
    costs: list[Cost] = field(default_factory=list)
    #: The reading in the Prometheus text format, what a scrape appends.
    exposition: bytes = b""


def pod_of_pid(proc_root: Path) -> Callable[[int], str | None]:
    """The pod UID of a process, from `<proc_root>/<pid>/cgroup` (None: gone, or not in a pod)."""

    def lookup(pid: int) -> str | None:
        try:
            text = (proc_root / str(pid) / "cgroup").read_text()
        except OSError:
            return None
        return pod_uid_of_cgroup(text)

    return lookup


@dataclass(eq=False)
class TelemetrySampler:
    """Keeps the latest readings of the published devices, refreshed every `interval` seconds.

    `on_reading` sees each reading before it is rendered and returns it with its costs; `idle`
    gives the claims below the idle threshold then, with their seconds so far."""

    reader: TelemetryReader
    _: KW_ONLY
    targets: Callable[[], Sequence[Target]]
    records: Callable[[], list[ClaimRecord]]
    pods_of: Callable[[str], Sequence[PodRef]]
    pod_of_pid: Callable[[int], str | None]
    interval: float
    on_reading: Callable[[Snapshot], Snapshot] = lambda snapshot: snapshot
    idle: Callable[[], Mapping[str, tuple[Holder, float]]] = dict
    #: Claim, pod and namespace names as labels (see `exposition`).
    tenant_labels: bool = True

    def __post_init__(self) -> None:
        self._snapshot = Snapshot(exposition=render(Snapshot(), {}, tenant_labels=self.tenant_labels))
        self._lock = threading.Lock()  # guards _snapshot only; held for an assignment or a read
        self._loop = Periodic(
            step=self.read_once,
            interval=self.interval,
            name="telemetry",
            failed="reading the devices' telemetry failed; trying again later",
            log=log,
            at_start=True,
        )

    def read_once(self) -> Snapshot:
        started = time.perf_counter()
        targets = list(self.targets())
        samples = self.reader.read(targets)
        held: dict[str, list[Holder]] = holders_by_device(self.records(), self.pods_of)
        snapshot = Snapshot(
            taken_at=time.time(),
            read_seconds=time.perf_counter() - started,
            readings=readings(targets, samples, held, self.pod_of_pid),
        )
        snapshot = self.on_reading(snapshot)
        snapshot = replace(
            snapshot, exposition=render(snapshot, self.idle(), tenant_labels=self.tenant_labels)
        )
        with self._lock:
            self._snapshot = snapshot
        return snapshot

    def exposition(self) -> bytes:
        """The latest reading as /metrics serves it."""
        return self.snapshot().exposition

    def snapshot(self) -> Snapshot:
        with self._lock:
            return self._snapshot

    def start(self) -> None:
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop()
        self.reader.close()


class _Fixed(Collector):
    def __init__(self, families: list[GaugeMetricFamily | CounterMetricFamily]) -> None:
        self._families = families

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        yield from self._families


def render(
    snapshot: Snapshot, idle: Mapping[str, tuple[Holder, float]], *, tenant_labels: bool = True
) -> bytes:
    """A reading, the holders' cost totals, the reading's age and cost and the idle claims (a
    series per claim: none without tenant labels, the log lines and Events still tell) in the
    Prometheus text format."""
    out = families(snapshot.readings, tenant_labels=tenant_labels)
    if tenant_labels:
        out += cost_families(snapshot.costs)
    out.append(
        GaugeMetricFamily(
            "dradriver_telemetry_read_duration_seconds",
            "How long the latest reading of every device took",
            value=snapshot.read_seconds,
        )
    )
    out.append(
        GaugeMetricFamily(
            "dradriver_telemetry_timestamp_seconds",
            "When the latest reading was taken (Unix time); 0 before the first",
            value=snapshot.taken_at,
        )
    )
    idle_seconds = GaugeMetricFamily(
        "dradriver_claim_idle_seconds",
        "How long a prepared claim's devices have stayed below the idle threshold (--idle-threshold)",
        labels=["claim_namespace", "claim_name", "claim_uid", "pods"],
    )
    for holder, seconds in idle.values() if tenant_labels else ():
        pods = ",".join(map(str, holder.pods))
        idle_seconds.add_metric([holder.claim_namespace, holder.claim_name, holder.claim_uid, pods], seconds)
    out.append(idle_seconds)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(out))
    return generate_latest(registry)
