"""Prometheus metrics of the node daemon, in one registry served on `--metrics-address`/metrics.

Names follow Prometheus conventions under the `dradriver_` prefix. The module is imported only
when metrics are served or recorded for the first time (prometheus-client costs ~50 ms to import,
which `serve` must not pay before its sockets are up).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from dradriver import __version__

REGISTRY = CollectorRegistry(auto_describe=True)

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

BUILD_INFO = Info("dradriver_build", "dradriver version", registry=REGISTRY)
BUILD_INFO.info({"version": __version__})

CALL_SECONDS = Histogram(
    "dradriver_dra_call_duration_seconds",
    "Duration of NodePrepareResources / NodeUnprepareResources calls",
    ["method", "api"],
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
CLAIM_ERRORS = Counter(
    "dradriver_claim_errors_total",
    "Claims whose prepare or unprepare failed, by reason",
    ["method", "reason"],
    registry=REGISTRY,
)
CALL_FAILURES = Counter(
    "dradriver_dra_call_failures_total",
    "Whole DRA calls that failed (claim not fetchable, internal error) or were done after the kubelet "
    "stopped waiting (DEADLINE_EXCEEDED, CANCELLED)",
    ["method", "code"],
    registry=REGISTRY,
)
NVML_ERRORS = Counter("dradriver_nvml_errors_total", "NVML calls that failed", ["call"], registry=REGISTRY)
MIG_CREATED = Counter(
    "dradriver_mig_devices_created_total",
    "MIG devices created for claims (--partitionable)",
    registry=REGISTRY,
)
MIG_DESTROYED = Counter(
    "dradriver_mig_devices_destroyed_total",
    "MIG devices made for claims and destroyed again",
    registry=REGISTRY,
)
MIG_FAILURES = Counter(
    "dradriver_mig_failures_total",
    "MIG creations and destructions NVML refused, by operation and reason",
    ["operation", "reason"],
    registry=REGISTRY,
)
SLICE_ADMISSION = Gauge(
    "dradriver_slice_admission_policy",
    "1 for what the start-up check found: enforced (another node's slice refused to this node's "
    "token), not-enforced (accepted: any node's token can rewrite any node's devices) or unknown",
    ["outcome"],
    registry=REGISTRY,
)
XID_EVENTS = Counter(
    "dradriver_xid_events_total", "XID events seen, by code and class", ["xid", "class"], registry=REGISTRY
)


#: Text rendered elsewhere ahead of the scrape (the device telemetry), appended to the registry's.
_APPENDED: list[Callable[[], bytes]] = []


def append_exposition(source: Callable[[], bytes]) -> None:
    """Serve what `source` returns after the registry's metrics: series rendered ahead of the scrape."""
    _APPENDED.append(source)


def exposition() -> bytes:
    """The registry in the Prometheus text format, then what was appended."""
    return generate_latest(REGISTRY) + b"".join(source() for source in _APPENDED)


def error_reason(message: str) -> str:
    """A bounded label value for a per-claim error message (messages themselves are unbounded)."""
    for needle, reason in (
        ("already prepared for claim", "device_in_use"),
        ("invalid opaque config", "invalid_config"),
        ("cannot be applied", "sharing_unavailable"),
        ("does not have", "unknown_device"),
        ("this node's pool is", "wrong_pool"),
        ("invalid UID", "invalid_reference"),
        ("invalid namespace", "invalid_reference"),
        ("invalid name", "invalid_reference"),
        ("node-only mode", "no_api_access"),
        ("cannot create the MIG device", "mig_create_failed"),
    ):
        if needle in message:
            return reason
    return "other"


class CallMetrics:
    """The gRPC layer's CallRecorder: latency histograms and error counts by bounded reason."""

    def record(
        self, method: str, api: str, seconds: float, claim_errors: Sequence[str], failure: str | None
    ) -> None:
        CALL_SECONDS.labels(method, api).observe(seconds)
        if failure is not None:
            CALL_FAILURES.labels(method, failure).inc()
        for message in claim_errors:
            CLAIM_ERRORS.labels(method, error_reason(message)).inc()


class HealthCounters:
    """The health machinery's HealthMetrics: XID events by code and class, NVML errors by call."""

    def xid(self, code: int, xid_class: str) -> None:
        XID_EVENTS.labels(str(code), xid_class).inc()

    def nvml_error(self, call: str) -> None:
        NVML_ERRORS.labels(call).inc()


class MigCounters:
    """The MIG manager's MigMetrics."""

    def mig_created(self) -> None:
        MIG_CREATED.inc()

    def mig_destroyed(self) -> None:
        MIG_DESTROYED.inc()

    def mig_failed(self, operation: str, reason: str) -> None:
        MIG_FAILURES.labels(operation, reason).inc()


@dataclass(kw_only=True, eq=False)
class StateCollector(Collector):
    """Gauges read at scrape time from the daemon's own state, so they can never drift from it."""

    devices: Callable[[], Sequence[tuple[str, str]]]
    prepared_claims: Callable[[], int]
    registered: Callable[[], bool]
    slice_writes: Callable[[], Mapping[str, int]] = dict
    shares: Callable[[], Sequence[tuple[str, str]]] = list

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        by_type_health = GaugeMetricFamily(
            "dradriver_devices", "Published devices by type and health", labels=["type", "health"]
        )
        counts: dict[tuple[str, str], int] = {}
        for device_type, health in self.devices():
            counts[(device_type, health)] = counts.get((device_type, health), 0) + 1
        for (device_type, health), count in sorted(counts.items()):
            by_type_health.add_metric([device_type, health], count)
        yield by_type_health
        yield GaugeMetricFamily(
            "dradriver_prepared_claims", "Claims prepared on this node", value=self.prepared_claims()
        )
        yield GaugeMetricFamily(
            "dradriver_kubelet_registered",
            "1 when the kubelet accepted our registration",
            value=1 if self.registered() else 0,
        )
        shares = GaugeMetricFamily(
            "dradriver_gpu_shares",
            "Prepared shares of shared GPUs by device and enforcement (mps, or unenforced: no limits)",
            labels=["device", "enforcement"],
        )
        share_counts: dict[tuple[str, str], int] = {}
        for key in self.shares():
            share_counts[key] = share_counts.get(key, 0) + 1
        for (device, enforcement), count in sorted(share_counts.items()):
            shares.add_metric([device, enforcement], count)
        yield shares
        writes = CounterMetricFamily(
            "dradriver_resourceslice_writes", "ResourceSlice writes by operation", labels=["operation"]
        )
        for operation, count in sorted(self.slice_writes().items()):
            writes.add_metric([operation], count)
        yield writes
