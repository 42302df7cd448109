"""The health monitor: one thread that turns a source's events into device health and its effects.

    source events -> assess (policy) -> tracker -> transitions -> sinks (board, taints, file, Events)
                     re-checks due  ---^

The thread blocks in the source (NVML's event wait, the fake log's poll) for at most a second,
or until the next re-check is due, so an idle node costs a wake-up a second and nothing else.

When the live inventory changes the published devices, `retarget` swaps the targets: devices no
longer published are forgotten, and those kept published although their hardware vanished (a
prepared claim holds them) are unhealthy until they go, through the same sinks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from dradriver import logs
from dradriver.devicemodel import PublishedDevice
from dradriver.health.board import Health
from dradriver.health.config import HealthConfig
from dradriver.health.events import HealthEvent, HealthMetrics, HealthSource, XidEvent
from dradriver.health.policy import HealthTracker, Problem, Transition, assess
from dradriver.health.targets import HealthTargets

#: The longest the thread blocks in the source: bounds how long `stop()` takes.
MAX_WAIT_SECONDS = 1.0

log = logs.get_logger(component="health")


class HealthSink(Protocol):
    """Where transitions go. `problems` is every unhealthy device's problem after them."""

    def apply(self, changes: Sequence[Transition], problems: Mapping[str, Problem]) -> None: ...


class HealthMonitor:
    def __init__(
        self,
        *,
        source: HealthSource,
        targets: HealthTargets,
        config: HealthConfig,
        sinks: Sequence[HealthSink],
        metrics: HealthMetrics,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._source = source
        self._targets = targets
        self._config = config
        self._sinks = tuple(sinks)
        self._metrics = metrics
        self._clock = clock
        self._wall = wall
        self._tracker = HealthTracker(config.quiet_period_seconds, config.recheck_interval_seconds)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Guards targets and tracker: the inventory's thread retargets while this one steps.
        self._lock = threading.Lock()
        self._watch: tuple[str, ...] | None = None  # GPUs for the source to watch, from its own thread
        self._driver_problem: str | None = None

    def start(self) -> None:
        """Report what cannot be watched, let every sink see the initial state, start the thread."""
        unknown = [
            Transition(device, Health.UNKNOWN, f"health is not monitored: {reason}", changed=True)
            for gpu, reason in self._source.unmonitored().items()
            for device in self._targets.devices_on(gpu)
        ]
        for gpu, reason in self._source.unmonitored().items():
            log.warning("GPU health is not monitored", gpu=gpu, reason=reason)
        self._apply(unknown)
        log.info(
            "health monitoring started",
            source=self._source.name,
            gpus=len(self._targets.gpu_uuids),
            quiet_period_seconds=self._config.quiet_period_seconds,
            taint_effect=self._config.taint_effect,
        )
        self._thread = threading.Thread(target=self._run, name="health", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2 * MAX_WAIT_SECONDS) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                return  # still inside the source: closing it under the thread would be worse
        self._source.close()

    def step(self, timeout: float) -> None:
        """Wait up to `timeout` for events, handle them and any re-check that is due."""
        with self._lock:
            watch, self._watch = self._watch, None
        if watch is not None:
            self._source.watch(watch)
        events = self._source.next_events(timeout)
        driver_problem = self._source.driver_problem()
        with self._lock:
            now = self._clock()
            changes: list[Transition] = []
            if driver_problem != self._driver_problem:
                changes += self._driver_changed(driver_problem)
            for event in events:
                changes += self._on_event(event, now)
            changes += self._recheck(now)
            if changes:
                self._apply(changes)

    def _driver_changed(self, problem: str | None) -> list[Transition]:
        """The host driver went away (every device unhealthy, none re-checked) or came back
        (all of them healthy again: nothing happened to the GPUs themselves)."""
        self._driver_problem = problem
        devices = self._targets.device_names
        if problem is None:
            log.info("the host driver is back: devices healthy again", devices=len(devices))
            return self._tracker.unpin(devices, self._wall())
        log.warning("the host driver is not available: devices unhealthy", reason=problem)
        return self._tracker.pin(dict.fromkeys(devices, Problem("host-driver", problem)))

    def retarget(self, devices: Sequence[PublishedDevice], gone: Mapping[str, Problem]) -> None:
        """The published devices are now `devices`; `gone` (some of them) lost their hardware."""
        with self._lock:
            before = set(self._targets.device_names)
            self._targets.update(devices)
            names = set(self._targets.device_names)
            self._tracker.forget(before - names)
            changes = self._tracker.pin(gone)
            changes += self._tracker.unpin(names - set(gone), self._wall())
            if self._driver_problem is not None:  # still no host driver: the new devices neither
                changes += self._tracker.pin(
                    dict.fromkeys(names, Problem("host-driver", self._driver_problem))
                )
            self._watch = self._targets.gpu_uuids
            self._apply(changes)  # also when only devices were dropped: their taints go

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step(self._wait_time())
            except Exception:  # a bug here must not end health monitoring for good
                log.exception("health monitor step failed")
                self._stop.wait(MAX_WAIT_SECONDS)

    def _wait_time(self) -> float:
        with self._lock:
            due = self._tracker.next_recheck()
        if due is None:
            return MAX_WAIT_SECONDS
        return max(0.0, min(MAX_WAIT_SECONDS, due - self._clock()))

    def _on_event(self, event: HealthEvent, now: float) -> list[Transition]:
        assessment = assess(event, self._config)
        devices = self._targets.devices_for(event.where)
        xid = event.xid if isinstance(event, XidEvent) else None
        if xid is not None:
            self._metrics.xid(xid, assessment.event_class.value)
        where = {
            "gpu": event.where.gpu_uuid,
            "gpu_instance": event.where.gpu_instance,
            "compute_instance": event.where.compute_instance,
        }
        if not devices:
            log.warning(
                "health event on hardware no device is published for", health_event=repr(event), **where
            )
            return []
        if assessment.problem is None:
            log.info(
                "GPU event that leaves health unchanged",
                event_class=assessment.event_class.value,
                xid=xid,
                devices=list(devices),
                **where,
            )
            return []
        log.warning("fatal GPU event", reason=assessment.problem.message, devices=list(devices), **where)
        return self._tracker.observe(devices, assessment.problem, now)

    def _recheck(self, now: float) -> list[Transition]:
        due = self._tracker.due(now)
        if not due:
            return []
        results: dict[str, str | None] = {}  # one re-check per GPU, however many devices it has
        changes = []
        for device in due:
            gpu = self._targets.gpu_of(device)
            if gpu not in results:
                results[gpu] = self._source.check(gpu)
            changes += self._tracker.rechecked(device, results[gpu], now, self._wall())
        for gpu, failure in results.items():
            log.info("GPU re-checked", gpu=gpu, passed=failure is None, error=failure)
        return changes

    def _apply(self, changes: Sequence[Transition]) -> None:
        problems = self._tracker.problems()
        for sink in self._sinks:
            try:
                sink.apply(changes, problems)
            except Exception:  # one broken effect must not keep the others from happening
                log.exception("applying health changes failed", sink=type(sink).__name__)
