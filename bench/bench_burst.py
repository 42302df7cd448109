"""Issue 25: a node under a pod burst, dradriver beside the Go reference on one real node.

Run: make release VERSION=0.1.0 && .venv/bin/python -m bench.bench_burst \\
         --bin /var/tmp/dradriver-k8s-bin --release build/release/dradriver-0.1.0 \\
         --go-plugin FILE [--rounds 3] [--pods 32]

Starts the single-node cluster (tests/e2e/cluster.py: kubelet, containerd with CDI, scheduler,
controller-manager), installs the release's `fake` overlay and points it at a fake profile of
--pods GPUs on the host (a rollout), and runs the Go reference (`../shared/anchors`, unpacked) on
the same node as a host process registered with the kubelet through its plugin registry, with
--pods devices, its client limit raised (as in bench_vs_go), its own DeviceClass and a user bound
to the plugin's ClusterRole. Both run the whole time.

Each round, per plugin (the order alternates): --pods pods are created back to back, each with
its own one-device claim from a ResourceClaimTemplate of that plugin's DeviceClass; the time from
the first create until all are Running, then every pod is deleted and the time until all are gone
(the pod objects; the claims' removal and the node's unprepare are awaited before the next burst
but not timed). --warmup rounds first are not counted. The kubelet's own
dra_grpc_operations_duration_seconds (the node's /metrics) is read before and after each counted
burst, and its NodePrepareResources / NodeUnprepareResources p50 and p99 come from the buckets
the counted bursts added (linear within a bucket) with the exact mean from _sum/_count.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.bench_e2e import TEMPLATES, pod, template
from bench.bench_vs_go import grant_plugin_role
from bench.common import (
    Samples,
    add_cluster_arguments,
    bucket_quantile,
    fake_overlay_on_local_cluster,
    histogram,
    metric_sum,
    parse_metrics,
)
from dradriver import DEFAULT_DRIVER_NAME
from dradriver.kube import KubeClient, load_client
from tests.e2e.cluster import KUBELET_ROOT, LocalCluster
from tests.e2e.processes import Component, wait_until
from tests.e2e.workloads import wait_unprepared
from tests.helpers import write_gpu_profile

GO_DRIVER = "gpu.example.com"
CDI_ROOT = Path("/var/run/cdi")
NAMESPACE = "default"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
CLAIMS = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"
METRIC = "dra_grpc_operations_duration_seconds"
METHODS = ("NodePrepareResources", "NodeUnprepareResources")


@dataclass
class Plugin:
    label: str
    driver: str
    #: Waits until the node holds nothing for this plugin any more.
    wait_unprepared: Callable[[], None]
    running: list[float] = field(default_factory=list)
    gone: list[float] = field(default_factory=list)
    #: Per method, the kubelet's buckets the counted bursts added.
    buckets: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    totals: dict[str, tuple[float, float]] = field(default_factory=dict)


def node_slice_devices(client: KubeClient, driver: str, node: str) -> int:
    listed = client.list_resource_slices(f"spec.driver={driver},spec.nodeName={node}")
    return sum(len(s["spec"].get("devices", [])) for s in listed["items"])


@contextlib.contextmanager
def go_on_node(local: LocalCluster, admin: KubeClient, binary: Path, devices: int) -> Iterator[None]:
    """The Go reference as a host process of this node, registered with its kubelet."""
    user = "bench-go-plugin"
    grant_plugin_role(admin, user)
    kubeconfig = local.control_plane.kubeconfig_for(user, user)
    admin.request(
        "POST",
        "/apis/resource.k8s.io/v1/deviceclasses",
        body={
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": GO_DRIVER},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{GO_DRIVER}"'}}]},
        },
    )
    before = set(CDI_ROOT.glob(f"k8s.{GO_DRIVER}*")) if CDI_ROOT.is_dir() else set()
    argv = [
        str(binary), "--node-name", local.node_name, "--driver-name", GO_DRIVER,
        "--device-profile", "gpu", "--num-devices", str(devices), "--cdi-root", str(CDI_ROOT),
        "--kubelet-registrar-directory-path", str(KUBELET_ROOT / "plugins_registry"),
        "--kubelet-plugins-directory-path", str(KUBELET_ROOT / "plugins"),
        "--kubeconfig", str(kubeconfig), "--kube-api-qps", "1000", "--kube-api-burst", "1000",
    ]  # fmt: skip
    component = Component("go-plugin", argv, local.logs / "go-plugin.log")
    component.start()
    try:
        wait_until(
            lambda: node_slice_devices(admin, GO_DRIVER, local.node_name) == devices,
            60,
            f"the Go reference's {devices} devices published",
            component,
        )
        yield
    finally:
        component.stop()
        for leftover in set(CDI_ROOT.glob(f"k8s.{GO_DRIVER}*")) - before:
            leftover.unlink(missing_ok=True)


def go_unprepared() -> None:
    """No claim CDI spec of the Go reference left (it removes each at unprepare)."""
    wait_until(
        lambda: not list(CDI_ROOT.glob(f"k8s.{GO_DRIVER}-claim_*")), 60, "the Go reference's unprepares"
    )


def listed_pods(client: KubeClient, tag: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = client.request(
        "GET", PODS, query=[("labelSelector", f"bench-burst={tag}")]
    )["items"]
    return items


def burst(client: KubeClient, template_name: str, pods: int, tag: str) -> tuple[float, float]:
    """Seconds from the first create until every pod is Running, and from the first delete until
    every pod is gone."""
    started = time.perf_counter()
    for i in range(pods):
        body = pod(f"burst-{tag}-{i}", template_name)
        body["metadata"]["labels"] = {"bench-burst": tag}
        client.request("POST", PODS, body=body)
    while True:
        phases = [p.get("status", {}).get("phase") for p in listed_pods(client, tag)]
        if "Failed" in phases:
            raise RuntimeError(f"a pod of burst {tag} failed")
        if phases.count("Running") == pods:
            running = time.perf_counter() - started
            break
        time.sleep(0.05)
    started = time.perf_counter()
    for i in range(pods):
        client.request("DELETE", f"{PODS}/burst-{tag}-{i}")
    while listed_pods(client, tag):
        time.sleep(0.05)
    return running, time.perf_counter() - started


def claims_gone(client: KubeClient) -> bool:
    return not client.request("GET", CLAIMS)["items"]


def method_label(method: str) -> str:
    return f"/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/{method}"


def record(plugin: Plugin, before: Samples, after: Samples) -> None:
    """Adds what the kubelet's histogram gained between two scrapes to the plugin's figures."""
    for method in METHODS:
        where = {"driver_name": plugin.driver, "method_name": method_label(method)}
        old = dict(histogram(before, METRIC, **where))
        added = [(bound, count - old.get(bound, 0.0)) for bound, count in histogram(after, METRIC, **where)]
        held = dict(plugin.buckets.get(method, []))
        plugin.buckets[method] = [(bound, count + held.get(bound, 0.0)) for bound, count in added]
        sums = [
            metric_sum(s, f"{METRIC}_{part}", **where).get((), 0.0)
            for s in (before, after)
            for part in ("sum", "count")
        ]
        old_sum, old_count = plugin.totals.get(method, (0.0, 0.0))
        plugin.totals[method] = (old_sum + sums[2] - sums[0], old_count + sums[3] - sums[1])


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.1f} ({min(values):.1f} to {max(values):.1f})"


def report(plugins: list[Plugin], loads: list[str]) -> str:
    lines = [
        f"| figure (median of rounds; range) | {' | '.join(p.label for p in plugins)} |",
        "|" + " --- |" * (len(plugins) + 1),
        f"| create -> all Running (s) | {' | '.join(spread(p.running) for p in plugins)} |",
        f"| delete -> all gone (s) | {' | '.join(spread(p.gone) for p in plugins)} |",
    ]
    for method in METHODS:
        for label, q in (("p50", 0.5), ("p99", 0.99)):
            cells = [f"{bucket_quantile(p.buckets[method], q) * 1e3:.1f}" for p in plugins]
            lines.append(f"| kubelet {method} {label} (ms, within buckets) | {' | '.join(cells)} |")
        means = [
            f"{p.totals[method][0] / p.totals[method][1] * 1e3:.1f} (n={p.totals[method][1]:.0f})"
            for p in plugins
        ]
        lines.append(f"| kubelet {method} mean (ms, _sum/_count) | {' | '.join(means)} |")
    lines += ["", "load average (1 min) at each burst's start and end: " + ", ".join(loads)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_cluster_arguments(parser)
    parser.add_argument("--go-plugin", type=Path, required=True)
    parser.add_argument("--pods", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args()

    profile_dir = Path("/var/tmp/dradriver-bench-burst")
    profile_dir.mkdir(exist_ok=True)
    write_gpu_profile(profile_dir / "gpus.yaml", args.pods)
    with fake_overlay_on_local_cluster(args.bin, args.release) as deployment:
        cluster = deployment.cluster
        local = cluster.require_local("the Go reference runs as a host process of the node")
        client = load_client(str(cluster.kubeconfig))
        assert client is not None
        deployment.profile_from_host(profile_dir)
        wait_until(
            lambda: node_slice_devices(client, DEFAULT_DRIVER_NAME, cluster.node_name) == args.pods,
            60,
            f"dradriver's {args.pods} devices published",
        )
        with go_on_node(local, client, args.go_plugin, args.pods):
            plugins = [
                Plugin("dradriver", DEFAULT_DRIVER_NAME, lambda: wait_unprepared(deployment)),
                Plugin("Go reference", GO_DRIVER, go_unprepared),
            ]
            for p in plugins:
                client.request(
                    "POST", TEMPLATES, body=template(f"burst-{p.driver}", {"deviceClassName": p.driver})
                )

            def node_metrics() -> Samples:
                raw = cluster.kubectl(
                    "get", "--raw", f"/api/v1/nodes/{cluster.node_name}/proxy/metrics"
                ).stdout
                return parse_metrics(raw)

            loads = []
            for n in range(args.warmup + args.rounds):
                for p in plugins if n % 2 == 0 else plugins[::-1]:
                    load = os.getloadavg()[0]
                    before = node_metrics()
                    running, gone = burst(
                        client, f"burst-{p.driver}", args.pods, f"{n}-{p.driver.split('.')[0]}"
                    )
                    wait_until(lambda: claims_gone(client), 120, "the burst's claims deleted")
                    p.wait_unprepared()
                    counted = n >= args.warmup
                    print(
                        f"round {n + 1}{'' if counted else ' (warm-up)'} {p.label}: "
                        f"all Running {running:.1f}s, all gone {gone:.1f}s",
                        flush=True,
                    )
                    if counted:
                        p.running.append(running)
                        p.gone.append(gone)
                        record(p, before, node_metrics())
                        loads.append(f"{load:.2f}→{os.getloadavg()[0]:.2f}")
            print()
            print(report(plugins, loads))
        deployment.uninstall()


if __name__ == "__main__":
    main()
