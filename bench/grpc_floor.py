"""Issue 16: the least a Python kubelet plugin on grpcio can cost, for `bench_vs_go` to run beside
the Go reference and dradriver.

It registers like a plugin and answers the kubelet's calls with no work of its own: GetInfo from
a constant; NodePrepareResources GETs each claim through dradriver's API client (the Go helper's
rule: the kubelet names a claim by namespace, name and UID only) and answers one constant device
per claim; NodeUnprepareResources answers success. No files, no checkpoint, no log lines, the same
gRPC server set-up as `dradriver serve`. What dradriver costs beyond this is dradriver's; what
this costs beyond the Go reference is the Python runtime's (grpcio's server, the HTTP client).

With `--files ROOT` it is the Python work floor instead: each claim also gets the files any
prepare must leave before it answers, as small as dradriver's for one fake GPU and written with
dradriver's fastest primitive (`files.write.write_atomically`: temp file, then swapped in), and
nothing else: its CDI spec (ROOT/cdi) and device metadata file (ROOT/run), then the checkpoint
of every prepared claim (ROOT/plugins/<driver>, on disk); unprepare removes the two files and
writes the checkpoint again. No validation, no rendering, no typed data: `json.dumps` of fixed
shapes. What a correct driver costs beyond this is its own.

    python -m bench.grpc_floor --registration SOCKET --dra SOCKET --kubeconfig FILE --driver NAME \
        [--files ROOT]
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from dradriver import logs
from dradriver.files.write import ensure_directory, write_atomically
from dradriver.kube import load_client
from dradriver.kubeletapi.dra.v1 import api_pb2 as v1
from dradriver.kubeletapi.dra.v1 import api_pb2_grpc as v1_grpc
from dradriver.plugin.registration import RegistrationServicer, RegistrationState, add_registration_service
from dradriver.plugin.server import MAX_WORKERS


class FloorFiles:
    """The files a prepare must leave, and nothing else (see the module docstring)."""

    def __init__(self, root: Path, driver: str) -> None:
        self._driver = driver
        self._cdi, self._metadata = root / "cdi", root / "run" / "metadata"
        self._state = root / "plugins" / driver
        for directory in (self._cdi, self._metadata, self._state):
            ensure_directory(directory)
        self._claims: dict[str, dict[str, Any]] = {}

    def prepare(self, claim: Any, pool: str) -> None:
        uid, name = claim["metadata"]["uid"], claim["metadata"]["name"]
        metadata = self._metadata / f"{uid}_gpu.json"
        spec = {
            "cdiVersion": "0.5.0",
            "kind": f"k8s.{self._driver}/claim",
            "devices": [
                {
                    "name": f"{uid}-gpu-0",
                    "containerEdits": {
                        "deviceNodes": [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}],
                        "mounts": [{"hostPath": str(metadata), "containerPath": f"/var/run/{name}/gpu.json"}],
                    },
                }
            ],
            "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"], "deviceNodes": _COMMON_NODES},
        }
        device = {"driver": self._driver, "pool": pool, "name": "gpu-0", "attributes": _ATTRIBUTES}
        document = {"metadata": claim["metadata"], "requests": [{"name": "gpu", "devices": [device]}]}
        write_atomically(metadata, json.dumps(document).encode(), mode=0o644, durable=False)
        write_atomically(self._spec(uid), json.dumps(spec).encode(), mode=0o644, durable=False)
        self._claims[uid] = {"name": name, "namespace": claim["metadata"]["namespace"], "device": "gpu-0"}
        self._save()

    def unprepare(self, uid: str) -> None:
        for path in (self._spec(uid), self._metadata / f"{uid}_gpu.json"):
            path.unlink(missing_ok=True)
        if self._claims.pop(uid, None) is not None:
            self._save()

    def _spec(self, uid: str) -> Path:
        return self._cdi / f"k8s.{self._driver}-claim_{uid}.json"

    def _save(self) -> None:
        data = json.dumps(self._claims).encode()
        write_atomically(self._state / "checkpoint.json", data, mode=0o600, durable=False)


_COMMON_NODES = [
    {"path": path, "type": "c", "major": major, "minor": minor}
    for path, major, minor in (
        ("/dev/nvidiactl", 195, 255),
        ("/dev/nvidia-uvm", 510, 0),
        ("/dev/nvidia-uvm-tools", 510, 1),
    )
]
#: As many attributes as a fake H100 publishes (its metadata file's size).
_ATTRIBUTES = {f"attribute{i}": {"string": f"value of attribute {i}"} for i in range(19)}


class FloorPlugin(v1_grpc.DRAPluginServicer):
    def __init__(self, kubeconfig: str, pool: str, files: FloorFiles | None) -> None:
        client = load_client(kubeconfig)
        assert client is not None
        self._client = client
        self._pool = pool
        self._files = files

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        response = v1.NodePrepareResourcesResponse()
        for claim in request.claims:
            fetched = self._client.get_resource_claim(claim.namespace, claim.name)
            entry = response.claims[claim.uid]
            if fetched["metadata"]["uid"] != claim.uid:
                entry.error = "replaced"
                continue
            if self._files is not None:
                self._files.prepare(fetched, self._pool)
            entry.devices.add(
                request_names=["gpu"], pool_name=self._pool, device_name="gpu-0", cdi_device_ids=["k8s/gpu=0"]
            )
        return response

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        response = v1.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            if self._files is not None:
                self._files.unprepare(claim.uid)
            response.claims[claim.uid].error = ""
        return response


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--registration", type=Path, required=True)
    parser.add_argument("--dra", type=Path, required=True)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--driver", required=True)
    parser.add_argument("--pool", default="node")
    parser.add_argument("--files", type=Path, help="the work floor: write each claim's files under this root")
    opts = parser.parse_args()
    logs.configure("json")  # as serve: info and up (the registration servicer's debug line is dropped)
    opts.dra.parent.mkdir(parents=True, exist_ok=True)
    dra = grpc.server(futures.ThreadPoolExecutor(max_workers=MAX_WORKERS))
    files = FloorFiles(opts.files, opts.driver) if opts.files else None
    v1_grpc.add_DRAPluginServicer_to_server(FloorPlugin(opts.kubeconfig, opts.pool, files), dra)
    dra.add_insecure_port(f"unix://{opts.dra}")
    registration = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = RegistrationServicer(opts.driver, str(opts.dra), ["v1.DRAPlugin"], RegistrationState())
    add_registration_service(registration, servicer)
    registration.add_insecure_port(f"unix://{opts.registration}")
    dra.start()
    registration.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    registration.stop(0)
    dra.stop(0)


if __name__ == "__main__":
    main()
