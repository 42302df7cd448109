"""The kubelet response contract, enforced whatever the driver does, over real unix sockets."""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import grpc
import pytest

from dradriver import logs
from dradriver.health.board import Health, HealthBoard
from dradriver.kubeletclient import DRAClient
from dradriver.plugin.dra import BuiltParts, DRAService, built
from dradriver.plugin.driver import CallError, ClaimRef, Driver, PreparedDevice, PrepareResult
from dradriver.plugin.registration import RegistrationState
from dradriver.plugin.server import PluginPaths, PluginServer
from tests.helpers import short_tmpdir, wait_for

A = ClaimRef("ns", "a", "00000000-0000-4000-8000-00000000000a")
B = ClaimRef("ns", "b", "00000000-0000-4000-8000-00000000000b")


class ScriptedDriver:
    """Answers from a script so each contract rule can be provoked."""

    def __init__(self) -> None:
        self.prepare_results: dict[str, PrepareResult] = {}
        self.unprepare_errors: dict[str, str] = {}
        self.raise_error: BaseException | None = None
        self.delay = 0.0
        self.calls = 0

    def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        self.calls += 1
        time.sleep(self.delay)
        if self.raise_error is not None:
            raise self.raise_error
        return self.prepare_results

    def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        return self.unprepare_errors


class InProcessPlugin:
    def __init__(self, root: Path, driver: Driver) -> None:
        self.board = HealthBoard()
        self.paths = PluginPaths.for_driver("gpu.dradriver.dev", root / "plugins", root / "registry")
        self.server = PluginServer(
            self.paths,
            "gpu.dradriver.dev",
            DRAService(built(driver)),
            self.board,
            RegistrationState(),
            watch_interval=0.1,
        )


@pytest.fixture
def driver() -> ScriptedDriver:
    return ScriptedDriver()


@pytest.fixture
def plugin(driver: ScriptedDriver) -> Iterator[InProcessPlugin]:
    with short_tmpdir() as root:
        plugin = InProcessPlugin(root, driver)
        plugin.server.start()
        try:
            yield plugin
        finally:
            plugin.server.stop(grace=0)


def test_missing_entries_are_filled_and_unknown_ones_dropped(
    plugin: InProcessPlugin, driver: ScriptedDriver
) -> None:
    driver.prepare_results = {"someone-else": PrepareResult(), A.uid: PrepareResult()}
    with DRAClient(plugin.paths.dra_socket) as client:
        response = client.prepare([A, B])
    assert set(response.claims) == {A.uid, B.uid}
    assert response.claims[A.uid].error == ""
    assert response.claims[B.uid].error == "internal error: driver returned no result for claim ns/b"
    driver.unprepare_errors = {B.uid: "busy", "x": ""}
    with DRAClient(plugin.paths.dra_socket) as client:
        unprepared = client.unprepare([A, B])
    assert {uid: e.error for uid, e in unprepared.claims.items()} == {
        A.uid: "internal error: driver returned no result for claim ns/a",
        B.uid: "busy",
    }


def test_request_names_are_base_names_and_share_id_is_v1_only(
    plugin: InProcessPlugin, driver: ScriptedDriver
) -> None:
    device = PreparedDevice(
        pool_name="node-1",
        device_name="gpu-0",
        request_names=("gpu/h100", "gpu/a100", "other"),
        cdi_device_ids=("k8s.gpu.dradriver.dev/claim=x-gpu-0",),
        share_id="11111111-2222-4333-8444-555555555555",
    )
    driver.prepare_results = {A.uid: PrepareResult(devices=(device,))}
    with DRAClient(plugin.paths.dra_socket, "v1.DRAPlugin") as v1_client:
        (v1_device,) = v1_client.prepare([A]).claims[A.uid].devices
    assert list(v1_device.request_names) == ["gpu", "other"]
    assert v1_device.pool_name == "node-1"
    assert v1_device.device_name == "gpu-0"
    assert list(v1_device.cdi_device_ids) == ["k8s.gpu.dradriver.dev/claim=x-gpu-0"]
    assert v1_device.HasField("share_id")
    assert v1_device.share_id == device.share_id
    with DRAClient(plugin.paths.dra_socket, "v1beta1.DRAPlugin") as beta_client:
        (beta_device,) = beta_client.prepare([A]).claims[A.uid].devices
    assert list(beta_device.request_names) == ["gpu", "other"]
    assert "share_id" not in beta_device.DESCRIPTOR.fields_by_name
    assert b"11111111-2222" not in beta_device.SerializeToString()  # no share_id smuggled as unknown field


