"""Telemetry of fake GPUs: idle figures, and what `dradriver fake-event --utilization ...` set.

`<state-dir>/fake-telemetry.json` maps a published device name to the figures set for it (a
JSON object per device, each field optional); the reader reads it again whenever it changes.
Processes named there are real PIDs of this host, so a pod's process maps to the pod through
its cgroup exactly as on a real node.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dradriver import logs
from dradriver.telemetry.model import DeviceSample, ProcessSample, Target, throttle_names

FAKE_TELEMETRY_FILE = "fake-telemetry.json"
_IDLE_POWER_WATTS = 70.0
_IDLE_TEMPERATURE = 35.0
_SM_CLOCK_HZ = 1_980e6
_MEMORY_CLOCK_HZ = 2_619e6

log = logs.get_logger(component="telemetry", source="fake")

Percent = Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)]


class FakeProcess(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    pid: Annotated[int, Field(gt=0)]
    used_bytes: Annotated[int, Field(ge=0)] | None = None
    sm_util: Percent | None = None


class FakeFigures(BaseModel):
    """What was set for one fake device; unset fields keep the idle figures."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sm_util: Percent | None = None
    memory_util: Percent | None = None
    fb_used_bytes: Annotated[int, Field(ge=0)] | None = None
    power_watts: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    temperature_celsius: Annotated[float, Field(allow_inf_nan=False)] | None = None
    processes: tuple[FakeProcess, ...] = ()


def read_figures(path: Path) -> dict[str, FakeFigures]:
    """The file's figures by device; raises ValueError (naming the device) if it is malformed."""
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: not a JSON object of devices")
    figures = {}
    for device, value in raw.items():
        try:
            figures[str(device)] = FakeFigures.model_validate(value)
        except ValidationError as err:
            raise ValueError(f"{path}: device {device!r}: {err.errors()[0]['msg']}") from None
    return figures


def write_figures(path: Path, figures: Mapping[str, FakeFigures]) -> None:
    """Replace the file atomically (the reader never sees half of it)."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp.write_text(
        json.dumps({d: f.model_dump(exclude_none=True) for d, f in sorted(figures.items())}, indent=1)
    )
    temp.replace(path)


def sample(figures: FakeFigures | None, target: Target) -> DeviceSample:
    """What NVML would report: a MIG device has memory and processes, no counters of its own."""
    figures = figures or FakeFigures()
    fb_total_bytes = target.memory_bytes
    sm = figures.sm_util if figures.sm_util is not None else 0.0
    used = figures.fb_used_bytes
    if used is None:
        used = sum(p.used_bytes or 0 for p in figures.processes)
    processes = tuple(ProcessSample(p.pid, p.used_bytes, p.sm_util) for p in figures.processes)
    if target.kind == "mig":
        return DeviceSample(
            fb_used_bytes=min(used, fb_total_bytes),
            fb_total_bytes=fb_total_bytes,
            processes=tuple(ProcessSample(p.pid, p.used_bytes) for p in processes),
        )
    return DeviceSample(
        sm_util_percent=sm,
        memory_util_percent=figures.memory_util if figures.memory_util is not None else 0.0,
        fb_used_bytes=min(used, fb_total_bytes),
        fb_total_bytes=fb_total_bytes,
        power_watts=figures.power_watts if figures.power_watts is not None else _IDLE_POWER_WATTS,
        temperature_celsius=(
            figures.temperature_celsius if figures.temperature_celsius is not None else _IDLE_TEMPERATURE
        ),
        sm_clock_hz=_SM_CLOCK_HZ,
        memory_clock_hz=_MEMORY_CLOCK_HZ,
        throttle_reasons=throttle_names(0x1 if sm == 0 else 0),
        ecc_corrected=0,
        ecc_uncorrected=0,
        nvlink_up=(),
        processes=processes,
    )


class FakeTelemetry:
    """A `TelemetryReader` for fake GPUs."""

    def __init__(self, state_dir: Path) -> None:
        self._path = state_dir / FAKE_TELEMETRY_FILE
        self._stamp: tuple[int, int, int] | None = None
        self._figures: dict[str, FakeFigures] = {}

    def read(self, targets: Sequence[Target]) -> dict[str, DeviceSample]:
        self._refresh()
        return {t.uuid: sample(self._figures.get(t.device), t) for t in targets}

    def _refresh(self) -> None:
        try:
            st = self._path.stat()
            stamp: tuple[int, int, int] | None = (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            stamp = None
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            self._figures = read_figures(self._path)
        except (OSError, ValueError) as err:
            log.warning("fake telemetry file unusable; keeping the previous figures", error=str(err))

    def close(self) -> None:
        """Nothing to release."""
