"""Issue 16: the least a Python kubelet plugin on grpcio can cost, for `bench_vs_go` to run beside
the Go reference and dradriver.

It registers like a plugin and answers the kubelet's calls with no work of its own: GetInfo from
a constant; NodePrepareResources GETs each claim through dradriver's API client (the Go helper's
rule: the kubelet names a claim by namespace, name and UID only) and answers one constant device
per claim; NodeUnprepareResources answers success. No files, no checkpoint, no log lines, the same
gRPC server set-up as `dradriver serve`. What dradriver costs beyond this is dradriver's; what
this costs beyond the Go reference is the Python runtime's (grpcio's server, the HTTP client).

    python -m bench.grpc_floor --registration SOCKET --dra SOCKET --kubeconfig FILE --driver NAME
"""

from __future__ import annotations

import argparse
import signal
import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from dradriver import logs
from dradriver.kube import load_client
from dradriver.kubeletapi.dra.v1 import api_pb2 as v1
from dradriver.kubeletapi.dra.v1 import api_pb2_grpc as v1_grpc
from dradriver.plugin.registration import RegistrationServicer, RegistrationState, add_registration_service
from dradriver.plugin.server import MAX_WORKERS


class FloorPlugin(v1_grpc.DRAPluginServicer):
    def __init__(self, kubeconfig: str, pool: str) -> None:
        client = load_client(kubeconfig)
        assert client is not None
        self._client = client
        self._pool = pool

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        response = v1.NodePrepareResourcesResponse()
        for claim in request.claims:
            fetched = self._client.get_resource_claim(claim.namespace, claim.name)
            entry = response.claims[claim.uid]
            if fetched["metadata"]["uid"] != claim.uid:
                entry.error = "replaced"
                continue
            entry.devices.add(
                request_names=["gpu"], pool_name=self._pool, device_name="gpu-0", cdi_device_ids=["k8s/gpu=0"]
            )
        return response

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        response = v1.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            response.claims[claim.uid].error = ""
        return response


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--registration", type=Path, required=True)
    parser.add_argument("--dra", type=Path, required=True)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--driver", required=True)
    parser.add_argument("--pool", default="node")
    opts = parser.parse_args()
    logs.configure("json")  # as serve: info and up (the registration servicer's debug line is dropped)
    opts.dra.parent.mkdir(parents=True, exist_ok=True)
    dra = grpc.server(futures.ThreadPoolExecutor(max_workers=MAX_WORKERS))
    v1_grpc.add_DRAPluginServicer_to_server(FloorPlugin(opts.kubeconfig, opts.pool), dra)
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
