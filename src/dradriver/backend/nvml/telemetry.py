"""Telemetry of real GPUs through NVML (`pynvml`), with an NVML reference of its own.

Each figure is one NVML call; a call the device does not support (MIG devices have no
utilisation, power or clock counters of their own; consumer GPUs no ECC) leaves that figure
None, and a device that fails otherwise (lost, reset) is left out of this reading. When the host
driver was unloaded under us (an upgrade: "driver not loaded", "uninitialized"), the next reading
initialises NVML again first, so the telemetry comes back with the driver, with no restart.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pynvml

from dradriver import logs
from dradriver.backend.nvml.discovery import host_driver_gone, unsupported_as_none
from dradriver.telemetry.model import DeviceSample, ProcessSample, Target, throttle_names

#: NVML keeps at most this many NVLink links per GPU (NVML_NVLINK_MAX_LINKS).
_MAX_NVLINKS = 18
_T = TypeVar("_T")

log = logs.get_logger(component="telemetry", source="nvml")


class _DeviceGoneError(Exception):
    def __init__(self, message: str, *, driver_gone: bool = False) -> None:
        super().__init__(message)
        self.driver_gone = driver_gone


class NvmlTelemetry:
    """A `TelemetryReader` over NVML (loaded already by the discovery backend)."""

    def __init__(self) -> None:
        self._nvml: Any = pynvml
        pynvml.nvmlInit()
        self._handles: dict[str, Any] = {}
        self._last_seen: dict[str, int] = {}
        self._reinitialize = False

    def read(self, targets: Sequence[Target]) -> dict[str, DeviceSample]:
        nvml = self._nvml
        if self._reinitialize:
            try:
                nvml.nvmlInit()
            except nvml.NVMLError as err:
                log.debug("NVML cannot be initialised yet", error=str(err))
                return {}
            self._reinitialize = False
            self._handles.clear()
            self._last_seen.clear()
        samples = {}
        for target in targets:
            try:
                samples[target.uuid] = self._sample(target)
            except _DeviceGoneError as err:
                self._handles.pop(target.uuid, None)
                self._reinitialize = self._reinitialize or err.driver_gone
                log.debug("device not read", device=target.device, error=str(err))
        return samples

    def close(self) -> None:
        nvml = self._nvml
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as err:
            log.debug("NVML shutdown failed", error=str(err))

    def _handle(self, uuid: str) -> Any:
        if uuid not in self._handles:
            self._handles[uuid] = self._optional(self._nvml.nvmlDeviceGetHandleByUUID, uuid)
            if self._handles[uuid] is None:
                del self._handles[uuid]
                raise _DeviceGoneError(f"no NVML handle for {uuid}")
        return self._handles[uuid]

    def _optional(self, fn: Callable[..., _T], *args: Any) -> _T | None:
        nvml = self._nvml
        try:
            return unsupported_as_none(nvml, fn, *args)
        except nvml.NVMLError as err:
            raise _DeviceGoneError(f"{fn.__name__}: {err}", driver_gone=host_driver_gone(nvml, err)) from None

    def _sample(self, target: Target) -> DeviceSample:
        nvml, call = self._nvml, self._optional
        handle = self._handle(target.uuid)
        rates = call(nvml.nvmlDeviceGetUtilizationRates, handle)
        memory = call(nvml.nvmlDeviceGetMemoryInfo, handle)
        power = call(nvml.nvmlDeviceGetPowerUsage, handle)
        temperature = call(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
        sm_clock = call(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM)
        memory_clock = call(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_MEM)
        reasons = call(nvml.nvmlDeviceGetCurrentClocksEventReasons, handle)
        ecc = [
            call(nvml.nvmlDeviceGetTotalEccErrors, handle, kind, nvml.NVML_VOLATILE_ECC)
            for kind in (nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
        ]
        return DeviceSample(
            sm_util_percent=float(rates.gpu) if rates is not None else None,
            memory_util_percent=float(rates.memory) if rates is not None else None,
            fb_used_bytes=int(memory.used) if memory is not None else None,
            fb_total_bytes=int(memory.total) if memory is not None else None,
            power_watts=power / 1000 if power is not None else None,
            temperature_celsius=float(temperature) if temperature is not None else None,
            sm_clock_hz=sm_clock * 1e6 if sm_clock is not None else None,
            memory_clock_hz=memory_clock * 1e6 if memory_clock is not None else None,
            throttle_reasons=throttle_names(int(reasons)) if reasons is not None else None,
            ecc_corrected=ecc[0],
            ecc_uncorrected=ecc[1],
            nvlink_up=self._nvlinks(handle) if target.kind == "gpu" else None,
            processes=self._processes(target, handle),
        )

    def _nvlinks(self, handle: Any) -> tuple[bool, ...]:
        links = []
        for link in range(_MAX_NVLINKS):
            state = self._optional(self._nvml.nvmlDeviceGetNvLinkState, handle, link)
            if state is None:
                break
            links.append(bool(state))
        return tuple(links)

    def _processes(self, target: Target, handle: Any) -> tuple[ProcessSample, ...] | None:
        """The compute processes with their memory and, on a GPU, their SM share since the last
        reading (nvmlDeviceGetProcessUtilization keeps samples for a few seconds)."""
        nvml = self._nvml
        running = self._optional(nvml.nvmlDeviceGetComputeRunningProcesses, handle)
        if running is None:
            return None
        shares: dict[int, float] = {}
        if target.kind == "gpu":
            since = self._last_seen.get(target.uuid, 0)
            try:
                for entry in nvml.nvmlDeviceGetProcessUtilization(handle, since) or ():
                    shares[int(entry.pid)] = shares.get(int(entry.pid), 0.0) + float(entry.smUtil)
                    self._last_seen[target.uuid] = max(
                        self._last_seen.get(target.uuid, 0), int(entry.timeStamp)
                    )
            except nvml.NVMLError:
                pass  # no samples since the last reading (NOT_FOUND) or not supported: memory only
        return tuple(
            ProcessSample(
                int(p.pid),
                int(p.usedGpuMemory) if p.usedGpuMemory is not None else None,
                shares.get(int(p.pid)),
            )
            for p in running
        )
