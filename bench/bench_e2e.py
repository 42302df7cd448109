"""Issue 11 figures on a real single-node Kubernetes 1.36 with the `fake` DaemonSet.

Run: make release VERSION=0.1.0 && .venv/bin/python -m bench.bench_e2e \\
         --bin /var/tmp/dradriver-k8s-bin --release build/release/dradriver-0.1.0 [--rounds 15]

Starts the cluster (tests/e2e/cluster.py), imports the release's image, installs its `fake`
overlay manifests, then alternates a pod without a claim and the same pod with a one-GPU claim
(same image, same command), timing create -> Running from the client (the pod is polled every
5 ms). Afterwards it reads the kubelet's own histogram of NodePrepareResources
(`dra_grpc_operations_duration_seconds` from the node's /metrics) and the plugin's per-call
durations from its log.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from typing import Any

from bench.common import (
    add_cluster_arguments,
    bucket_quantile,
    fake_overlay_on_local_cluster,
    histogram,
    parse_metrics,
    summary,
)
from dradriver import DEFAULT_DRIVER_NAME
from dradriver.kube import KubeClient, NotFoundError
from tests.e2e.workloads import wait_unprepared

PODS = "/api/v1/namespaces/default/pods"
TEMPLATES = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaimtemplates"


def template(name: str, exactly: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    }


def pod(name: str, claim: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 5,
        "containers": [
            {
                "name": "app",
                "image": "busybox:1.37",
                "command": ["sh", "-c", 'trap "exit 0" TERM; sleep 3600 & wait'],
            }
        ],
    }
    if claim:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": claim}]
        spec["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def create_to_running(client: KubeClient, name: str, claim: str | None) -> float:
    started = time.perf_counter()
    client.request("POST", PODS, body=pod(name, claim))
    while True:
        status = client.request("GET", f"{PODS}/{name}").get("status", {})
        if status.get("phase") == "Running":
            return time.perf_counter() - started
        time.sleep(0.005)


def delete(client: KubeClient, name: str, force: bool = False) -> None:
    query = [("gracePeriodSeconds", "0")] if force else None
    client.request("DELETE", f"{PODS}/{name}", query=query)
    while True:
        try:
            client.request("GET", f"{PODS}/{name}")
        except NotFoundError:
            return
        time.sleep(0.05)


def histogram_quantile(text: str, metric: str, labels: dict[str, str], q: float) -> tuple[float, int]:
    """Prometheus-style quantile (linear within the bucket) of a histogram on the node's /metrics,
    and how many observations it has."""
    buckets = histogram(parse_metrics(text), metric, **labels)
    return bucket_quantile(buckets, q), int(buckets[-1][1])


def histogram_totals(text: str, metric: str, labels: dict[str, str]) -> tuple[float, float]:
    """A histogram's `_sum` and `_count`: their differences between two scrapes give the exact mean
    of the observations in between, finer than the buckets."""
    totals = {"sum": 0.0, "count": 0.0}
    for line in text.splitlines():
        for part in totals:
            if line.startswith(f"{metric}_{part}{{"):
                found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
                if all(found.get(k) == v for k, v in labels.items()):
                    totals[part] += float(line.rsplit(" ", 1)[1])
    return totals["sum"], totals["count"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_cluster_arguments(parser)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()

    with fake_overlay_on_local_cluster(args.bin, args.release) as deployment:
        cluster = deployment.cluster
        client = cluster.client()
        client.request(
            "POST", TEMPLATES, body=template("bench-gpu", {"deviceClassName": DEFAULT_DRIVER_NAME})
        )
        every = {"deviceClassName": DEFAULT_DRIVER_NAME, "allocationMode": "All"}
        client.request("POST", TEMPLATES, body=template("bench-all-gpus", every))
        kubelet_metric = "dra_grpc_operations_duration_seconds"
        prepare_labels = {
            "driver_name": DEFAULT_DRIVER_NAME,
            "method_name": "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
        }

        def node_metrics() -> str:
            return cluster.kubectl("get", "--raw", f"/api/v1/nodes/{cluster.node_name}/proxy/metrics").stdout

        def kubelet_prepares() -> tuple[float, float]:
            return histogram_totals(node_metrics(), kubelet_metric, prepare_labels)

        plain: list[float] = []
        claimed: list[float] = []
        for i in range(args.rounds + 1):  # the first round warms the image and the connections
            if i == 1:
                before = kubelet_prepares()
            for with_claim, samples in ((False, plain), (True, claimed)):
                name = f"bench-{'claim' if with_claim else 'plain'}-{i}"
                seconds = create_to_running(client, name, "bench-gpu" if with_claim else None)
                delete(client, name)
                if with_claim:
                    wait_unprepared(deployment)
                if i:
                    samples.append(seconds)
        after = kubelet_prepares()
        mean = (after[0] - before[0]) / (after[1] - before[1])
        # A pod holding every GPU force-deleted, and the next pod for them created at once.
        takeover: list[float] = []
        create_to_running(client, "bench-holder-0", "bench-all-gpus")
        for i in range(1, args.rounds // 3 + 1):
            delete(client, f"bench-holder-{i - 1}", force=True)
            takeover.append(create_to_running(client, f"bench-holder-{i}", "bench-all-gpus"))
        delete(client, f"bench-holder-{args.rounds // 3}")
        wait_unprepared(deployment)
        metrics = node_metrics()
        p50, count = histogram_quantile(metrics, kubelet_metric, prepare_labels, 0.5)
        p99, _ = histogram_quantile(metrics, kubelet_metric, prepare_labels, 0.99)
        served = [
            float(record["ms"])
            for line in deployment.all_logs().splitlines()
            if line.startswith("{") and (record := json.loads(line)).get("event") == "NodePrepareResources"
        ][1:]
        print(summary("pod create -> Running, no claim", plain))
        print(summary("pod create -> Running, one-GPU claim", claimed))
        added = statistics.median(claimed) - statistics.median(plain)
        print(f"the claim adds (difference of medians): {added * 1e3:.0f} ms")
        print(
            f"kubelet dra_grpc_operations_duration_seconds, NodePrepareResources: n={count} "
            f"p50={p50 * 1e3:.2f}ms p99={p99 * 1e3:.2f}ms (interpolated within buckets), "
            f"exact mean of the {args.rounds} one-GPU claims' prepares={mean * 1e3:.2f}ms (_sum/_count)"
        )
        print(summary("plugin-side NodePrepareResources (its log)", [ms / 1e3 for ms in served]))
        print(summary("force-deleted holder of all GPUs -> next pod for them Running", takeover))
        deployment.uninstall()


if __name__ == "__main__":
    main()
