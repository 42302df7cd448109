"""Telemetry's pure parts: pods from cgroups, per-pod split, holders, idle claims, the top table."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dradriver.cli.top import DeviceRow, PodRow, render, rows_from_metrics
from dradriver.prepare.checkpoint import ClaimRecord, ClaimState, DeviceRecord, ShareRecord
from dradriver.telemetry import sampler
from dradriver.telemetry.exposition import families
from dradriver.telemetry.idle import IdlePolicy, IdleTracker
from dradriver.telemetry.model import (
    DeviceSample,
    Holder,
    PodRef,
    ProcessSample,
    Reading,
    Target,
    holders_by_device,
    pod_shares,
    pod_uid_of_cgroup,
    throttle_names,
)

POD_A = PodRef("ml", "train-a", "0f3a5a54-5d9c-4d3e-9b1a-00000000000a")
POD_B = PodRef("ml", "train-b", "0f3a5a54-5d9c-4d3e-9b1a-00000000000b")
GPU = Target("gpu-3", "GPU-3", "GPU-3", "gpu", 80 * 1024**3)


@pytest.mark.parametrize(
    ("cgroup", "uid"),
    [
        # cgroup v2, systemd driver (containerd's default on systemd hosts)
        (
            "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0f3a5a54_5d9c_4d3e_9b1a_"
            "00000000000a.slice/cri-containerd-abc.scope\n",
            POD_A.uid,
        ),
        # cgroup v1, cgroupfs driver
        ("12:memory:/kubepods/burstable/pod0f3a5a54-5d9c-4d3e-9b1a-00000000000b/0123abcd\n", POD_B.uid),
        ("0::/user.slice/user-0.slice/session-1.scope\n", None),
    ],
)
def test_a_process_is_mapped_to_its_pod_by_its_cgroup(cgroup: str, uid: str | None) -> None:
    assert pod_uid_of_cgroup(cgroup) == uid


def test_a_shared_gpu_is_split_per_pod_and_foreign_processes_are_left_out() -> None:
    sample = DeviceSample(
        sm_util_percent=90,
        processes=(
            ProcessSample(11, 10 * 1024**3, 50.0),
            ProcessSample(12, 2 * 1024**3, 10.0),
            ProcessSample(21, 4 * 1024**3, 30.0),
            ProcessSample(99, 1024**3, 5.0),  # a process of no pod the claim is reserved for
        ),
    )
    holder = Holder("ml", "shared", "uid-1", (POD_A, POD_B), "timeslicing")
    pods = {11: POD_A.uid, 12: POD_A.uid, 21: POD_B.uid, 99: "someone-else"}
    shares = pod_shares(sample, [holder], pods.get)
    assert [(s.pod, s.used_bytes, s.sm_util_percent, s.processes) for s in shares] == [
        (POD_A, 12 * 1024**3, 60.0, 2),
        (POD_B, 4 * 1024**3, 30.0, 1),
    ]


def test_series_carry_the_claim_and_its_pods_and_unheld_devices_none() -> None:
    holder = Holder("ml", "shared", "uid-1", (POD_A, POD_B), "timeslicing")
    sample = DeviceSample(sm_util_percent=40, throttle_reasons=throttle_names(0x4 | 0x40))
    other = Target("gpu-4", "GPU-4", "GPU-4", "gpu")
    readings = [Reading(GPU, sample, [holder]), Reading(other, DeviceSample(sm_util_percent=0))]
    by_name = {f.name: f for f in families(readings)}
    sm = {s.labels["device"]: s for s in by_name["dradriver_gpu_sm_utilization_ratio"].samples}
    assert sm["gpu-3"].value == pytest.approx(0.4)
    assert sm["gpu-3"].labels | {} == {
        "device": "gpu-3",
        "uuid": "GPU-3",
        "gpu_uuid": "GPU-3",
        "claim_namespace": "ml",
        "claim_name": "shared",
        "claim_uid": "uid-1",
        "pods": "ml/train-a,ml/train-b",
        "sharing": "timeslicing",
    }
    assert sm["gpu-4"].labels["claim_uid"] == ""
    reasons = {
        s.labels["reason"]: s.value
        for s in by_name["dradriver_gpu_clock_event_reason"].samples
        if s.labels["device"] == "gpu-3"
    }
    assert {r for r, v in reasons.items() if v} == {"sw_power_cap", "hw_thermal_slowdown"}
    assert not by_name["dradriver_gpu_power_watts"].samples  # unknown: no series, not a zero


def test_without_tenant_labels_no_series_names_a_claim_pod_or_namespace() -> None:
    """Two claims sharing a device alike: one series for the device, no per-pod or per-claim ones."""
    first = Holder("ml", "shared", "uid-1", (POD_A,), "timeslicing")
    second = Holder("other-team", "mine", "uid-2", (POD_B,), "timeslicing")
    reading = Reading(GPU, DeviceSample(sm_util_percent=40), [first, second])
    reading.shares = pod_shares(
        DeviceSample(processes=(ProcessSample(11, 1024**3, 40.0),)), [first, second], {11: POD_A.uid}.get
    )
    assert reading.shares  # with tenant labels, a per-pod series
    snapshot = sampler.Snapshot(1.0, 0.01, [reading])
    text = sampler.render(snapshot, {"uid-1": (first, 120.0)}, tenant_labels=False).decode()
    series = [s for f in text_string_to_metric_families(text) for s in f.samples]
    sm = [s for s in series if s.name == "dradriver_gpu_sm_utilization_ratio"]
    assert [s.labels for s in sm] == [
        {"device": "gpu-3", "uuid": "GPU-3", "gpu_uuid": "GPU-3", "sharing": "timeslicing"}
    ]
    assert not [s for s in series if s.name.startswith(("dradriver_pod_", "dradriver_claim_idle"))]
    for name in ("ml", "other-team", "shared", "mine", "uid-1", "uid-2", "train-a", "train-b"):
        assert f'"{name}' not in text


def test_idle_claims_are_reported_once_per_idle_spell() -> None:
    tracker = IdleTracker(IdlePolicy(threshold_percent=5, window_seconds=60))
    holder = Holder("ml", "idle", "uid-1", (POD_A,))

    def at(now: float, sm: float | None) -> list[tuple[Holder, float]]:
        return tracker.update(now, [Reading(GPU, DeviceSample(sm_util_percent=sm), [holder])])

    assert at(0, 1) == []
    assert at(59, 4) == []
    assert tracker.idle(59)["uid-1"][1] == 59
    assert at(60, 0) == [(holder, 60)]
    assert at(120, 0) == []  # reported already
    assert at(130, None) == []  # cannot tell (no utilisation): nothing changes
    assert at(140, 50) == []  # busy: starts over
    assert tracker.idle(140) == {}
    assert at(150, 0) == []
    assert at(210, 0) == [(holder, 60)]
    assert tracker.update(220, [Reading(GPU, DeviceSample(sm_util_percent=0))]) == []  # unprepared
    assert tracker.idle(220) == {}


def test_top_fits_80_columns_and_reads_what_serve_exports() -> None:
    holder = Holder(
        "a-namespace-with-a-long-name", "a-claim-with-a-long-name", "uid-1", (POD_A, POD_B), "mps"
    )
    sample = DeviceSample(
        sm_util_percent=75,
        fb_used_bytes=30 * 1024**3,
        fb_total_bytes=80 * 1024**3,
        power_watts=412.4,
        temperature_celsius=61,
        processes=(ProcessSample(11, 20 * 1024**3, 50.0),),
    )
    reading = Reading(GPU, sample, [holder])
    reading.shares = pod_shares(sample, [holder], {11: POD_A.uid}.get)
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.registry import Collector

    class Fixed(Collector):
        def collect(self):  # type: ignore[no-untyped-def]
            yield from families([reading])

    registry = CollectorRegistry()
    registry.register(Fixed())
    (row,) = rows_from_metrics(generate_latest(registry).decode())
    assert row == DeviceRow(
        "gpu-3",
        "GPU-3",
        "GPU-3",
        "a-namespace-with-a-long-name/a-claim-with-a-long-name",
        ["ml/train-a", "ml/train-b"],
        "mps",
        0.75,
        30 * 1024**3,
        80 * 1024**3,
        412.4,
        61,
        [PodRow("ml/train-a", 0.5, 20 * 1024**3)],
    )
    lines = render([row]).splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert lines[1].startswith("gpu-3   75%    30.0/80G   412W  61C  a-namespace-with-a-long-name/a-claim")
    assert lines[2].split() == ["50%", "20.0G", "└", "pod", "ml/train-a"]
    assert lines[3].split() == ["-", "-", "└", "pod", "ml/train-b"]


def test_each_share_of_a_gpu_is_a_holder_with_its_amounts_in_top() -> None:
    records = [
        ClaimRecord(
            uid=f"uid-{n}",
            namespace="ml",
            name=f"share-{n}",
            state=ClaimState.PREPARE_COMPLETED,
            devices=(
                DeviceRecord(
                    pool="node",
                    device="gpu-3",
                    share_id=f"5a4e000{n}-0000-4000-8000-000000000000",
                    uuid="GPU-3",
                    share=ShareRecord(memory_mib=20480, thread_percentage=25, enforced=n == 0),
                ),
            ),
        )
        for n in range(2)
    ]
    holders = holders_by_device(records, lambda uid: (POD_A,) if uid == "uid-0" else (POD_B,))["gpu-3"]
    assert [h.sharing for h in holders] == [
        "share 5a4e0000 20480Mi 25% mps",
        "share 5a4e0001 20480Mi 25% unenforced",
    ]
    rows = [DeviceRow("gpu-3", "GPU-3", "GPU-3", f"ml/{h.claim_name}", [], h.sharing) for h in holders]
    text = render(rows, width=100)
    assert "ml/share-0 [share 5a4e0000 20480Mi 25% mps]" in text
    assert "ml/share-1 [share 5a4e0001 20480Mi 25% unenforced]" in text
