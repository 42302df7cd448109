"""`dradriver serve` as a real subprocess, driven the way a kubelet drives it, over real sockets."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading

import grpc
import pytest
import yaml

from dradriver import kubeletclient
from dradriver.kubeletapi.pluginregistration import api_pb2 as reg_pb
from dradriver.kubeletapi.pluginregistration import api_pb2_grpc as reg_grpc
from dradriver.plugin.driver import ClaimRef
from tests.helpers import (
    ServeProcess,
    allocated_claim,
    free_port,
    healthcheck,
    http_get,
    running_serve,
    scrape,
    short_tmpdir,
    uid,
    wait_for,
)


def claim(i: int) -> ClaimRef:
    return ClaimRef(namespace="default", name=f"claim-{i}", uid=uid(i))


def write_claims(serve: ServeProcess, numbers: range) -> list[ClaimRef]:
    """Allocated claims for the serve's claim directory: admin access, so any number share 8 GPUs."""
    serve.claims_dir.mkdir(exist_ok=True)
    claims = [
        allocated_claim(
            f"claim-{i}", uid(i), [{"request": "gpu", "device": f"gpu-{i % 8}", "adminAccess": True}]
        )
        for i in numbers
    ]
    (serve.claims_dir / "claims.yaml").write_text(yaml.safe_dump_all(claims))
    return [claim(i) for i in numbers]


def test_get_info_matches_the_go_helper() -> None:
    with running_serve() as serve, grpc.insecure_channel(f"unix://{serve.registration_socket}") as channel:
        info = reg_grpc.RegistrationStub(channel).GetInfo(reg_pb.InfoRequest(), timeout=5)
        assert info.type == "DRAPlugin"
        assert info.name == "gpu.dradriver.dev"
        assert info.endpoint == str(serve.dra_socket)
        assert os.path.isabs(info.endpoint)
        assert list(info.supported_versions) == [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth",
        ]


def test_kubelet_handshake_picks_v1_and_dra_socket_answers() -> None:
    with running_serve() as serve:
        registration = kubeletclient.register(serve.registration_socket)
        assert registration.service == "v1.DRAPlugin"
        with kubeletclient.DRAClient(registration.endpoint, registration.service) as client:
            assert dict(client.prepare([]).claims) == {}
        wait_for(lambda: "registered with the kubelet" in serve.log(), 5, "registration log line")


@pytest.mark.parametrize("service", ["v1.DRAPlugin", "v1beta1.DRAPlugin"])
def test_prepare_and_unprepare_answer_every_claim(service: str) -> None:
    with running_serve() as serve, kubeletclient.DRAClient(serve.dra_socket, service) as client:
        assert dict(client.prepare([]).claims) == {}
        assert dict(client.unprepare([]).claims) == {}
        claims = write_claims(serve, range(200))
        prepared = client.prepare(claims)
        assert set(prepared.claims) == {c.uid for c in claims}
        assert all(entry.error == "" and len(entry.devices) == 1 for entry in prepared.claims.values())
        assert len(list(serve.cdi_dir.glob("*.json"))) == 200
        unprepared = client.unprepare(claims)
        assert set(unprepared.claims) == {c.uid for c in claims}
        assert all(entry.error == "" for entry in unprepared.claims.values())
        assert list(serve.cdi_dir.glob("*.json")) == []


def test_concurrent_calls_from_many_threads() -> None:
    with running_serve() as serve, kubeletclient.DRAClient(serve.dra_socket) as client:
        write_claims(serve, range(1700))
        failures: list[BaseException] = []

        def worker(offset: int) -> None:
            try:
                for i in range(10):
                    mine = [claim(offset * 100 + i), claim(offset * 100 + i + 50)]
                    prepared = client.prepare(mine).claims
                    assert set(prepared) == {c.uid for c in mine}
                    assert all(e.error == "" for e in prepared.values())
                    assert set(client.unprepare(mine).claims) == {c.uid for c in mine}
            except BaseException as err:  # collected and re-raised in the main thread
                failures.append(err)

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert failures == []


