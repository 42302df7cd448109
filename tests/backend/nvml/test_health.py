"""The NVML health source: the real pynvml event path (event set, register, wait) against the C fake."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from dradriver.backend.nvml.health import NvmlHealthSource
from dradriver.backend.select import open_backend
from dradriver.devicemodel import build_devices
from dradriver.health.board import Health
from dradriver.health.config import Thresholds
from dradriver.health.events import (
    GpuLostEvent,
    HardwareRef,
    RecoveryEvent,
    SourceOptions,
    ThresholdEvent,
    XidEvent,
)
from dradriver.health.recovery import RecoveryAction
from dradriver.health.targets import HealthTargets
from tests.fakenvml.harness import CONFIG_ENV, EVENTS_ENV, NVML_ERROR_UNKNOWN, EventPipe, Failure, config_text
from tests.helpers import DRIVER, HealthStream, ServeProcess, short_tmpdir, wait_for

from .conftest import FakeNode, FakeNodeFactory

NVML_ERROR_NOT_SUPPORTED = 3


class Errors:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def xid(self, code: int, xid_class: str) -> None:
        raise AssertionError("sources do not classify")

    def nvml_error(self, call: str) -> None:
        self.calls.append(call)


@pytest.fixture
def pipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[EventPipe]:
    events = EventPipe(tmp_path / "nvml-events")
    monkeypatch.setenv(EVENTS_ENV, str(events.path))
    yield events
    events.close()


def open_source(
    node: FakeNode, thresholds: Thresholds | None = None, errors: Errors | None = None
) -> tuple[NvmlHealthSource, HealthTargets]:
    """Discover through NVML (as serve does, library closed afterwards), then watch the result."""
    library = node.open()
    try:
        inventory = library.discover()
    finally:
        library.close()
    targets = HealthTargets(build_devices(inventory, driver_name="gpu.dradriver.dev").devices)
    options = SourceOptions(node.config.parent, thresholds or Thresholds(), errors or Errors())
    source = library.health_source(targets, options)
    assert isinstance(source, NvmlHealthSource)
    return source, targets


def test_xid_events_name_the_gpu_or_the_mig_instance(fake_node: FakeNodeFactory, pipe: EventPipe) -> None:
    inventory = open_backend("dgx-a100-mig").discover()
    source, targets = open_source(fake_node(inventory))
    try:
        assert source.unmonitored() == {}
        assert source.next_events(0.05) == []  # a wait that times out is no event
        pipe.send("xid 2 79", "xid 0 31 5 0")
        (whole,) = source.next_events(5)
        assert isinstance(whole, XidEvent)
        assert (whole.xid, whole.where) == (
            79,
            HardwareRef(inventory.gpus[2].uuid),
        )
        (mig,) = source.next_events(5)
        assert isinstance(mig, XidEvent)
        assert mig.where == HardwareRef(inventory.gpus[0].uuid, 5, 0)
        assert targets.devices_for(mig.where) == ("gpu-0-mig-2g20gb-4",)
    finally:
        source.close()


def test_gpus_that_cannot_register_are_unmonitored(fake_node: FakeNodeFactory, pipe: EventPipe) -> None:
    inventory = open_backend("t4x4").discover()
    node = fake_node(inventory, [Failure("nvmlDeviceRegisterEvents", NVML_ERROR_NOT_SUPPORTED, gpu=1)])
    errors = Errors()
    source, _ = open_source(node, errors=errors)
    try:
        assert source.unmonitored() == {inventory.gpus[1].uuid: "nvmlDeviceRegisterEvents: Not Supported"}
        assert errors.calls == ["nvmlDeviceRegisterEvents"]
        pipe.send("xid 1 79", "xid 3 48")  # GPU 1 never registered: NVML delivers nothing for it
        (event,) = source.next_events(5)
        assert isinstance(event, XidEvent)
        assert event.xid == 48
    finally:
        source.close()


def test_no_event_set_leaves_every_gpu_unmonitored(fake_node: FakeNodeFactory, pipe: EventPipe) -> None:
    inventory = open_backend("t4x4").discover()
    node = fake_node(inventory, [Failure("nvmlEventSetCreate", NVML_ERROR_UNKNOWN)])
    source, _ = open_source(node)
    try:
        assert set(source.unmonitored().values()) == {"nvmlEventSetCreate: Unknown Error"}
        assert source.next_events(0.01) == []
    finally:
        source.close()


def test_lost_gpu_is_found_reported_once_and_recovers_by_recheck(
    fake_node: FakeNodeFactory, pipe: EventPipe
) -> None:
    inventory = open_backend("t4x4").discover()
    source, _ = open_source(fake_node(inventory))
    lost_uuid = inventory.gpus[3].uuid
    try:
        pipe.send("lost 3")
        (event,) = source.next_events(5)
        assert event == GpuLostEvent(
            HardwareRef(lost_uuid), "NVML nvmlDeviceGetHandleByUUID: GPU is lost", event.at
        )
        assert source.check(lost_uuid) == "NVML nvmlDeviceGetHandleByUUID: GPU is lost"
        assert source.check(inventory.gpus[0].uuid) is None
        pipe.send("lost 3")  # NVML says "lost" again: nothing new to report
        assert source.next_events(0.2) == []
        pipe.send("found 3")
        assert source.next_events(0.05) == []
        assert source.check(lost_uuid) is None
        pipe.send("xid 3 74")  # registered again after recovering
        (again,) = source.next_events(5)
        assert isinstance(again, XidEvent)
        assert again.where == HardwareRef(lost_uuid)
    finally:
        source.close()


def test_recheck_fails_while_a_row_remap_is_pending(fake_node: FakeNodeFactory, pipe: EventPipe) -> None:
    inventory = open_backend("dgx-h100").discover()
    source, _ = open_source(fake_node(inventory))
    uuid = inventory.gpus[5].uuid
    try:
        pipe.send("remap 5 1 0")
        assert source.next_events(0.05) == []
        assert source.check(uuid) == "row remapping pending: the GPU needs a reset"
        pipe.send("remap 5 0 1")
        source.next_events(0.05)
        assert source.check(uuid) == "row remapping failed: the GPU's memory needs service"
        pipe.send("remap 5 0 0")
        source.next_events(0.05)
        assert source.check(uuid) is None
    finally:
        source.close()


def test_xids_carry_the_recovery_action_and_the_recheck_asks_it(
    fake_node: FakeNodeFactory, pipe: EventPipe
) -> None:
    inventory = open_backend("dgx-a100-mig").discover()
    errors = Errors()
    source, _ = open_source(fake_node(inventory), errors=errors)
    uuid = inventory.gpus[1].uuid
    try:
        # A host driver without the field (NOT_SUPPORTED): no action travels, the table decides.
        pipe.send("xid 1 79")
        (old,) = source.next_events(5)
        assert isinstance(old, XidEvent)
        assert old.recovery is None
        assert source.check(uuid) is None
        # One with it: the action NVML reports right after the XID (here a MIG device's).
        pipe.send("recovery 1 1", "xid 1 13 3 0")
        (reset,) = source.next_events(5)
        assert isinstance(reset, XidEvent)
        assert (reset.where, reset.recovery) == (HardwareRef(uuid, 3, 0), RecoveryAction.GPU_RESET)
        assert source.check(uuid) == "GPU reset needed (NVML recovery action)"
        pipe.send("recovery 1 2")
        source.next_events(0.05)
        assert source.check(uuid) == "node reboot needed (NVML recovery action)"
        pipe.send("recovery 1 0", "xid 1 79")
        (fine,) = source.next_events(5)
        assert isinstance(fine, XidEvent)
        assert fine.recovery == RecoveryAction.NONE
        assert source.check(uuid) is None
        assert errors.calls == []
    finally:
        source.close()


def test_a_gpu_needing_a_recovery_action_is_reported_when_first_watched(
    fake_node: FakeNodeFactory, pipe: EventPipe
) -> None:
    inventory = open_backend("t4x4").discover()
    source, targets = open_source(fake_node(inventory))
    watched = targets.gpu_uuids
    try:
        source.watch(watched[:2])  # the inventory shrank to two GPUs
        pipe.send("recovery 2 2")
        assert source.next_events(0.05) == []  # a changed action alone is no event
        source.watch(watched)  # ... and grew again: GPU 2 still needs its node reboot
        (found,) = source.next_events(0.05)
        assert isinstance(found, RecoveryEvent)
        assert found.where == HardwareRef(inventory.gpus[2].uuid)
        assert found.action == RecoveryAction.NODE_REBOOT
        assert source.next_events(0.05) == []  # reported once
    finally:
        source.close()


def test_a_failing_recovery_query_leaves_the_xid_to_the_table(
    fake_node: FakeNodeFactory, pipe: EventPipe
) -> None:
    inventory = open_backend("t4x4").discover()
    errors = Errors()
    node = fake_node(inventory, [Failure("nvmlDeviceGetFieldValues", NVML_ERROR_UNKNOWN)])
    source, _ = open_source(node, errors=errors)
    try:
        pipe.send("recovery 0 1", "xid 0 79")
        (event,) = source.next_events(5)
        assert isinstance(event, XidEvent)
        assert event.recovery is None
        assert source.check(inventory.gpus[0].uuid) == "NVML nvmlDeviceGetFieldValues: Unknown Error"
        # Four GPUs asked when first watched, then the XID's and the re-check's.
        assert errors.calls == ["nvmlDeviceGetFieldValues"] * 6
    finally:
        source.close()


def test_thresholds_are_polled_and_rechecked(fake_node: FakeNodeFactory, pipe: EventPipe) -> None:
    inventory = open_backend("t4x4").discover()
    thresholds = Thresholds(temperature_celsius=90, uncorrected_ecc_errors=2, poll_interval_seconds=1)
    source, _ = open_source(fake_node(inventory), thresholds)
    hot, flaky = inventory.gpus[0].uuid, inventory.gpus[2].uuid
    try:
        assert source.next_events(0.01) == []  # first poll: all within limits
        pipe.send("temp 0 95", "ecc 2 3")
        events: list[ThresholdEvent] = []
        for _ in range(30):  # the next poll is due within a second
            events += [e for e in source.next_events(0.2) if isinstance(e, ThresholdEvent)]
            if events:
                break
        assert [(e.where, e.kind, e.detail) for e in events] == [
            (HardwareRef(hot), "temperature", "temperature 95 °C at or over the limit of 90 °C"),
            (HardwareRef(flaky), "ecc", "3 uncorrected ECC errors, at or over the limit of 2"),
        ]
        assert source.check(hot) == "temperature 95 °C at or over the limit of 90 °C"
        pipe.send("temp 0 60")
        source.next_events(0.05)
        assert source.check(hot) is None
    finally:
        source.close()


def test_serve_on_nvml_reports_an_xid_from_the_event_wait(fake_nvml_library: Path, tmp_path: Path) -> None:
    """`serve` without --fake-gpus: discovery and events through pynvml and the C fake, end to end."""
    inventory = open_backend("t4x4").discover()
    config = tmp_path / "nvml.conf"
    config.write_text(config_text(inventory))
    events = EventPipe(tmp_path / "nvml-events")
    env = {
        "LD_LIBRARY_PATH": str(fake_nvml_library.parent),
        CONFIG_ENV: str(config),
        EVENTS_ENV: str(events.path),
    }
    with short_tmpdir() as root:
        serve = ServeProcess(root, [], env, fake_gpus=None).start()
        stream = HealthStream(serve.dra_socket)
        try:
            wait_for(lambda: len(stream.latest) == 4, 20, f"the device list (log: {serve.log()})")
            report = serve.plugins_dir / DRIVER / "health.json"
            wait_for(report.exists, 10, "health.json")
            assert json.loads(report.read_text())["source"] == "nvml"
            events.send("xid 2 13", "xid 1 95")
            assert stream.wait("gpu-1", Health.UNHEALTHY).startswith("XID 95 (Uncontained ECC error) at ")
            assert stream.latest["gpu-2"][0] == Health.HEALTHY
            # The first rescan (kicked once the driver is ready) may come after the loss and drop
            # the lost GPU, which no claim holds, from the published set right after the report.
            before_loss = len(stream.responses)
            events.send("lost 3")
            assert stream.wait("gpu-3", Health.UNHEALTHY, since=before_loss).startswith(
                "GPU lost (NVML nvmlDeviceGetHandleByUUID: GPU is lost) at "
            )
        finally:
            stream.close()
            serve.kill()
            events.close()
