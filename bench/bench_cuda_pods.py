"""Issue 24: pod create -> Running with a one-GPU claim in a slim Debian image, beside the same pod
without a claim, on a real single-node Kubernetes 1.36 running the GPU DaemonSet (`deploy/base`).

Run: make release VERSION=0.1.0 && .venv/bin/python -m bench.bench_cuda_pods \\
         --bin /var/tmp/dradriver-k8s-bin --release build/release/dradriver-0.1.0 [--rounds 15]

The node gets the fake host driver of the real-cluster suite (tests/e2e/fakedriver.py: the C fake
NVML the plugin discovers through, the fake libcuda and nvidia-smi the specs mount), the images are
the suite's probe roots (tests/e2e/cudaimages.py). Both pods run the Debian slim root's CUDA probe
with `--stay` on a read-only root: with the claim it loads libcuda.so.1 by SONAME, sees its GPU
and runs nvidia-smi -L; without it, it finds no libcuda. Timed from the client: create -> Running
(the pod polled every 5 ms), alternating the two; the first round only warms up.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_e2e import TEMPLATES, delete, template
from bench.common import add_cluster_arguments, summary
from dradriver import DEFAULT_DRIVER_NAME
from dradriver.kube import KubeClient
from tests.e2e.cluster import LocalCluster
from tests.e2e.cudaimages import IMAGE, import_probe_images
from tests.e2e.fakedriver import fake_host_driver
from tests.e2e.plugin import Deployment, wait
from tests.e2e.realcluster import RealCluster
from tests.e2e.workloads import wait_unprepared
from tests.fakenvml import cuda
from tests.release.release import ReleaseDirectory

PODS = "/api/v1/namespaces/default/pods"


def pod(name: str, claim: str | None) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "app",
        "image": IMAGE.format("debian-slim"),
        "imagePullPolicy": "Never",
        "args": ["--stay"],
        "securityContext": {"readOnlyRootFilesystem": True},
    }
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 5,
        "containers": [container],
    }
    if claim is not None:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": claim}]
        container["resources"] = {"claims": [{"name": "gpu"}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def create_to_running(client: KubeClient, name: str, claim: str | None) -> float:
    started = time.perf_counter()
    client.request("POST", PODS, body=pod(name, claim))
    while client.request("GET", f"{PODS}/{name}").get("status", {}).get("phase") != "Running":
        time.sleep(0.005)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_cluster_arguments(parser)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument(
        "--earlier",
        action="store_true",
        help="the release predates issue 24: its pods are timed, but CUDA is not expected to load in them",
    )
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="dradriver-bench-cuda-", dir="/var/tmp"))
    local = LocalCluster(args.bin, work / "cluster")
    local.start()
    try:
        release = ReleaseDirectory.read(args.release)
        local.import_image(release.archive)
        import_probe_images(local, work / "images")
        cluster = RealCluster(local.kubeconfig, local.node_name, local)
        with fake_host_driver(Path("/"), "dgx-h100", work / "driver") as driver:
            deployment = Deployment(cluster, release, "base", env=driver.serve_env)
            deployment.install()
            client = cluster.client()
            client.request(
                "POST", TEMPLATES, body=template("bench-gpu", {"deviceClassName": DEFAULT_DRIVER_NAME})
            )
            plain: list[float] = []
            claimed: list[float] = []
            for i in range(args.rounds + 1):  # the first round warms the image and the connections
                for with_claim, samples in ((False, plain), (True, claimed)):
                    name = f"bench-{'claim' if with_claim else 'plain'}-{i}"
                    seconds = create_to_running(client, name, "bench-gpu" if with_claim else None)
                    if with_claim and i == args.rounds and not args.earlier:  # what they ran: CUDA worked

                        def probed(pod_name: str = name) -> str:
                            log = cluster.kubectl("logs", pod_name).stdout
                            return log if "probe ok" in log or "error" in log else ""

                        log = wait(probed, 30, "the probe's output")
                        assert cuda.parse_probe(log).ok, log
                    delete(client, name)
                    if with_claim:
                        wait_unprepared(deployment)
                    if i:
                        samples.append(seconds)
            print(summary("pod create -> Running, slim image, no claim", plain))
            print(summary("pod create -> Running, slim image, one-GPU claim", claimed))
            added = statistics.median(claimed) - statistics.median(plain)
            print(f"the claim adds (difference of medians): {added * 1e3:.0f} ms")
            served = [
                float(record["ms"]) / 1e3
                for line in deployment.all_logs().splitlines()
                if line.startswith("{")
                and (record := json.loads(line)).get("event") == "NodePrepareResources"
            ]
            print(summary("plugin-side NodePrepareResources (its log)", served[1:]))
            deployment.uninstall()
    finally:
        local.stop()


if __name__ == "__main__":
    main()
