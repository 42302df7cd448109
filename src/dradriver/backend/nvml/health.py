"""Health events from NVML: XID critical errors, lost GPUs and (optionally) polled thresholds.

Every watched GPU is registered for XID critical-error events in one event set, and
`nvmlEventSetWait` blocks in the driver until one arrives or the wait times out, so an idle
node costs one wake-up a second. NVML attributes an event to a MIG device through its GPU
instance and compute instance ids (0xFFFFFFFF: the whole GPU).

When the wait answers "GPU is lost" NVML does not say which GPU: every watched GPU is asked
and those that no longer answer are reported lost (NVIDIA's driver taints every device instead).

When NVML answers that the host driver is not loaded, or no longer initialised (the driver was
unloaded or upgraded under us, as the GPU operator's driver manager does), the handles are dead:
the source reports a `driver_problem` (every device unhealthy, none re-checked) and initialises
NVML again with backoff until it works, then registers the GPUs anew, reports the problem gone
and asks for a rescan (a new driver version changes published attributes). "GPU is lost" stays
a problem of each GPU (re-checked, back after the quiet period), even when every GPU has it.
Re-checking a GPU looks it up afresh and reads its temperature and row-remapping state: a lost
GPU fails, and so does one with a row remap pending (it needs a reset) or over a threshold.

With every XID the GPU's recovery action (field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) is read and
travels with the event, so the policy follows it; the re-check asks it again and fails while an
action is still needed. A GPU that needs one already when it is first watched (at start, when the
host driver is back, when the inventory adds it) is reported at once. A host driver without the
field (NOT_SUPPORTED) leaves all of this as before.
"""

from __future__ import annotations

import ctypes
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pynvml

from dradriver import logs
from dradriver.backend.nvml.discovery import host_driver_gone
from dradriver.health import recovery
from dradriver.health.config import Thresholds
from dradriver.health.events import (
    GpuLostEvent,
    HardwareRef,
    HealthEvent,
    HealthMetrics,
    RecoveryEvent,
    ThresholdEvent,
    ThresholdKind,
    XidEvent,
)

#: NVML's instance id for "the whole GPU" in event data.
WHOLE_GPU = 0xFFFFFFFF
#: Re-initialising NVML after the host driver went away: first after this long, then twice as
#: long each time up to the most; so a driver back is seen within the most plus a monitor step.
REINIT_FIRST_SECONDS = 0.25
REINIT_MOST_SECONDS = 4.0

log = logs.get_logger(component="health", source="nvml")


class _CallError(Exception):
    def __init__(self, call: str, error: Exception) -> None:
        super().__init__(f"{call}: {error}")
        self.call = call
        self.error = error


def _instance(value: int) -> int | None:
    return None if value == WHOLE_GPU else value


def _address(handle: Any) -> int | None:
    return ctypes.cast(handle, ctypes.c_void_p).value


