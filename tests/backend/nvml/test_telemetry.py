"""NvmlTelemetry over the real NVML code path (pynvml, ctypes) against the C fake NVML."""

from __future__ import annotations

from pathlib import Path

import pytest

from dradriver.backend.fake.discovery import inventory_from_profile
from dradriver.backend.fake.profile import load_builtin_profile
from dradriver.backend.nvml.telemetry import NvmlTelemetry
from dradriver.devicemodel import build_devices
from dradriver.telemetry.model import targets
from tests.backend.nvml.conftest import FakeNodeFactory
from tests.fakenvml.harness import IN_PROCESS_SONAME, build_library, compiler

GIB = 1024**3


@pytest.fixture(scope="session")
def in_process_nvml_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The C fake NVML with its telemetry calls, loaded into the test process."""
    if compiler() is None:
        pytest.skip("the C fake NVML needs a C compiler (cc)")
    return build_library(tmp_path_factory.mktemp("fakenvml-telemetry"), IN_PROCESS_SONAME, telemetry=True)


def test_nvml_figures_of_gpus_and_mig_devices(
    fake_node: FakeNodeFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inventory = inventory_from_profile(load_builtin_profile("dgx-a100-mig"), seed="dgx-a100-mig")
    node = fake_node(inventory)
    figures = tmp_path / "telemetry"
    figures.write_text(
        "util 6 75 40\npower 6 312000\nclocks 6 1410 1593\nreasons 6 68\nnvlink 6 12 4095\n"
        "proc 6 4242 10737418240 60\nproc 6 4343 2147483648 -1\n"
    )
    monkeypatch.setenv("FAKE_NVML_TELEMETRY", str(figures))
    library = node.open()
    try:
        devices = build_devices(library.discover(), driver_name="gpu.test")
        reader = NvmlTelemetry()
    finally:
        library.close()
    try:
        wanted = targets(devices.devices, [])
        by_device = {t.device: t for t in wanted}
        samples = reader.read(wanted)
        busy = samples[by_device["gpu-6"].uuid]
        assert (busy.sm_util_percent, busy.memory_util_percent) == (75, 40)
        assert (busy.fb_used_bytes, busy.fb_total_bytes) == (12 * GIB, by_device["gpu-6"].memory_bytes)
        assert busy.power_watts == 312
        assert (busy.sm_clock_hz, busy.memory_clock_hz) == (1410e6, 1593e6)
        assert busy.throttle_reasons == frozenset({"sw_power_cap", "hw_thermal_slowdown"})
        assert busy.nvlink_up == (True,) * 12
        assert busy.ecc_uncorrected == 0
        assert busy.processes is not None
        assert [(p.pid, p.used_bytes, p.sm_util_percent) for p in busy.processes] == [
            (4242, 10 * GIB, 60.0),
            (4343, 2 * GIB, None),  # no utilisation sample: memory only
        ]
        idle = samples[by_device["gpu-7"].uuid]
        assert (idle.sm_util_percent, idle.fb_used_bytes, idle.power_watts) == (0, 0, 70)
        assert idle.throttle_reasons == frozenset({"gpu_idle"})
        assert idle.nvlink_up == ()
        mig = next(t for t in wanted if t.kind == "mig")
        sample = samples[mig.uuid]
        # NVML keeps no utilisation, power or clocks of a MIG device: unknown, not zero
        assert (sample.sm_util_percent, sample.power_watts, sample.sm_clock_hz) == (None, None, None)
        assert (sample.fb_used_bytes, sample.fb_total_bytes) == (0, mig.memory_bytes)
        assert sample.processes == ()

        figures.write_text("util 6 5 1\n")  # a reader sees the figures change under it
        gpu6 = by_device["gpu-6"]
        assert reader.read([gpu6])[gpu6.uuid].sm_util_percent == 5

        unloaded = tmp_path / "unloaded"  # the host driver unloaded under the reader (an upgrade)
        monkeypatch.setenv("FAKE_NVML_UNLOADED", str(unloaded))
        unloaded.touch()
        assert reader.read([gpu6]) == {}
        assert reader.read([gpu6]) == {}  # still gone: NVML cannot be initialised yet
        unloaded.unlink()
        assert reader.read([gpu6])[gpu6.uuid].sm_util_percent == 5  # back, no new reader
    finally:
        reader.close()
