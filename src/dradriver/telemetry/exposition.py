"""The readings as Prometheus metric families (pure: readings in, families out).

Every device series carries `device`, `uuid` and `gpu_uuid` (the GPU a MIG device is on, else the
GPU itself), and while the device is prepared `claim_namespace`, `claim_name`, `claim_uid`,
`pods` (the pods its ResourceClaim is reserved for, `namespace/name`, comma-separated) and
`sharing`; a device held by several claims (shares) has one series per claim. Per-pod series
(`dradriver_pod_gpu_*`) exist where a device's processes map to the pods of its holders.

Cost (`cost_families`): counters of allocated and busy device-seconds per device and holder, and
per pod the devices its claims hold (a claim's weight split evenly between its pods), the series
a cost tool reads through the recording rules of deploy/monitoring/cost-rules.yaml.

Without tenant labels (`--metrics-tenant-labels=false`) no series names a claim, a pod or a
namespace: a device has one series per distinct `sharing`, and the per-pod and cost families
are empty (cost is per claim by nature).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from dradriver.telemetry.cost import Cost
from dradriver.telemetry.model import THROTTLE_REASONS, DeviceSample, Holder, Reading, Target

DEVICE_LABELS = [
    "device",
    "uuid",
    "gpu_uuid",
    "claim_namespace",
    "claim_name",
    "claim_uid",
    "pods",
    "sharing",
]
#: A pod series: the pod, then the device and claim labels (not `pods` and `sharing`).
POD_LABELS = ["namespace", "pod", *DEVICE_LABELS[:6]]
#: The labels that name other tenants' objects.
TENANT_LABELS = frozenset({"claim_namespace", "claim_name", "claim_uid", "pods"})

#: (metric name, help, value of a sample or None, scale)
_GAUGES: list[tuple[str, str, str, float]] = [
    (
        "dradriver_gpu_sm_utilization_ratio",
        "Share of time a kernel ran on the device",
        "sm_util_percent",
        0.01,
    ),
    (
        "dradriver_gpu_memory_bandwidth_utilization_ratio",
        "Share of time device memory was read or written",
        "memory_util_percent",
        0.01,
    ),
    ("dradriver_gpu_framebuffer_used_bytes", "Device memory in use", "fb_used_bytes", 1.0),
    ("dradriver_gpu_framebuffer_total_bytes", "Device memory in all", "fb_total_bytes", 1.0),
    ("dradriver_gpu_power_watts", "Power draw", "power_watts", 1.0),
    ("dradriver_gpu_temperature_celsius", "GPU temperature", "temperature_celsius", 1.0),
]


def device_labels(tenant_labels: bool) -> list[str]:
    return DEVICE_LABELS if tenant_labels else [n for n in DEVICE_LABELS if n not in TENANT_LABELS]


def _labels(target: Target, holder: Holder | None, tenant_labels: bool = True) -> list[str]:
    if not tenant_labels:
        return [target.device, target.uuid, target.gpu_uuid, holder.sharing if holder else ""]
    if holder is None:
        return [target.device, target.uuid, target.gpu_uuid, "", "", "", "", ""]
    pods = ",".join(str(pod) for pod in holder.pods)
    return [
        target.device,
        target.uuid,
        target.gpu_uuid,
        holder.claim_namespace,
        holder.claim_name,
        holder.claim_uid,
        pods,
        holder.sharing,
    ]


def _series(reading: Reading, tenant_labels: bool) -> Iterator[tuple[list[str], DeviceSample]]:
    """Label values and sample of each series a device has: one per holder (per distinct label
    values: holders differ only in tenant labels), or one unheld."""
    if reading.sample is None:
        return
    holders: list[Holder | None] = [*reading.holders] or [None]
    seen: set[tuple[str, ...]] = set()
    for holder in holders:
        labels = _labels(reading.target, holder, tenant_labels)
        if tuple(labels) not in seen:
            seen.add(tuple(labels))
            yield labels, reading.sample


def families(
    readings: Sequence[Reading], *, tenant_labels: bool = True
) -> list[GaugeMetricFamily | CounterMetricFamily]:
    return [
        *_gauges(readings, tenant_labels),
        *_labelled_families(readings, tenant_labels),
        *(_pod_families(readings) if tenant_labels else []),
    ]


def _gauges(readings: Sequence[Reading], tenant_labels: bool) -> Iterator[GaugeMetricFamily]:
    """One family per plain device gauge."""
    for name, help_text, attribute, scale in _GAUGES:
        family = GaugeMetricFamily(name, help_text, labels=device_labels(tenant_labels))
        for reading in readings:
            for labels, sample in _series(reading, tenant_labels):
                value = getattr(sample, attribute)
                if value is not None:
                    family.add_metric(labels, value * scale)
        yield family


def _labelled_families(
    readings: Sequence[Reading], tenant_labels: bool
) -> list[GaugeMetricFamily | CounterMetricFamily]:
    """Device families with one more label: clock, clock event reason, ECC error type, NVLink."""
    names = device_labels(tenant_labels)
    clocks = GaugeMetricFamily("dradriver_gpu_clock_hertz", "Current clock", labels=[*names, "clock"])
    throttle = GaugeMetricFamily(
        "dradriver_gpu_clock_event_reason",
        "1 while this reason holds the clocks down (NVML clock event reasons)",
        labels=[*names, "reason"],
    )
    ecc = CounterMetricFamily(
        "dradriver_gpu_ecc_errors", "ECC errors since the host driver loaded", labels=[*names, "type"]
    )
    nvlink = GaugeMetricFamily(
        "dradriver_gpu_nvlink_link_up", "1 while the NVLink link is up", labels=[*names, "link"]
    )
    for reading in readings:
        for labels, sample in _series(reading, tenant_labels):
            for clock, hertz in (("sm", sample.sm_clock_hz), ("memory", sample.memory_clock_hz)):
                if hertz is not None:
                    clocks.add_metric([*labels, clock], hertz)
            if sample.throttle_reasons is not None:
                for reason in THROTTLE_REASONS.values():
                    throttle.add_metric([*labels, reason], 1.0 if reason in sample.throttle_reasons else 0.0)
            for kind, count in (("corrected", sample.ecc_corrected), ("uncorrected", sample.ecc_uncorrected)):
                if count is not None:
                    ecc.add_metric([*labels, kind], count)
            for link, up in enumerate(sample.nvlink_up or ()):
                nvlink.add_metric([*labels, str(link)], 1.0 if up else 0.0)
    return [clocks, throttle, ecc, nvlink]


def _pod_families(readings: Sequence[Reading]) -> list[GaugeMetricFamily]:
    """Per pod: its processes' share of SM time and the device memory they use."""
    pod_sm = GaugeMetricFamily(
        "dradriver_pod_gpu_sm_utilization_ratio",
        "A pod's share of the device's SM time, from its processes",
        labels=POD_LABELS,
    )
    pod_fb = GaugeMetricFamily(
        "dradriver_pod_gpu_framebuffer_used_bytes", "Device memory a pod's processes use", labels=POD_LABELS
    )
    for reading in readings:
        for share in reading.shares:
            holder = next(h for h in reading.holders if share.pod in h.pods)
            labels = [share.pod.namespace, share.pod.name, *_labels(reading.target, holder)[:6]]
            if share.sm_util_percent is not None:
                pod_sm.add_metric(labels, share.sm_util_percent / 100)
            if share.used_bytes is not None:
                pod_fb.add_metric(labels, share.used_bytes)
    return [pod_sm, pod_fb]