def test_per_claim_errors_carry_no_devices(plugin: InProcessPlugin, driver: ScriptedDriver) -> None:
    device = PreparedDevice("node-1", "gpu-0", (), ())
    driver.prepare_results = {A.uid: PrepareResult(devices=(device,), error="boom")}
    with DRAClient(plugin.paths.dra_socket) as client:
        entry = client.prepare([A]).claims[A.uid]
    assert entry.error == "boom"
    assert list(entry.devices) == []


def test_call_error_fails_the_whole_call(plugin: InProcessPlugin, driver: ScriptedDriver) -> None:
    driver.raise_error = CallError("get resource claims: claim ns/a got replaced")
    with DRAClient(plugin.paths.dra_socket) as client, pytest.raises(grpc.RpcError) as caught:
        client.prepare([A])
    assert caught.value.code() == grpc.StatusCode.UNKNOWN
    assert caught.value.details() == "get resource claims: claim ns/a got replaced"


def test_a_driver_crash_is_an_internal_error_not_a_dead_daemon(
    plugin: InProcessPlugin, driver: ScriptedDriver
) -> None:
    driver.raise_error = ZeroDivisionError("division by zero")
    with DRAClient(plugin.paths.dra_socket) as client:
        with pytest.raises(grpc.RpcError) as caught:
            client.prepare([A])
        assert caught.value.code() == grpc.StatusCode.INTERNAL
        assert "division by zero" in str(caught.value.details())
        driver.raise_error = None
        driver.prepare_results = {A.uid: PrepareResult()}
        assert client.prepare([A]).claims[A.uid].error == ""


def test_stop_lets_in_flight_calls_finish_then_removes_everything(driver: ScriptedDriver) -> None:
    driver.delay = 1.0
    driver.prepare_results = {A.uid: PrepareResult()}
    with short_tmpdir() as root:
        plugin = InProcessPlugin(root, driver)
        plugin.server.start()
        outcome: dict[str, object] = {}

        def call() -> None:
            with DRAClient(plugin.paths.dra_socket) as client:
                outcome["response"] = client.prepare([A])

        caller = threading.Thread(target=call)
        caller.start()
        wait_for(lambda: driver.calls == 1, 5, "the call to reach the driver")
        plugin.server.stop(grace=10)
        caller.join()
        assert outcome["response"].claims[A.uid].error == ""  # type: ignore[attr-defined]
        assert not plugin.paths.dra_socket.exists()
        assert not plugin.paths.registration_socket.exists()
        assert not plugin.paths.lock_file.exists()


def test_health_stream_follows_the_board_and_ends_on_stop(driver: ScriptedDriver) -> None:
    with short_tmpdir() as root:
        plugin = InProcessPlugin(root, driver)
        plugin.board.set_devices([("node-1", "gpu-0"), ("node-1", "gpu-1")])
        plugin.server.start()
        client = DRAClient(plugin.paths.dra_socket)
        stream = iter(client.watch_health(timeout=30))
        first = next(stream)
        assert [(d.device.device_name, d.health) for d in first.devices] == [("gpu-0", 1), ("gpu-1", 1)]
        assert all(d.health_check_timeout_seconds == 60 and d.last_updated_time > 0 for d in first.devices)
        plugin.board.update("node-1", "gpu-1", Health.UNHEALTHY, "XID 79")
        second = next(stream)
        assert [(d.device.device_name, d.health, d.message) for d in second.devices] == [
            ("gpu-0", 1, ""),
            ("gpu-1", 2, "XID 79"),
        ]
        started = time.monotonic()
        plugin.server.stop(grace=10)
        assert list(stream) == []  # the stream ends cleanly instead of holding up shutdown
        assert time.monotonic() - started < 5
        client.close()


