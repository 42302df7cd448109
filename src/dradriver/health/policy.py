"""The health policy (pure): which events make a device unhealthy, and when it is healthy again.

A fatal event makes the devices it concerns UNHEALTHY at once. A device becomes HEALTHY again
by itself, never by a restart: once no fatal event has arrived for the quiet period its GPU is
re-checked (NVML: it answers, no recovery action needed where the host driver reports one, no
row remapping pending, thresholds kept; fake GPUs: not marked lost, no recovery action set), and
only a passing re-check clears it. A failing re-check is repeated every re-check
interval. Time comes in as arguments, so every rule is tested without waiting.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from dradriver.health import recovery
from dradriver.health.board import Health
from dradriver.health.config import HealthConfig
from dradriver.health.events import GpuLostEvent, HealthEvent, RecoveryEvent, ThresholdEvent, XidEvent
from dradriver.health.xid import XidClass, classify, describe

#: The taint value (and health.json reason) of a lost GPU.
GPU_LOST = "gpu-lost"
#: ... of a device that vanished from the node while a prepared claim holds it (live inventory).
DEVICE_GONE = "device-gone"
#: ... of a GPU found needing a recovery action with no XID to name.
RECOVERY_ACTION = "recovery-action"


@dataclass(frozen=True)
class Problem:
    """Why a device is unhealthy."""

    #: A short token: the XID number, "gpu-lost", "temperature" or "ecc" (the taint's value).
    reason: str
    #: What operators and the pod's status read, e.g. "XID 79 (GPU has fallen off the bus) at ...".
    message: str


@dataclass(frozen=True)
class Assessment:
    """What one event means: its class, and the problem it causes if it is fatal."""

    event_class: XidClass
    problem: Problem | None


@dataclass(frozen=True)
class Transition:
    """A device's new health and message; `changed` is False when only the message moved."""

    device: str
    health: Health
    message: str
    changed: bool


def timestamp(unix_seconds: float) -> str:
    """RFC 3339 in UTC, to the second: `2025-06-01T12:00:00Z`."""
    return datetime.fromtimestamp(unix_seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def assess(event: HealthEvent, config: HealthConfig) -> Assessment:
    """Classify an event under `config` and describe the problem it causes."""
    when = timestamp(event.at)
    if isinstance(event, XidEvent):
        xid_class = classify(event.xid, config.xids, config.unlisted_xids, event.recovery)
        action = "" if event.recovery is None else f": {recovery.describe(event.recovery)}"
        problem = Problem(str(event.xid), f"{describe(event.xid)} at {when}{action}")
        return Assessment(xid_class, problem if xid_class is XidClass.FATAL else None)
    if isinstance(event, GpuLostEvent):
        return Assessment(XidClass.FATAL, Problem(GPU_LOST, f"GPU lost ({event.detail}) at {when}"))
    if isinstance(event, ThresholdEvent):
        return Assessment(XidClass.FATAL, Problem(event.kind, f"{event.detail} at {when}"))
    if isinstance(event, RecoveryEvent):
        return Assessment(
            XidClass.FATAL, Problem(RECOVERY_ACTION, f"{recovery.describe(event.action)} at {when}")
        )
    raise TypeError(f"unknown health event {event!r}")


@dataclass
class _Unhealthy:
    problem: Problem
    #: Monotonic time of the next re-check: the quiet period's end, then every re-check interval.
    recheck_at: float
    #: What the last re-check found, once one failed.
    recheck_failure: str | None = None
    #: Unhealthy for as long as the hardware is missing, whatever re-checks say (see `pin`).
    pinned: bool = False


class HealthTracker:
    """The unhealthy devices and when each is due for a re-check."""

    def __init__(self, quiet_period: float, recheck_interval: float) -> None:
        self._quiet = quiet_period
        self._interval = recheck_interval
        self._unhealthy: dict[str, _Unhealthy] = {}

    def observe(self, devices: Iterable[str], problem: Problem, now: float) -> list[Transition]:
        """A fatal problem on `devices` at monotonic time `now`; restarts their quiet period.

        A repeat of the reason a device is already unhealthy for keeps its message (the first
        occurrence), so an event storm does not rewrite the device's status on every event.
        """
        out = []
        for device in devices:
            current = self._unhealthy.get(device)
            if current is not None and current.problem.reason == problem.reason:
                current.recheck_at = now + self._quiet
                current.recheck_failure = None
                continue
            self._unhealthy[device] = _Unhealthy(problem, now + self._quiet)
            out.append(Transition(device, Health.UNHEALTHY, problem.message, changed=current is None))
        return out

    def due(self, now: float) -> list[str]:
        """Devices whose re-check is due."""
        return [d for d, state in self._unhealthy.items() if not state.pinned and state.recheck_at <= now]

    def pin(self, problems: Mapping[str, Problem]) -> list[Transition]:
        """Devices whose hardware is gone: unhealthy, never re-checked, until `unpin` or `forget`."""
        out = []
        for device, problem in problems.items():
            current = self._unhealthy.get(device)
            if current is not None and current.pinned and current.problem == problem:
                continue
            self._unhealthy[device] = _Unhealthy(problem, float("inf"), pinned=True)
            out.append(Transition(device, Health.UNHEALTHY, problem.message, changed=current is None))
        return out

    def unpin(self, devices: Iterable[str], wall: float) -> list[Transition]:
        """Pinned devices whose hardware is back: healthy again."""
        out = []
        for device in devices:
            state = self._unhealthy.get(device)
            if state is None or not state.pinned:
                continue
            del self._unhealthy[device]
            message = f"healthy again at {timestamp(wall)}: back on the node (was: {state.problem.message})"
            out.append(Transition(device, Health.HEALTHY, message, changed=True))
        return out

    def forget(self, devices: Iterable[str]) -> None:
        """Devices no longer published: nothing to track."""
        for device in devices:
            self._unhealthy.pop(device, None)

    def rechecked(self, device: str, failure: str | None, now: float, wall: float) -> list[Transition]:
        """Record a re-check's result (`failure` None: passed) made at monotonic `now`, Unix `wall`."""
        state = self._unhealthy[device]
        if failure is None:
            del self._unhealthy[device]
            message = (
                f"healthy again at {timestamp(wall)}: no fatal event for {self._quiet:g}s and the GPU "
                f"passed its re-check (was: {state.problem.message})"
            )
            return [Transition(device, Health.HEALTHY, message, changed=True)]
        state.recheck_at = now + self._interval
        if failure == state.recheck_failure:
            return []
        state.recheck_failure = failure
        message = f"{state.problem.message}; re-check at {timestamp(wall)} failed: {failure}"
        return [Transition(device, Health.UNHEALTHY, message, changed=False)]

    def next_recheck(self) -> float | None:
        """Monotonic time of the earliest re-check, None when every device is healthy."""
        return min((s.recheck_at for s in self._unhealthy.values() if not s.pinned), default=None)

    def problems(self) -> Mapping[str, Problem]:
        """Unhealthy device -> its problem (what its taint says)."""
        return {device: state.problem for device, state in self._unhealthy.items()}
