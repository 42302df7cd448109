"""GPU health end to end: a real `serve` subprocess, `fake-event` as a subprocess, the kubelet's
health stream over the real DRA socket, /metrics, `status`, and the published slices and Node
Events (the loopback fake API server always; a real one when the environment names it)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from dradriver import kubeletclient
from dradriver.backend.fake.health import FakeEventRecord, append_fake_event
from dradriver.health.board import Health
from tests.helpers import DRIVER, HealthStream, ServeProcess, free_port, scrape, short_tmpdir, wait_for
from tests.publish.apiservers import TEST_DRIVER, Backend

#: Short enough for a test, long enough that "still unhealthy inside the quiet period" is observable.
QUIET = "quietPeriodSeconds: 2\nrecheckIntervalSeconds: 0.5\n"
#: Long enough to inspect an unhealthy device (metrics, two `status` subprocesses) on a loaded machine.
INSPECTABLE = "quietPeriodSeconds: 20\nrecheckIntervalSeconds: 0.5\n"


def fake_event(serve: ServeProcess, *args: str, driver: str = DRIVER) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "dradriver",
            "fake-event",
            "--kubelet-plugins-dir",
            str(serve.plugins_dir),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**serve.env, "DRADRIVER_DRIVER_NAME": driver},
    )


def status(serve: ServeProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dradriver", "status", "--kubelet-plugins-dir", str(serve.plugins_dir), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**serve.env, "COLUMNS": "200"},
    )


@contextmanager
def serving(
    extra: Sequence[str] = (),
    health_config: str = QUIET,
    env: dict[str, str] | None = None,
    driver: str = DRIVER,
    *,
    report: bool = True,
) -> Iterator[tuple[ServeProcess, HealthStream]]:
    """`serve` on fake GPUs with a health config, and its health stream open; with `report`, once
    the health monitor has written its first report (fake-event needs it)."""
    with short_tmpdir() as root:
        config = root / "health.yaml"
        config.write_text(health_config)
        serve = ServeProcess(root, ["--health-config", str(config), *extra], env, driver).start()
        stream = HealthStream(serve.dra_socket)
        try:
            wait_for(lambda: len(stream.latest) > 0, 20, f"the first health list (log: {serve.log()})")
            if report:
                wait_for((serve.plugins_dir / driver / "health.json").exists, 10, "health.json")
            yield serve, stream
        finally:
            stream.close()
            serve.kill()


def test_fatal_xid_makes_the_device_unhealthy_then_it_recovers_by_itself() -> None:
    port = free_port()
    with serving(["--metrics-address", f"127.0.0.1:{port}"], health_config=INSPECTABLE) as (serve, stream):
        assert {health for health, _ in stream.latest.values()} == {Health.HEALTHY}
        assert len(stream.latest) == 8

        ignored = fake_event(serve, "--device", "gpu-2", "--xid", "13")
        assert ignored.returncode == 0, ignored.stderr
        assert ignored.stdout.startswith("XID 13 (Graphics Engine Exception) on gpu-2: appended to ")
        fatal = fake_event(serve, "--device", "gpu-3", "--xid", "79")
        assert fatal.returncode == 0, fatal.stderr

        message = stream.wait("gpu-3", Health.UNHEALTHY)
        assert message.startswith("XID 79 (GPU has fallen off the bus) at ")
        assert all(stream.latest[d][0] == Health.HEALTHY for d in stream.latest if d != "gpu-3")
        assert all(r["gpu-2"][0] == Health.HEALTHY for r in stream.responses)  # XID 13 never counted

        wait_for(
            lambda: 'dradriver_xid_events_total{class="fatal",xid="79"} 1.0' in scrape(port), 10, "metrics"
        )
        metrics = scrape(port)
        assert 'dradriver_xid_events_total{class="application",xid="13"} 1.0' in metrics
        assert 'dradriver_devices{health="unhealthy",type="gpu"} 1.0' in metrics
        assert 'dradriver_devices{health="healthy",type="gpu"} 7.0' in metrics

        report: dict[str, Any] = {}

        def gpu3_unhealthy() -> bool:
            report.update(json.loads(status(serve, "-o", "json").stdout))
            return any(d["device"] == "gpu-3" and d["health"] == "UNHEALTHY" for d in report["devices"])

        wait_for(gpu3_unhealthy, 20, "the health file (written after the board the metrics show)")
        assert report["healthSource"] == "fake"
        (gpu3,) = [d for d in report["devices"] if d["device"] == "gpu-3"]
        assert (gpu3["health"], gpu3["reason"], gpu3["message"]) == ("UNHEALTHY", "79", message)
        table = status(serve).stdout
        assert "device health: 1 of 8 devices not healthy (source: fake)" in table
        assert "XID 79 (GPU has fallen off the bus)" in table

        recovered = stream.wait("gpu-3", Health.HEALTHY, timeout=60)
        assert recovered.startswith("healthy again at ")
        assert recovered.endswith(f"no fatal event for 20s and the GPU passed its re-check (was: {message})")
        wait_for(lambda: 'dradriver_devices{health="healthy",type="gpu"} 8.0' in scrape(port), 10, "metrics")
        wait_for(
            lambda: "device health: all 8 devices healthy (source: fake)" in status(serve).stdout,
            20,
            "the health file (written after the board the metrics show)",
        )


def test_each_kubelet_opens_its_health_version_and_every_stream_sees_the_same_change() -> None:
    with serving() as (serve, v1alpha1):
        # 1.34-1.36 open v1alpha1 whatever is advertised; 1.37 the newest both know: v1.
        picked = {
            minor: kubeletclient.register(serve.registration_socket, kubelet_minor=minor).health_service
            for minor in (34, 35, 36, 37)
        }
        assert picked == {
            34: "v1alpha1.DRAResourceHealth",
            35: "v1alpha1.DRAResourceHealth",
            36: "v1alpha1.DRAResourceHealth",
            37: "v1.DRAResourceHealth",
        }
        v1 = HealthStream(serve.dra_socket, "v1.DRAResourceHealth")
        try:
            wait_for(lambda: len(v1.latest) == 8, 20, "the first v1 health list")
            assert v1.latest == v1alpha1.latest
            append_fake_event(serve.plugins_dir / DRIVER, FakeEventRecord(device="gpu-4", xid=79, at=1e9))
            message = v1.wait("gpu-4", Health.UNHEALTHY)
            assert message.startswith("XID 79 (GPU has fallen off the bus) at ")
            assert v1alpha1.wait("gpu-4", Health.UNHEALTHY) == message
            assert v1.latest == v1alpha1.latest
        finally:
            v1.close()


@pytest.mark.parametrize(
    ("advertised", "minor", "opened"),
    [
        (kubeletclient.KUBELET_HEALTH_SERVICES, 37, "v1.DRAResourceHealth"),
        (["v1alpha1.DRAResourceHealth"], 37, "v1alpha1.DRAResourceHealth"),  # an older dradriver
        (["v1.DRAResourceHealth"], 37, "v1.DRAResourceHealth"),
        ([], 37, None),  # a plugin without health: no stream, no retries
        ([], 36, "v1alpha1.DRAResourceHealth"),  # 1.36 opens it anyway (and retries on Unimplemented)
        (["v1.DRAResourceHealth"], 34, "v1alpha1.DRAResourceHealth"),
    ],
)
def test_kubelet_choice_of_health_service(advertised: Sequence[str], minor: int, opened: str | None) -> None:
    assert kubeletclient.pick_health_service(["v1.DRAPlugin", *advertised], minor) == opened


def test_health_follows_the_recovery_action_nvml_reports_with_an_xid() -> None:
    port = free_port()
    with serving(["--metrics-address", f"127.0.0.1:{port}"]) as (serve, stream):
        # An application XID, but the host driver says the GPU needs a reset: it is unhealthy.
        reset = fake_event(serve, "--device", "gpu-2", "--xid", "13", "--recovery-action", "gpu-reset")
        assert reset.returncode == 0, reset.stderr
        assert reset.stdout.startswith(
            "XID 13 (Graphics Engine Exception) on gpu-2 with recovery action gpu-reset: "
        )
        message = stream.wait("gpu-2", Health.UNHEALTHY)
        assert message.startswith("XID 13 (Graphics Engine Exception) at ")
        assert message.endswith(": GPU reset needed (NVML recovery action)")
        # A fatal-looking XID with no action needed leaves its GPU healthy.
        state_dir = serve.plugins_dir / DRIVER
        append_fake_event(state_dir, FakeEventRecord(device="gpu-5", xid=79, recovery="none", at=1e9))
        counted = 'dradriver_xid_events_total{class="informational",xid="79"} 1.0'
        wait_for(lambda: counted in scrape(port), 10, "the XID counted")
        assert all(r["gpu-5"][0] == Health.HEALTHY for r in stream.responses)
        # Past the quiet period the re-check asks the action again: still a reset to do.
        wait_for(lambda: "re-check at " in stream.latest["gpu-2"][1], 15, "a failed re-check")
        assert stream.latest["gpu-2"][1].endswith(
            "failed: GPU reset needed (NVML recovery action); "
            "dradriver fake-event --device gpu-2 --recovery-action none clears it"
        )
        append_fake_event(state_dir, FakeEventRecord(device="gpu-2", recovery="none", at=1e9))
        assert stream.wait("gpu-2", Health.HEALTHY).startswith("healthy again at ")


def test_lost_gpu_stays_unhealthy_until_it_answers_again() -> None:
    with serving() as (serve, stream):
        assert fake_event(serve, "--device", "gpu-5", "--lost").returncode == 0
        assert stream.wait("gpu-5", Health.UNHEALTHY).startswith(
            "GPU lost (marked lost with dradriver fake-event)"
        )
        # Past the quiet period the re-check fails and says why.
        failed = "re-check at "
        wait_for(lambda: failed in stream.latest["gpu-5"][1], 15, "a failed re-check")
        assert stream.latest["gpu-5"][1].endswith(
            "failed: GPU marked lost; dradriver fake-event --device gpu-5 --restore brings it back"
        )
        assert fake_event(serve, "--device", "gpu-5", "--restore").returncode == 0
        assert stream.wait("gpu-5", Health.HEALTHY).startswith("healthy again at ")


def test_lost_gpu_and_a_pending_recovery_action_outlive_a_restart() -> None:
    with serving() as (serve, stream):
        assert fake_event(serve, "--device", "gpu-1", "--lost").returncode == 0
        stream.wait("gpu-1", Health.UNHEALTHY)
        assert fake_event(serve, "--device", "gpu-2", "--xid", "79").returncode == 0
        stream.wait("gpu-2", Health.UNHEALTHY)
        reset = FakeEventRecord(device="gpu-3", xid=13, recovery="gpu-reset", at=1e9)
        append_fake_event(serve.plugins_dir / DRIVER, reset)
        stream.wait("gpu-3", Health.UNHEALTHY)
        stream.close()
        assert serve.stop() == 0
        serve.start()
        again = HealthStream(serve.dra_socket)
        try:
            again.wait("gpu-1", Health.UNHEALTHY)
            # The XID is history, but the GPU still needs its reset: found at start.
            assert again.wait("gpu-3", Health.UNHEALTHY).startswith(
                "GPU reset needed (NVML recovery action) at "
            )
            assert again.latest["gpu-2"][0] == Health.HEALTHY  # an old XID is history
        finally:
            again.close()


def test_fake_event_refuses_what_no_daemon_would_read(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "dradriver", "fake-event", "--state-dir", str(tmp_path), *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    missing = run("--device", "gpu-0", "--xid", "79")
    assert (missing.returncode, missing.stderr) == (
        2,
        f"dradriver fake-event: error: {tmp_path}/health.json not found: start 'dradriver serve "
        "--fake-gpus PROFILE' with this state directory first\n",
    )
    (tmp_path / "health.json").write_text(json.dumps({"source": "nvml", "devices": [{"device": "gpu-0"}]}))
    nvml = run("--device", "gpu-0", "--xid", "79")
    assert "watches 'nvml' GPUs, not fake ones" in nvml.stderr
    (tmp_path / "health.json").write_text(json.dumps({"source": "fake", "devices": [{"device": "gpu-0"}]}))
    unknown = run("--device", "gpu-9", "--lost")
    assert (
        unknown.stderr
        == "dradriver fake-event: error: --device: no device 'gpu-9' on this node (it has gpu-0)\n"
    )
    both = run("--device", "gpu-0", "--lost", "--xid", "1")
    assert both.returncode == 2
    assert "not allowed with argument" in both.stderr
    lost_with_action = run("--device", "gpu-0", "--lost", "--recovery-action", "none")
    assert (lost_with_action.returncode, lost_with_action.stderr) == (
        2,
        "dradriver fake-event: error: --recovery-action goes with --xid or alone\n",
    )
    nothing = run("--device", "gpu-0")
    assert nothing.returncode == 2
    assert (
        "one of --xid, --lost, --restore, --recovery-action and --utilization is required" in nothing.stderr
    )
    negative = run("--device", "gpu-0", "--xid", "-3")
    assert "invalid XID '-3'" in negative.stderr
    assert not (tmp_path / "fake-events.jsonl").exists()
    assert run("--device", "gpu-0", "--restore").returncode == 0
    (line,) = (tmp_path / "fake-events.jsonl").read_text().splitlines()
    assert json.loads(line)["lost"] is False


def test_health_monitoring_can_be_switched_off() -> None:
    with serving(health_config="enabled: false\n", report=False) as (serve, stream):
        assert {health for health, _ in stream.latest.values()} == {Health.HEALTHY}
        refused = fake_event(serve, "--device", "gpu-0", "--xid", "79")
        assert refused.returncode == 2
        assert "health.json not found" in refused.stderr
        assert "no device health report" in status(serve).stdout
        wait_for(lambda: "health monitoring is disabled" in serve.log(), 10, "the line saying so")


def node_events(backend: Backend, node: str) -> list[dict[str, Any]]:
    """The Node's Events from our plugin (a real cluster's controllers report on it too)."""
    query = [("fieldSelector", f"involvedObject.name={node}")]
    items: list[dict[str, Any]] = backend.direct.request(
        "GET", "/api/v1/namespaces/default/events", query=query
    )["items"]
    ours = [e for e in items if (e.get("source") or {}).get("component") == TEST_DRIVER]
    return sorted(ours, key=lambda e: str(e.get("firstTimestamp", "")))


def device_taints(backend: Backend, node: str) -> dict[str, list[dict[str, Any]]]:
    return {
        d["name"]: d.get("taints", []) for s in backend.slices(node) for d in s["spec"].get("devices", [])
    }


@contextmanager
def serving_cluster(
    backend: Backend, node: str, health_config: str = QUIET, extra: Sequence[str] = ()
) -> Iterator[tuple[ServeProcess, HealthStream]]:
    with serving(
        ["--kubeconfig", str(backend.kubeconfig), "--node-name", node, *extra],
        health_config,
        {"DRADRIVER_DRIVER_NAME": TEST_DRIVER},
        TEST_DRIVER,
    ) as (serve, stream):
        wait_for(lambda: len(backend.slices(node)) == 1, 20, f"our slice (log: {serve.log()})")
        yield serve, stream


def test_unhealthy_device_is_tainted_on_the_slice_and_untainted_when_healthy(backend: Backend) -> None:
    node = backend.make_node()
    port = free_port()
    with serving_cluster(backend, node, extra=["--metrics-address", f"127.0.0.1:{port}"]) as (serve, stream):
        assert all(t == [] for t in device_taints(backend, node).values())
        assert fake_event(serve, "--device", "gpu-4", "--xid", "48", driver=TEST_DRIVER).returncode == 0
        message = stream.wait("gpu-4", Health.UNHEALTHY)
        wait_for(lambda: device_taints(backend, node)["gpu-4"] != [], 10, f"the taint (log: {serve.log()})")
        (taint,) = device_taints(backend, node)["gpu-4"]
        assert (taint["key"], taint["value"], taint["effect"]) == (
            f"{TEST_DRIVER}/unhealthy",
            "48",
            "NoSchedule",
        )
        assert taint["timeAdded"]  # set by the API server
        assert all(t == [] for name, t in device_taints(backend, node).items() if name != "gpu-4")

        wait_for(lambda: device_taints(backend, node)["gpu-4"] == [], 15, "the taint to go")
        stream.wait("gpu-4", Health.HEALTHY)
        wait_for(lambda: len(node_events(backend, node)) >= 2, 10, "Node Events")
        events = node_events(backend, node)
        assert [(e["reason"], e["type"]) for e in events] == [
            ("DeviceUnhealthy", "Warning"),
            ("DeviceHealthy", "Normal"),
        ]
        assert events[0]["message"] == f"gpu-4: {message}; tainted {TEST_DRIVER}/unhealthy=48:NoSchedule"
        assert events[0]["involvedObject"]["kind"] == "Node"
        assert events[0]["involvedObject"]["uid"] == backend.direct.node_uid(node)
        assert events[0]["source"] == {"component": TEST_DRIVER, "host": node}

        def writes() -> dict[str, float]:
            return {
                line.split('"')[1]: float(line.rsplit(" ", 1)[1])
                for line in scrape(port).splitlines()
                if line.startswith("dradriver_resourceslice_writes_total{")
            }

        # The count follows the API server's answer, which the slice seen above may precede.
        wait_for(lambda: writes()["update"] >= 2, 10, "both updates counted (tainted, untainted)")
        assert writes()["create"] == 1


def test_noexecute_is_opt_in(backend: Backend) -> None:
    node = backend.make_node()
    with serving_cluster(backend, node, "taintEffect: NoExecute\n") as (serve, _):
        assert fake_event(serve, "--device", "gpu-0", "--lost", driver=TEST_DRIVER).returncode == 0
        wait_for(lambda: device_taints(backend, node)["gpu-0"] != [], 10, "the taint")
        (taint,) = device_taints(backend, node)["gpu-0"]
        assert (taint["value"], taint["effect"]) == ("gpu-lost", "NoExecute")


def test_without_device_taints_health_still_reaches_the_stream_and_metrics(
    gates_off_backend: Backend,
) -> None:
    backend = gates_off_backend
    node = backend.make_node()
    port = free_port()
    metrics = ["--metrics-address", f"127.0.0.1:{port}"]
    with serving_cluster(backend, node, "quietPeriodSeconds: 600\n", metrics) as (serve, stream):
        for device in ("gpu-1", "gpu-2"):
            writes = serve.log().count("publishing ResourceSlices")
            assert fake_event(serve, "--device", device, "--xid", "79", driver=TEST_DRIVER).returncode == 0
            stream.wait(device, Health.UNHEALTHY)
            wait_for(
                lambda w=writes: serve.log().count("publishing ResourceSlices") > w, 10, "the tainted write"
            )
        # Events are sent from a queue: await the report and both devices' events.
        wait_for(
            lambda: (
                {"DroppedFields": 1, "DeviceUnhealthy": 2}.items()
                <= Counter(e["reason"] for e in node_events(backend, node)).items()
            ),
            10,
            "the report and both devices' events",
        )
        assert all(t == [] for t in device_taints(backend, node).values())  # the server dropped them
        reasons = [e["reason"] for e in node_events(backend, node)]
        assert reasons.count("DroppedFields") == 1  # reported once, not once per taint change
        assert reasons.count("DeviceUnhealthy") == 2
        assert serve.log().count("the API server dropped some fields") == 1
        text = scrape(port)
        assert 'dradriver_xid_events_total{class="fatal",xid="79"} 2.0' in text
        assert 'dradriver_devices{health="unhealthy",type="gpu"} 2.0' in text
