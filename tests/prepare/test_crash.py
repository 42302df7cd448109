"""`kill -9` at random points of 200 prepare/unprepare cycles: nothing orphaned, nothing lost (the
device metadata files the specs mount included), and a reader of the CDI directory never sees a
file it cannot parse."""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import yaml

from dradriver.kubeletapi.dra.v1 import api_pb2 as pb
from dradriver.kubeletapi.dra.v1 import api_pb2_grpc as pb_grpc
from tests.helpers import ServeProcess, allocated_claim, opaque, short_tmpdir, uid

CYCLES = 200
KILL_ONE_IN = 12
TIME_SLICING: dict[str, Any] = {
    "apiVersion": "gpu.dradriver.dev/v1alpha1",
    "kind": "GpuConfig",
    "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Medium"}},
}


class CdiWatcher(threading.Thread):
    """Reads every spec file in the directory over and over, as a runtime's refresh would."""

    def __init__(self, directory: Path) -> None:
        super().__init__(daemon=True)
        self.directory = directory
        self.stop = threading.Event()
        self.reads = 0
        self.broken: list[str] = []

    def run(self) -> None:
        while not self.stop.is_set():
            for path in self.directory.glob("*.json") if self.directory.exists() else []:
                try:
                    data = path.read_bytes()
                except FileNotFoundError:
                    continue  # removed between listing and reading: fine
                try:
                    spec = json.loads(data)
                    assert spec["devices"]
                except (ValueError, AssertionError, KeyError) as err:
                    self.broken.append(f"{path.name}: {err}")
                self.reads += 1


def test_kill_9_during_prepare_and_unprepare_cycles() -> None:
    rng = random.Random(20261121)
    with short_tmpdir() as root:
        serve = ServeProcess(root)
        serve.claims_dir.mkdir(exist_ok=True)
        claims = [
            allocated_claim(
                f"c{i}", uid(i), [{"request": "gpu", "device": f"gpu-{i}"}], config=[opaque(TIME_SLICING)]
            )
            for i in range(8)
        ]
        (serve.claims_dir / "claims.yaml").write_text(yaml.safe_dump_all(claims))
        serve.start()
        watcher = CdiWatcher(serve.cdi_dir)
        watcher.start()
        kills = 0
        believed_prepared: set[str] = set()
        channel = grpc.insecure_channel(f"unix://{serve.dra_socket}")
        stub = pb_grpc.DRAPluginStub(channel)

        def restart(unprepare_in_flight: str | None) -> None:
            nonlocal channel, stub
            serve.stop(signal.SIGKILL)
            channel.close()
            serve.start()
            channel = grpc.insecure_channel(f"unix://{serve.dra_socket}")
            stub = pb_grpc.DRAPluginStub(channel)
            # Whatever the kubelet was told is prepared must still be, after the crash (except a claim
            # whose unprepare was in flight: it may have completed with its answer lost).
            for claim_uid in believed_prepared - {unprepare_in_flight}:
                spec = serve.cdi_dir / f"k8s.gpu.dradriver.dev-claim_{claim_uid}.json"
                assert spec.exists(), f"prepared claim {claim_uid} lost after kill -9"
                # ... and so is every device metadata file its spec mounts, whole.
                for device in json.loads(spec.read_text())["devices"]:
                    (mount,) = device["containerEdits"]["mounts"]
                    assert (
                        json.loads(Path(mount["hostPath"]).read_text().splitlines()[0])["metadata"]["uid"]
                        == claim_uid
                    )

        def call(method: str, claim_uid: str, name: str) -> None:
            """Send until answered; sometimes kill the plugin while the request is in flight."""
            nonlocal kills
            request_type = (
                pb.NodePrepareResourcesRequest if method == "prepare" else pb.NodeUnprepareResourcesRequest
            )
            request = request_type(claims=[pb.Claim(namespace="default", name=name, uid=claim_uid)])
            while True:
                rpc: Any = stub.NodePrepareResources if method == "prepare" else stub.NodeUnprepareResources
                future = rpc.future(request, timeout=30, wait_for_ready=True)
                if rng.randrange(KILL_ONE_IN) == 0:
                    time.sleep(rng.uniform(0, 0.004))
                    kills += 1
                    restart(claim_uid if method == "unprepare" else None)
                try:
                    response = future.result()
                except grpc.RpcError:
                    continue  # the plugin died under the call: the kubelet retries, so do we
                assert response.claims[claim_uid].error == ""
                if method == "prepare":
                    believed_prepared.add(claim_uid)
                else:
                    believed_prepared.discard(claim_uid)
                return

        for _cycle in range(CYCLES):
            i = rng.randrange(8)
            call("prepare", uid(i), f"c{i}")
            if rng.random() < 0.7:  # leave some prepared across kills
                call("unprepare", uid(i), f"c{i}")
        for i in range(8):
            call("unprepare", uid(i), f"c{i}")
        watcher.stop.set()
        watcher.join()
        channel.close()
        assert serve.stop() == 0
        assert kills >= 15
        assert watcher.reads > 0
        assert watcher.broken == []
        assert sorted(p.name for p in serve.cdi_dir.iterdir()) == []  # no orphans, no temp files
        assert list((serve.plugins_dir / serve.driver / "device-metadata").iterdir()) == []
        checkpoint = json.loads((serve.plugins_dir / serve.driver / "checkpoint.json").read_text())
        assert checkpoint["data"]["claims"] == {}
