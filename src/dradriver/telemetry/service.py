"""The node's telemetry wired together: a sampler over the backend's reader, its collector on
/metrics, the claims' busy totals kept in the state directory, and idle claims reported as log
lines and Events (the daemon calls `start`)."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, ValidationError

from dradriver import logs
from dradriver.devicemodel import PublishedDevice
from dradriver.files import FileReadError, read_bytes
from dradriver.files.write import error_text, is_temp_name, write_atomically
from dradriver.prepare.checkpoint import ClaimRecord
from dradriver.prepare.claims import ReservationsTap
from dradriver.telemetry.cost import CostTracker
from dradriver.telemetry.idle import IdlePolicy, IdleTracker
from dradriver.telemetry.model import Holder, PodRef, Target, targets
from dradriver.telemetry.sampler import Snapshot, TelemetryReader, TelemetrySampler, pod_of_pid

if TYPE_CHECKING:
    from dradriver.kube.events import NodeEventSender

log = logs.get_logger(component="telemetry")

#: The prepared claims' busy device-seconds, beside the checkpoint in the state directory.
USAGE_FILE = "telemetry-usage.json"
#: A few hundred bytes a claim and device: far more than a node's claims need.
_USAGE_MAX_BYTES = 16 * 1024 * 1024


class _Usage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    version: Literal[1] = 1
    #: `<claim UID>/<device>` -> busy device-seconds.
    busy_seconds: dict[str, NonNegativeFloat] = Field(default_factory=dict)


class UsageStore:
    """The busy totals on disk. Written (atomically, not fsynced: a power failure voids the
    claims anyway) after each reading that changed them and before the reading is served, so a
    restart never serves less than was served before; the rate is bounded by the reading's."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._failing = False

    def load(self) -> dict[str, float]:
        """What the previous `serve` left: empty where nothing or nothing readable was left."""
        for leftover in self._leftovers():
            leftover.unlink(missing_ok=True)
        try:
            raw = read_bytes(self.path, _USAGE_MAX_BYTES, follow_symlinks=False)
            return dict(_Usage.model_validate_json(raw).busy_seconds)
        except FileReadError as err:
            if err.errno != errno.ENOENT:
                log.warning("cannot read the busy totals; they start from 0", error=str(err))
        except ValidationError as err:
            log.warning(
                "the busy totals file is not valid; they start from 0",
                path=str(self.path),
                error=str(err).splitlines()[0],
            )
        return {}

    def save(self, busy: Mapping[str, float]) -> None:
        data = _Usage(busy_seconds=dict(busy)).model_dump_json().encode()
        try:
            write_atomically(self.path, data, mode=0o600, durable=False)
        except OSError as err:
            if not self._failing:
                log.warning(
                    "cannot write the busy totals; a restart will count them from the last written",
                    path=str(self.path),
                    error=error_text(err),
                )
            self._failing = True
            return
        self._failing = False

    def _leftovers(self) -> list[Path]:
        """Temp files of a write a kill interrupted."""
        try:
            names = os.listdir(self.path.parent)
        except OSError:
            return []
        return [self.path.parent / n for n in names if is_temp_name(n, self.path.name)]


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
    usage: UsageStore,
    tenant_labels: bool = True,
) -> TelemetrySampler:
    """What reads the devices every `interval` seconds once started (its `exposition` is served
    on /metrics); the caller starts and stops it."""
    tracker = IdleTracker(idle.policy) if idle is not None else None
    costs = CostTracker(usage.load())

    def current_targets() -> list[Target]:
        return targets(published(), records())

    def pods_of(uid: str) -> list[PodRef]:
        return [PodRef(*pod) for pod in reservations.pods(uid)]

    def on_reading(snapshot: Snapshot) -> Snapshot:
        reservations.forget({r.uid for r in records()})
        if tracker is not None and idle is not None:
            for holder, seconds in tracker.update(time.monotonic(), snapshot.readings):
                idle.report(holder, seconds)
        totals, changed = costs.update(snapshot.taken_at, snapshot.readings)
        if changed:
            usage.save(costs.busy)
        return replace(snapshot, costs=totals)

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
