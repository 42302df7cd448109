"""The monitor with a scripted source and a hand-driven clock: events to board, taints, file, Events."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from dradriver.backend.select import open_backend
from dradriver.devicemodel import build_devices
from dradriver.health.board import Health, HealthBoard
from dradriver.health.config import HealthConfig
from dradriver.health.effects import BoardSink, HealthFileSink, NodeEventSink, Taints, TaintSink
from dradriver.health.events import GpuLostEvent, HardwareRef, HealthEvent, XidEvent
from dradriver.health.monitor import HealthMonitor
from dradriver.health.targets import HealthTargets

DRIVER = "gpu.dradriver.dev"
AT = 1_717_243_200.0


class ScriptedSource:
    name = "scripted"

    def __init__(self, unmonitored: Mapping[str, str] | None = None) -> None:
        self.queued: list[HealthEvent] = []
        self.failures: dict[str, str] = {}
        self.checks: list[str] = []
        self._unmonitored = dict(unmonitored or {})
        self.closed = False
        self.watched: list[tuple[str, ...]] = []
        self.driver_gone: str | None = None

    def unmonitored(self) -> Mapping[str, str]:
        return self._unmonitored

    def next_events(self, timeout: float) -> list[HealthEvent]:
        events, self.queued = self.queued, []
        return events

    def check(self, gpu_uuid: str) -> str | None:
        self.checks.append(gpu_uuid)
        return self.failures.get(gpu_uuid)

    def watch(self, gpu_uuids: Sequence[str]) -> None:
        self.watched.append(tuple(gpu_uuids))

    def driver_problem(self) -> str | None:
        return self.driver_gone

    def close(self) -> None:
        self.closed = True


class Counters:
    def __init__(self) -> None:
        self.xids: list[tuple[int, str]] = []

    def xid(self, code: int, xid_class: str) -> None:
        self.xids.append((code, xid_class))

    def nvml_error(self, call: str) -> None:
        raise AssertionError("no NVML here")


class Sent:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def send(self, reason: str, message: str, event_type: str) -> None:
        self.events.append((reason, message, event_type))


class Rig:
    """A monitor over the dgx-a100-mig node (MIG devices) with every sink and a manual clock."""

    def __init__(self, tmp_path: Path, config: HealthConfig, source: ScriptedSource) -> None:
        devices = build_devices(open_backend("dgx-a100-mig").discover(), driver_name=DRIVER)
        self.targets = HealthTargets(devices.devices)
        self.board = HealthBoard()
        self.board.set_devices(("node-1", d.name) for d in devices.devices)
        self.source = source
        self.now = 1000.0
        self.resyncs = 0
        self.sent = Sent()
        self.counters = Counters()
        self.taints = Taints(DRIVER, config.taint_effect)
        self.file = HealthFileSink(tmp_path, self.board, source.name)
        self.monitor = HealthMonitor(
            source=source,
            targets=self.targets,
            config=config,
            sinks=[
                BoardSink(self.board, "node-1"),
                TaintSink(self.taints, on_change=self._resync),
                self.file,
                NodeEventSink(self.sent, DRIVER, config.taint_effect),
            ],
            metrics=self.counters,
            clock=lambda: self.now,
            wall=lambda: AT + self.now,
        )

    def _resync(self) -> None:
        self.resyncs += 1

    def gpu(self, index: int) -> str:
        return self.targets.gpu_uuids[index]

    def health(self) -> dict[str, tuple[Health, str]]:
        return {d.device_name: (d.health, d.message) for d in self.board.snapshot()[1]}

    def step(self, *events: HealthEvent) -> None:
        self.source.queued += events
        self.monitor.step(0)


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    config = HealthConfig.model_validate({"quietPeriodSeconds": 60, "recheckIntervalSeconds": 10})
    return Rig(tmp_path, config, ScriptedSource())


def test_fatal_xid_on_a_gpu_takes_all_its_mig_devices_out_and_they_come_back(rig: Rig) -> None:
    rig.monitor.start()
    rig.monitor.stop()  # the thread is not needed: the test steps by hand
    first = json.loads(rig.file.path.read_text())["devices"][0]
    assert first == {
        "device": "gpu-0-mig-1g10gb-6",
        "pool": "node-1",
        "health": "HEALTHY",
        "lastUpdated": first["lastUpdated"],
        "message": "",
    }
    rig.step(XidEvent(HardwareRef(rig.gpu(1)), 79, AT))
    unhealthy = {name for name, (health, _) in rig.health().items() if health is Health.UNHEALTHY}
    assert unhealthy == {"gpu-1-mig-3g40gb-0", "gpu-1-mig-2g20gb-4", "gpu-1-mig-1g10gb-6"}
    assert (
        rig.health()["gpu-1-mig-1g10gb-6"][1] == "XID 79 (GPU has fallen off the bus) at 2024-06-01T12:00:00Z"
    )
    assert rig.counters.xids == [(79, "fatal")]
    assert rig.resyncs == 1
    assert rig.taints.taints() == {
        name: {"key": "gpu.dradriver.dev/unhealthy", "value": "79", "effect": "NoSchedule"}
        for name in unhealthy
    }
    assert rig.sent.events == [
        (
            "DeviceUnhealthy",
            "gpu-1-mig-3g40gb-0, gpu-1-mig-2g20gb-4, gpu-1-mig-1g10gb-6 (3 devices): XID 79 (GPU has fallen "
            "off the bus) at 2024-06-01T12:00:00Z; tainted gpu.dradriver.dev/unhealthy=79:NoSchedule",
            "Warning",
        )
    ]
    report = {d["device"]: d for d in json.loads(rig.file.path.read_text())["devices"]}
    assert report["gpu-1-mig-2g20gb-4"]["health"] == "UNHEALTHY"
    assert report["gpu-1-mig-2g20gb-4"]["reason"] == "79"
    assert "reason" not in report["gpu-0-mig-2g20gb-4"]

    rig.now += 59
    rig.step()
    assert rig.source.checks == []  # still inside the quiet period
    rig.now += 1
    rig.step()
    assert rig.source.checks == [rig.gpu(1)]  # one re-check for the GPU, not one per device
    assert all(health is Health.HEALTHY for health, _ in rig.health().values())
    assert rig.health()["gpu-1-mig-3g40gb-0"][1].startswith("healthy again at 2024-06-01T12:17:40Z")
    assert rig.taints.taints() == {}
    assert rig.resyncs == 2
    assert [e[0] for e in rig.sent.events] == ["DeviceUnhealthy", "DeviceHealthy"]
    assert rig.sent.events[1][2] == "Normal"


def test_mig_event_takes_out_only_its_instance(rig: Rig) -> None:
    rig.step(XidEvent(HardwareRef(rig.gpu(2), 5, 0), 94, AT))
    assert [name for name, (health, _) in rig.health().items() if health is Health.UNHEALTHY] == [
        "gpu-2-mig-2g20gb-4"
    ]


def test_non_fatal_xids_are_counted_and_change_nothing(rig: Rig) -> None:
    before = rig.board.snapshot()
    rig.step(XidEvent(HardwareRef(rig.gpu(0)), 13, AT), XidEvent(HardwareRef(rig.gpu(0)), 63, AT))
    assert rig.board.snapshot() == before
    assert rig.counters.xids == [(13, "application"), (63, "informational")]
    assert rig.sent.events == []
    assert rig.resyncs == 0


def test_event_on_hardware_nothing_publishes_is_dropped(rig: Rig) -> None:
    before = rig.board.snapshot()
    rig.step(XidEvent(HardwareRef("GPU-not-ours"), 79, AT), XidEvent(HardwareRef(rig.gpu(0), 9, 9), 79, AT))
    assert rig.board.snapshot() == before
    assert rig.counters.xids == [(79, "fatal"), (79, "fatal")]


def test_failing_recheck_keeps_the_taint_and_retries(rig: Rig) -> None:
    gpu = rig.gpu(3)
    rig.source.failures[gpu] = "NVML nvmlDeviceGetHandleByUUID: GPU is lost"
    rig.step(GpuLostEvent(HardwareRef(gpu), "NVML GPU is lost", AT))
    rig.now += 60
    rig.step()
    message = rig.health()["gpu-3-mig-3g40gb-0"][1]
    assert message.endswith("failed: NVML nvmlDeviceGetHandleByUUID: GPU is lost")
    assert rig.taints.taints()["gpu-3-mig-3g40gb-0"]["value"] == "gpu-lost"
    assert [e[0] for e in rig.sent.events] == ["DeviceUnhealthy"]  # a new message is not a new transition
    rig.now += 10
    del rig.source.failures[gpu]
    rig.step()
    assert rig.source.checks == [gpu, gpu]
    assert rig.health()["gpu-3-mig-3g40gb-0"][0] is Health.HEALTHY


def test_unmonitored_gpus_are_reported_unknown(tmp_path: Path) -> None:
    probe = Rig(tmp_path, HealthConfig(), ScriptedSource())
    source = ScriptedSource({probe.gpu(4): "nvmlDeviceRegisterEvents: Not Supported"})
    rig = Rig(tmp_path, HealthConfig(), source)
    rig.monitor.start()
    rig.monitor.stop()
    assert source.closed
    unknown = {name: message for name, (health, message) in rig.health().items() if health is Health.UNKNOWN}
    assert unknown == dict.fromkeys(
        rig.targets.devices_on(rig.gpu(4)), "health is not monitored: nvmlDeviceRegisterEvents: Not Supported"
    )
    assert len(unknown) == 7
    assert rig.taints.taints() == {}  # not known to be broken: no taint
    assert [e[0] for e in rig.sent.events] == ["DeviceHealthUnknown"]


def test_noexecute_taints_when_configured(tmp_path: Path) -> None:
    rig = Rig(tmp_path, HealthConfig(taint_effect="NoExecute"), ScriptedSource())
    rig.step(XidEvent(HardwareRef(rig.gpu(0)), 48, AT))
    assert {t["effect"] for t in rig.taints.taints().values()} == {"NoExecute"}
    assert rig.sent.events[0][1].endswith("tainted gpu.dradriver.dev/unhealthy=48:NoExecute")


def test_a_failing_sink_does_not_stop_the_others(rig: Rig, tmp_path: Path) -> None:
    rig.file.path = tmp_path / "missing-dir-is-a-file" / "health.json"
    (tmp_path / "missing-dir-is-a-file").write_text("in the way")
    rig.step(XidEvent(HardwareRef(rig.gpu(0)), 79, AT))
    assert rig.health()["gpu-0-mig-3g40gb-0"][0] is Health.UNHEALTHY
    assert rig.sent.events


def test_retarget_forgets_dropped_devices_and_keeps_gone_ones_unhealthy(rig: Rig) -> None:
    """The live inventory changed the published devices: a dropped device's taint goes, a device
    kept although its hardware vanished is unhealthy (stream, taint, Event) until it is dropped."""
    from dradriver.health.policy import DEVICE_GONE, Problem

    rig.monitor.start()
    rig.monitor.stop()
    published = list(build_devices(open_backend("dgx-a100-mig").discover(), driver_name=DRIVER).devices)
    first, dropped = published[0].name, published[-1].name
    rig.step(XidEvent(HardwareRef(rig.targets.gpu_of(dropped)), 79, AT))
    assert dropped in rig.taints.taints()

    gone = Problem(DEVICE_GONE, f"MIG device of {first} is no longer on the node")
    rig.board.set_devices(("node-1", d.name) for d in published[:-1])
    rig.monitor.retarget(published[:-1], {first: gone})
    assert dropped not in rig.taints.taints()
    assert rig.taints.taints()[first]["value"] == DEVICE_GONE
    assert rig.health()[first] == (Health.UNHEALTHY, gone.message)
    assert rig.sent.events[-1][0] == "DeviceUnhealthy"
    rig.step()
    assert rig.source.watched == [rig.targets.gpu_uuids]
    rig.now += 10_000  # no re-check ever clears a device whose hardware is gone
    rig.step()
    assert rig.health()[first][0] == Health.UNHEALTHY

    rig.board.set_devices(("node-1", d.name) for d in published[1:-1])
    rig.monitor.retarget(published[1:-1], {})
    assert first not in rig.taints.taints()


def test_while_the_host_driver_is_gone_every_device_is_unhealthy_and_none_is_rechecked(rig: Rig) -> None:
    rig.source.driver_gone = "the host driver is not available: nvmlEventSetWait: Driver Not Loaded"
    rig.step()
    health = rig.health()
    assert {h for h, _ in health.values()} == {Health.UNHEALTHY}
    assert {m for _, m in health.values()} == {rig.source.driver_gone}
    rig.now += 3600  # long past any quiet period: nothing is re-checked while the driver is gone
    rig.step()
    assert rig.source.checks == []
    assert {h for h, _ in rig.health().values()} == {Health.UNHEALTHY}
    rig.source.driver_gone = None
    rig.step()
    assert {h for h, _ in rig.health().values()} == {Health.HEALTHY}
    assert all("back on the node" in m for _, m in rig.health().values())