def cost_families(costs: Sequence[Cost]) -> list[GaugeMetricFamily | CounterMetricFamily]:
    """Allocated and busy device-seconds per device and holder, what each holds now, and the
    devices each pod holds."""
    allocated = CounterMetricFamily(
        "dradriver_gpu_allocated_device_seconds",
        "Device-seconds the claim has held the device since it was prepared (a share weighted by its "
        "dominant fraction of memory and compute)",
        labels=DEVICE_LABELS,
    )
    busy = CounterMetricFamily(
        "dradriver_gpu_busy_device_seconds",
        "Device-seconds the device was busy for the claim (SM utilisation over time, at most its "
        "allocated weight); counted while serve reads the device",
        labels=DEVICE_LABELS,
    )
    held = GaugeMetricFamily(
        "dradriver_gpu_allocated_devices",
        "What of the device the claim holds now: 1, or a share's dominant fraction",
        labels=DEVICE_LABELS,
    )
    pods = GaugeMetricFamily(
        "dradriver_pod_gpu_allocated_devices",
        "Devices a pod's claims hold now (a claim's weight split evenly between the pods it is reserved for)",
        labels=POD_LABELS,
    )
    for cost in costs:
        labels = _labels(cost.target, cost.holder)
        allocated.add_metric(labels, cost.allocated_seconds)
        busy.add_metric(labels, cost.busy_seconds)
        held.add_metric(labels, cost.weight)
        for pod in cost.holder.pods:
            pods.add_metric([pod.namespace, pod.name, *labels[:6]], cost.weight / len(cost.holder.pods))
    return [allocated, busy, held, pods]
