"""The node's telemetry wired together: a sampler over the backend's reader, its collector on
/metrics, and idle claims reported as log lines and Events (the daemon calls `start`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dradriver import logs
from dradriver.devicemodel import PublishedDevice
from dradriver.prepare.checkpoint import ClaimRecord
from dradriver.prepare.claims import ReservationsTap
from dradriver.telemetry.idle import IdlePolicy, IdleTracker
from dradriver.telemetry.model import Holder, PodRef, Target, targets
from dradriver.telemetry.sampler import Snapshot, TelemetryReader, TelemetrySampler, pod_of_pid

if TYPE_CHECKING:
    from dradriver.kube.events import NodeEventSender

log = logs.get_logger(component="telemetry")


class IdleReporter:
    """An idle claim: a log line, and a Warning Event on the claim and on each of its pods."""

    def __init__(self, policy: IdlePolicy, events: NodeEventSender | None) -> None:
        self.policy = policy
        self._events = events

    def report(self, holder: Holder, seconds: float) -> None:
        message = (
            f"the devices of claim {holder.claim} have stayed below {self.policy.threshold_percent:g}% SM "
            f"utilisation for {seconds:.0f}s (dradriver never evicts; free the GPUs if they are not needed)"
        )
        log.warning("claim idle", claim=holder.claim, uid=holder.claim_uid, idle_seconds=round(seconds))
        if self._events is None:
            return
        claim = ("resource.k8s.io/v1", "ResourceClaim", holder.claim_namespace, holder.claim_name)
        about = [(*claim, holder.claim_uid)]
        about += [("v1", "Pod", pod.namespace, pod.name, pod.uid) for pod in holder.pods]
        for api_version, kind, namespace, name, uid in about:
            involved = {"apiVersion": api_version, "kind": kind, "namespace": namespace, "name": name}
            involved["uid"] = uid
            self._events.send_about(involved, namespace, "GPUIdle", message, "Warning")


def build_sampler(
    reader: TelemetryReader,
    *,
    published: Callable[[], Sequence[PublishedDevice]],
    records: Callable[[], list[ClaimRecord]],
    reservations: ReservationsTap,
    proc_root: Path,
    interval: float,
    idle: IdleReporter | None,
    tenant_labels: bool = True,
) -> TelemetrySampler:
    """What reads the devices every `interval` seconds once started (its `exposition` is served
    on /metrics); the caller starts and stops it."""
    tracker = IdleTracker(idle.policy) if idle is not None else None

    def current_targets() -> list[Target]:
        return targets(published(), records())

    def pods_of(uid: str) -> list[PodRef]:
        return [PodRef(*pod) for pod in reservations.pods(uid)]

    def on_reading(snapshot: Snapshot) -> None:
        reservations.forget({r.uid for r in records()})
        if tracker is not None and idle is not None:
            for holder, seconds in tracker.update(time.monotonic(), snapshot.readings):
                idle.report(holder, seconds)

    return TelemetrySampler(
        reader,
        targets=current_targets,
        records=records,
        pods_of=pods_of,
        pod_of_pid=pod_of_pid(proc_root),
        interval=interval,
        on_reading=on_reading,
        idle=lambda: tracker.idle(time.monotonic()) if tracker is not None else {},
        tenant_labels=tenant_labels,
    )