def test_health_stream_sends_the_device_list_on_subscribe() -> None:
    with running_serve() as serve, kubeletclient.DRAClient(serve.dra_socket) as client:
        stream = client.watch_health(timeout=10)
        first = next(iter(stream))
        assert all(d.device.pool_name == "node-1" for d in first.devices)


def test_second_instance_refuses_to_take_over() -> None:
    with running_serve() as serve:
        inode = os.stat(serve.registration_socket).st_ino
        second = ServeProcess(serve.root, ["--shutdown-grace", "1"])
        second.log_path = serve.root / "second.log"
        second.start(wait=False)
        assert second.proc is not None
        assert second.proc.wait(30) == 1
        assert "another dradriver serve" in second.log()
        assert f"pid {serve.proc.pid if serve.proc else ''}" in second.log()
        assert os.stat(serve.registration_socket).st_ino == inode
        kubeletclient.register(serve.registration_socket)  # the first one still answers


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_removes_sockets_and_lock(sig: int) -> None:
    with running_serve() as serve:
        assert serve.dra_socket.exists()
        assert serve.lock_file.exists()
        assert serve.stop(sig) == 0
        assert not serve.registration_socket.exists()
        assert not serve.dra_socket.exists()
        assert not serve.lock_file.exists()
        assert "sockets and lock removed" in serve.log()


def test_deleted_registration_socket_is_recreated() -> None:
    with running_serve() as serve:
        kubeletclient.register(serve.registration_socket)
        serve.registration_socket.unlink()
        wait_for(serve.registration_socket.exists, 5, "the registration socket to come back")
        assert kubeletclient.register(serve.registration_socket).service == "v1.DRAPlugin"


def test_deleted_dra_socket_is_recreated() -> None:
    with running_serve() as serve, kubeletclient.DRAClient(serve.dra_socket) as _:
        serve.dra_socket.unlink()
        wait_for(serve.dra_socket.exists, 5, "the DRA socket to come back")
        with kubeletclient.DRAClient(serve.dra_socket) as client:
            assert set(client.unprepare([claim(1)]).claims) == {claim(1).uid}


def test_stale_sockets_are_replaced() -> None:
    with short_tmpdir() as root:
        serve = ServeProcess(root)
        for path in (serve.registration_socket, serve.dra_socket):
            path.parent.mkdir(parents=True, exist_ok=True)
            stale = socket.socket(socket.AF_UNIX)
            stale.bind(str(path))
            stale.close()  # leaves the socket file behind, like a killed plugin
        serve.start()
        try:
            assert kubeletclient.register(serve.registration_socket).service == "v1.DRAPlugin"
        finally:
            serve.kill()


def test_a_regular_file_in_place_of_a_socket_is_not_removed() -> None:
    with short_tmpdir() as root:
        serve = ServeProcess(root)
        serve.registration_socket.parent.mkdir(parents=True)
        serve.registration_socket.write_text("not a socket")
        serve.start(wait=False)
        assert serve.proc is not None
        assert serve.proc.wait(30) == 1
        assert "is not a socket" in serve.log()
        assert serve.registration_socket.read_text() == "not a socket"
        assert not serve.dra_socket.exists()
        assert not serve.lock_file.exists()


def test_registration_outcome_drives_readiness() -> None:
    port = free_port()
    with running_serve(["--metrics-address", f"127.0.0.1:{port}"]) as serve:
        wait_for(lambda: http_get(port, "/healthz")[0] == 200, 10, "liveness")
        assert http_get(port, "/readyz") == (503, "not registered with the kubelet yet\n")
        kubeletclient.register(serve.registration_socket, accept=False)
        assert http_get(port, "/readyz") == (
            503,
            "the kubelet rejected the registration: rejected by test kubelet\n",
        )
        wait_for(lambda: "kubelet rejected the registration" in serve.log(), 5, "rejection log line")
        kubeletclient.register(serve.registration_socket)
        # Registered now; ready as soon as the driver has been built (in the background).
        wait_for(lambda: http_get(port, "/readyz") == (200, "ok\n"), 30, "readiness after registration")