def test_calls_wait_for_the_node_to_be_built_and_answer_its_failure() -> None:
    parts: Future[BuiltParts] = Future()
    real = ScriptedDriver()
    real.prepare_results = {A.uid: PrepareResult()}
    threading.Timer(0.2, parts.set_result, args=(BuiltParts(real),)).start()
    assert DRAService(parts, wait_seconds=5).prepare([A]) == {A.uid: PrepareResult()}
    failed: Future[BuiltParts] = Future()
    failed.set_exception(CallError("driver failed to initialize: NVML: driver not loaded"))
    with pytest.raises(CallError, match="driver failed to initialize: NVML: driver not loaded"):
        DRAService(failed, wait_seconds=5).unprepare([A])
    with pytest.raises(CallError, match="still initializing"):
        DRAService(Future(), wait_seconds=0.1).prepare([A])


class RecordStream(io.StringIO):
    """A JSON log whose readers can wait for a number of records."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = threading.Condition()

    def write(self, text: str) -> int:
        with self.changed:
            written = super().write(text)
            self.changed.notify_all()
        return written

    def records(self, count: int) -> list[dict[str, Any]]:
        with self.changed:
            assert self.changed.wait_for(lambda: self.getvalue().count("\n") >= count, timeout=10)
            return [json.loads(line) for line in self.getvalue().splitlines()]


@pytest.fixture(autouse=True)
def quiet_log() -> Iterator[io.StringIO]:
    """A call's log record is written by the server's thread after it has answered, so it can
    land after the test's call phase, while pytest shows its progress: keep records off the
    terminal until the server is gone (autouse fixtures are torn down last)."""
    buffer = io.StringIO()
    logs.configure("console", 0, buffer)
    yield buffer
    logs.configure("console")


@pytest.fixture
def json_log(quiet_log: io.StringIO) -> Iterator[RecordStream]:
    stream = RecordStream()
    logs.configure("json", 0, stream)
    yield stream
    logs.configure("console", 0, quiet_log)


def test_a_calls_records_are_written_once_it_has_answered(
    plugin: InProcessPlugin, driver: ScriptedDriver, json_log: RecordStream
) -> None:
    written_during_the_call: list[str] = []

    def prepare(claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        logs.get_logger(component="test").info("prepared", claim=str(claims[0]))
        written_during_the_call.append(json_log.getvalue())
        return {A.uid: PrepareResult()}

    driver.prepare = prepare  # type: ignore[method-assign]
    with DRAClient(plugin.paths.dra_socket) as client:
        assert client.prepare([A]).claims[A.uid].error == ""
    inside, done = json_log.records(2)
    assert written_during_the_call == [""]
    assert (inside["event"], inside["claim"], done["event"]) == ("prepared", "ns/a", "NodePrepareResources")
    assert inside["timestamp"] <= done["timestamp"]  # taken when logged, not when written


def test_a_warning_is_written_at_once_after_what_was_held(
    plugin: InProcessPlugin, driver: ScriptedDriver, json_log: RecordStream
) -> None:
    written_during_the_call: list[list[str]] = []

    def prepare(claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        log = logs.get_logger(component="test")
        log.info("created MIG device")
        log.warning("the spec cannot be written yet")
        written_during_the_call.append([r["event"] for r in json_log.records(2)])
        return {A.uid: PrepareResult()}

    driver.prepare = prepare  # type: ignore[method-assign]
    with DRAClient(plugin.paths.dra_socket) as client:
        client.prepare([A])
    assert written_during_the_call == [["created MIG device", "the spec cannot be written yet"]]
    assert json_log.records(3)[2]["event"] == "NodePrepareResources"


def test_a_failed_calls_records_are_written_too(
    plugin: InProcessPlugin, driver: ScriptedDriver, json_log: RecordStream
) -> None:
    driver.raise_error = CallError("get resource claims: claim ns/a got replaced")
    with DRAClient(plugin.paths.dra_socket) as client, pytest.raises(grpc.RpcError):
        client.prepare([A])
    [failed] = json_log.records(1)
    assert (failed["level"], failed["event"]) == ("warning", "NodePrepareResources failed")
    assert failed["error"] == "get resource claims: claim ns/a got replaced"