class NvmlHealthSource:
    """Watches `gpu_uuids` through NVML (which the caller's library has loaded); see module doc."""

    name = "nvml"

    def __init__(
        self,
        gpu_uuids: Sequence[str],
        *,
        thresholds: Thresholds,
        metrics: HealthMetrics,
        clock: Callable[[], float] = time.monotonic,
        inventory_changed: Callable[[], None] = lambda: None,
    ) -> None:
        self._nvml: Any = pynvml
        self._thresholds = thresholds
        self._metrics = metrics
        self._clock = clock
        self._uuids = tuple(gpu_uuids)
        self._inventory_changed = inventory_changed
        self._unmonitored: dict[str, str] = {}
        self._uuid_at: dict[int | None, str] = {}  # event handle address -> GPU UUID
        self._lost: set[str] = set()
        self._next_poll = clock() if thresholds.enabled else None
        self._set: Any = None
        self._pending: list[HealthEvent] = []
        self._driver_problem: str | None = None
        self._reinit_at = 0.0
        self._reinit_wait = REINIT_FIRST_SECONDS
        try:
            self._call("nvmlInit", pynvml.nvmlInit)
        except _CallError as err:
            self._unmonitored = dict.fromkeys(self._uuids, str(err))
            self._open = False
            return
        self._open = True
        try:
            self._set = self._call("nvmlEventSetCreate", pynvml.nvmlEventSetCreate)
        except _CallError as err:
            self._unmonitored = dict.fromkeys(self._uuids, str(err))
            return
        for uuid in self._uuids:
            try:
                self._register(uuid)
            except _CallError as err:
                self._unmonitored[uuid] = str(err)
        self._pending = self._actions_needed(self._uuids)

    def unmonitored(self) -> Mapping[str, str]:
        return dict(self._unmonitored)

    def driver_problem(self) -> str | None:
        return self._driver_problem

    def next_events(self, timeout: float) -> list[HealthEvent]:
        if self._driver_problem is not None:
            self._reinitialize(timeout)
            return []
        if self._pending:
            events, self._pending = self._pending, []
            return events
        if self._set is None:  # nothing to wait on: just let the caller's time pass
            time.sleep(timeout)
            return []
        if self._next_poll is not None and self._clock() >= self._next_poll:
            self._next_poll = self._clock() + self._thresholds.poll_interval_seconds
            if events := self._poll_thresholds():
                return events
        started = self._clock()
        wait = timeout if self._next_poll is None else max(0.0, min(timeout, self._next_poll - started))
        try:
            # Rounded up: a 0 ms wait would return at once and spin until the poll is due.
            wait_ms = max(1, math.ceil(wait * 1000))
            data = self._call("nvmlEventSetWait", self._nvml.nvmlEventSetWait_v2, self._set, wait_ms)
        except _CallError as err:
            if isinstance(err.error, self._nvml.NVMLError_Timeout):
                return []
            if host_driver_gone(self._nvml, err.error):
                self._lose_driver(str(err))
                return []
            events = self._find_lost() if isinstance(err.error, self._nvml.NVMLError_GpuIsLost) else []
            if not events:
                # The same error may come back at once: never spin on it.
                log.warning("waiting for NVML events failed", error=str(err))
                time.sleep(max(0.0, wait - (self._clock() - started)))
            return events
        return self._event(data)

    def check(self, gpu_uuid: str) -> str | None:
        try:
            handle = self._answering(gpu_uuid)
            action = self._recovery_action(handle)
            remap = self._supported("nvmlDeviceGetRemappedRows", self._nvml.nvmlDeviceGetRemappedRows, handle)
            over = self._over_thresholds(handle)
        except _CallError as err:
            return f"NVML {err}"
        if action is not None and recovery.needs_action(action):
            return recovery.describe(action)
        if remap is not None and remap[3]:
            return "row remapping failed: the GPU's memory needs service"
        if remap is not None and remap[2]:
            return "row remapping pending: the GPU needs a reset"
        if over:
            return over[0][1]
        if gpu_uuid in self._lost:
            self._lost.discard(gpu_uuid)
            try:  # its old registration may have died with it
                self._register(gpu_uuid)
            except _CallError as err:
                log.warning("re-registering a recovered GPU for events failed", gpu=gpu_uuid, error=str(err))
        return None

    def watch(self, gpu_uuids: Sequence[str]) -> None:
        new = [u for u in gpu_uuids if u not in self._uuids]
        self._uuids = tuple(gpu_uuids)
        if self._set is None:
            self._unmonitored.update(dict.fromkeys(new, "NVML events are not available"))
            return
        for uuid in new:
            try:
                self._register(uuid)
            except _CallError as err:
                self._unmonitored[uuid] = str(err)
        self._pending += self._actions_needed(new)

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        if self._set is not None:
            try:
                self._call("nvmlEventSetFree", self._nvml.nvmlEventSetFree, self._set)
            except _CallError as err:
                log.debug("freeing the NVML event set failed", error=str(err))
        try:
            self._call("nvmlShutdown", self._nvml.nvmlShutdown)
        except _CallError as err:
            log.debug("NVML shutdown failed", error=str(err))

    # -- the host driver going away and coming back ----------------------------------------------

    def _lose_driver(self, problem: str) -> None:
        """The handles died with the driver: nothing is freed or shut down, all is set up anew."""
        log.error("the host driver is not available: initialising NVML again until it is", error=problem)
        self._driver_problem = f"the host driver is not available: {problem}"
        self._set = None
        self._open = False
        self._uuid_at.clear()
        self._reinit_wait = REINIT_FIRST_SECONDS
        self._reinit_at = self._clock() + self._reinit_wait

    def _reinitialize(self, timeout: float) -> None:
        """One attempt, when due (else wait for it, at most `timeout`), to initialise NVML again."""
        wait = self._reinit_at - self._clock()
        if wait > 0:
            time.sleep(min(wait, timeout))
            return
        try:
            self._call("nvmlInit", self._nvml.nvmlInit)
        except _CallError as err:
            self._reinit_wait = min(2 * self._reinit_wait, REINIT_MOST_SECONDS)
            self._reinit_at = self._clock() + self._reinit_wait
            log.debug("NVML cannot be initialised yet", error=str(err), retry_in_seconds=self._reinit_wait)
            return
        self._open = True
        self._unmonitored = {}
        self._lost.clear()
        try:
            self._set = self._call("nvmlEventSetCreate", self._nvml.nvmlEventSetCreate)
            for uuid in self._uuids:
                try:
                    self._register(uuid)
                except _CallError as err:
                    self._unmonitored[uuid] = str(err)
        except _CallError as err:
            self._unmonitored = dict.fromkeys(self._uuids, str(err))
        self._pending = self._actions_needed(self._uuids)
        self._driver_problem = None
        log.info("the host driver is back: NVML initialised again", unmonitored=len(self._unmonitored))
        self._inventory_changed()

    # -- helpers -------------------------------------------------------------------------------

    def _call(self, call: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except self._nvml.NVMLError as err:
            if not isinstance(err, self._nvml.NVMLError_Timeout):
                self._metrics.nvml_error(call)
            raise _CallError(call, err) from None

    def _supported(self, call: str, fn: Callable[..., Any], *args: Any) -> Any:
        """A query some GPUs do not support: None for those, _CallError for real failures."""
        try:
            return fn(*args)
        except (self._nvml.NVMLError_NotSupported, self._nvml.NVMLError_FunctionNotFound):
            return None
        except self._nvml.NVMLError as err:
            self._metrics.nvml_error(call)
            raise _CallError(call, err) from None

    def _recovery_action(self, handle: Any) -> int | None:
        """The GPU's recovery action; None where the host driver does not report it."""
        nvml, call = self._nvml, "nvmlDeviceGetFieldValues"
        field = nvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
        values = self._supported(call, nvml.nvmlDeviceGetFieldValues, handle, [field])
        if values is None or values[0].nvmlReturn == nvml.NVML_ERROR_NOT_SUPPORTED:
            return None
        if values[0].nvmlReturn != nvml.NVML_SUCCESS:
            self._metrics.nvml_error(call)
            raise _CallError(call, nvml.NVMLError(values[0].nvmlReturn))
        return int(values[0].value.uiVal)

    def _answering(self, uuid: str) -> Any:
        """A fresh handle of a GPU that answers a query that reaches the hardware (its temperature)."""
        nvml = self._nvml
        handle = self._call("nvmlDeviceGetHandleByUUID", nvml.nvmlDeviceGetHandleByUUID, uuid)
        self._supported(
            "nvmlDeviceGetTemperature", nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU
        )
        return handle

    def _register(self, uuid: str) -> None:
        nvml = self._nvml
        handle = self._call("nvmlDeviceGetHandleByUUID", nvml.nvmlDeviceGetHandleByUUID, uuid)
        supported = self._call(
            "nvmlDeviceGetSupportedEventTypes", nvml.nvmlDeviceGetSupportedEventTypes, handle
        )
        if not supported & nvml.nvmlEventTypeXidCriticalError:
            raise _CallError("nvmlDeviceGetSupportedEventTypes", ValueError("no XID events on this GPU"))
        # MIG devices created or destroyed by anyone (nvidia-smi, mig-parted): the live inventory.
        wanted = nvml.nvmlEventTypeXidCriticalError | (supported & nvml.nvmlEventMigConfigChange)
        self._call("nvmlDeviceRegisterEvents", nvml.nvmlDeviceRegisterEvents, handle, wanted, self._set)
        self._uuid_at[_address(handle)] = uuid

    def _event(self, data: Any) -> list[HealthEvent]:
        if data.eventType & self._nvml.nvmlEventMigConfigChange:
            log.info("MIG configuration changed", gpu=self._uuid_at.get(_address(data.device)))
            self._inventory_changed()
        if not data.eventType & self._nvml.nvmlEventTypeXidCriticalError:
            return []
        uuid = self._uuid_at.get(_address(data.device))
        if uuid is None:
            log.warning("XID event from a GPU that is not watched", xid=data.eventData)
            return []
        where = HardwareRef(uuid, _instance(data.gpuInstanceId), _instance(data.computeInstanceId))
        try:
            action = self._recovery_action(data.device)
        except _CallError as err:  # the fixed XID table decides instead
            log.warning("reading the GPU's recovery action failed", gpu=uuid, error=str(err))
            action = None
        return [XidEvent(where, int(data.eventData), time.time(), action)]

    def _watched(self) -> list[str]:
        """The GPUs watched now: neither lost nor unmonitored."""
        return [uuid for uuid in self._uuids if uuid not in self._lost and uuid not in self._unmonitored]

    def _actions_needed(self, uuids: Sequence[str]) -> list[HealthEvent]:
        """Those of `uuids` watched that NVML says need a recovery action already."""
        events: list[HealthEvent] = []
        for uuid in uuids:
            if uuid in self._unmonitored:
                continue
            try:
                handle = self._call("nvmlDeviceGetHandleByUUID", self._nvml.nvmlDeviceGetHandleByUUID, uuid)
                action = self._recovery_action(handle)
            except _CallError as err:
                log.warning("reading the GPU's recovery action failed", gpu=uuid, error=str(err))
                continue
            if action is not None and recovery.needs_action(action):
                events.append(RecoveryEvent(HardwareRef(uuid), action, time.time()))
        return events

    def _find_lost(self) -> list[HealthEvent]:
        """After "GPU is lost": the watched GPUs that no longer answer, each reported once."""
        events: list[HealthEvent] = []
        for uuid in self._watched():
            try:
                self._answering(uuid)
            except _CallError as err:
                self._lost.add(uuid)
                events.append(GpuLostEvent(HardwareRef(uuid), f"NVML {err}", time.time()))
        return events

    def _poll_thresholds(self) -> list[HealthEvent]:
        events: list[HealthEvent] = []
        for uuid in self._watched():
            try:
                handle = self._call("nvmlDeviceGetHandleByUUID", self._nvml.nvmlDeviceGetHandleByUUID, uuid)
                over = self._over_thresholds(handle)
            except _CallError as err:
                log.warning("polling GPU thresholds failed", gpu=uuid, error=str(err))
                continue
            events += [ThresholdEvent(HardwareRef(uuid), kind, detail, time.time()) for kind, detail in over]
        return events

    def _over_thresholds(self, handle: Any) -> list[tuple[ThresholdKind, str]]:
        """(kind, detail) for each configured limit the GPU is at or over."""
        nvml, limits = self._nvml, self._thresholds
        over: list[tuple[ThresholdKind, str]] = []
        if (max_celsius := limits.temperature_celsius) is not None:
            celsius = self._supported(
                "nvmlDeviceGetTemperature", nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU
            )
            if celsius is not None and celsius >= max_celsius:
                over.append(
                    ("temperature", f"temperature {celsius} °C at or over the limit of {max_celsius} °C")
                )
        if (max_errors := limits.uncorrected_ecc_errors) is not None:
            count = self._supported(
                "nvmlDeviceGetTotalEccErrors",
                nvml.nvmlDeviceGetTotalEccErrors,
                handle,
                nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                nvml.NVML_VOLATILE_ECC,
            )
            if count is not None and count >= max_errors:
                over.append(("ecc", f"{count} uncorrected ECC errors, at or over the limit of {max_errors}"))
        return over