def test_env_vars_set_flags() -> None:
    env = {"DRADRIVER_DRIVER_NAME": "gpu.example.com"}
    with running_serve(env=env, driver="gpu.example.com") as serve:
        assert serve.registration_socket.name == "gpu.example.com-reg.sock"
        assert kubeletclient.register(serve.registration_socket).driver_name == "gpu.example.com"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--driver-name", "Bad_Name"], "invalid driver name 'Bad_Name'"),
        (["--verbosity", "loud"], "invalid verbosity 'loud'"),
        (["--metrics-address", "nowhere"], "invalid address"),
        (["--no-such-flag"], "unrecognized arguments"),
        (["--pod-uid", "../../etc"], "invalid pod UID '../../etc'"),
        (["--rescan-interval", "-1"], "'-1' must not be negative"),
    ],
)
def test_bad_flags_exit_2_with_one_line(args: list[str], message: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "dradriver", "serve", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_healthcheck_probes_the_dra_socket_without_claim_work() -> None:
    port = free_port()
    with running_serve(["--metrics-address", f"127.0.0.1:{port}"]) as serve:
        wait_for(lambda: "dradriver_devices{" in http_get(port, "/metrics")[1], 10, "the driver's metrics")
        for _ in range(3):
            healthy = healthcheck(serve)
            assert (healthy.returncode, healthy.stdout) == (0, f"healthy: {serve.dra_socket} is serving\n")
        # A probe is no DRA call: nothing is counted as claim work and serve logs nothing for it.
        assert "dradriver_dra_call_duration_seconds_count" not in scrape(port)
        assert "NodeUnprepareResources" not in serve.log()
        assert "NodePrepareResources" not in serve.log()
        wrong_driver = healthcheck(serve, "--driver-name", "other.example.com")
        assert wrong_driver.returncode == 1
        assert "does not exist" in wrong_driver.stdout
        assert serve.proc is not None
        serve.proc.send_signal(signal.SIGSTOP)  # alive but not answering: the probe must fail, not hang
        try:
            hung = healthcheck(serve, "--timeout", "1")
        finally:
            serve.proc.send_signal(signal.SIGCONT)
        assert hung.returncode == 1
        assert "DEADLINE_EXCEEDED" in hung.stdout


def test_metrics_follow_calls_devices_and_registration() -> None:
    port = free_port()
    with running_serve(["--metrics-address", f"127.0.0.1:{port}"]) as serve:
        refs = write_claims(serve, range(3))
        kubeletclient.register(serve.registration_socket)
        with kubeletclient.DRAClient(serve.dra_socket) as client:
            wait_for(  # http_get, not scrape: the probe server may not listen yet
                lambda: 'dradriver_devices{health="healthy",type="gpu"} 8.0' in http_get(port, "/metrics")[1],
                20,
                "devices",
            )
            client.prepare(refs)
            bad = ClaimRef("default", "nope", "not-a-uid")
            client.prepare([bad])
            counted = (
                'dradriver_dra_call_duration_seconds_count{api="v1",method="NodePrepareResources"} 2.0',
                'dradriver_claim_errors_total{method="NodePrepareResources",reason="invalid_reference"} 1.0',
            )
            # A call is counted once its answer is out, by the server's thread: it may come after it.
            wait_for(lambda: all(line in scrape(port) for line in counted), 10, " and ".join(counted))
            text = scrape(port)
            assert "dradriver_prepared_claims 3.0" in text
            assert "dradriver_kubelet_registered 1.0" in text
            assert 'dradriver_build_info{version="0.1.0"} 1.0' in text
            client.unprepare(refs)
            assert "dradriver_prepared_claims 0.0" in scrape(port)
