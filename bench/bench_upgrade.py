"""Issue 15 figures on a real single-node Kubernetes 1.36: surge rollouts and the live inventory.

Run: make release VERSION=0.1.0 && .venv/bin/python -m bench.bench_upgrade --bin /var/tmp/k8s-bin \\
         --release build/release/dradriver-0.1.0 [--rollouts 5] [--changes 20]

Starts the cluster (tests/e2e/cluster.py), imports the release's image and installs its `fake`
overlay manifests.

1. Rollouts: for each pod-template change, every registered instance of the plugin is asked to
   prepare an empty set of claims every 20 ms (GetInfo on its registration socket, then
   NodePrepareResources on its DRA socket, as the kubelet calls them); the figure is the longest
   outage: from the first round in which no instance answered to the next in which one did (0 if
   every round found one). The same with the previous strategy (maxSurge 0, maxUnavailable 1),
   for comparison.
2. Inventory, with events: the plugin reads its fake profile from a host directory; the file is
   replaced (2 <-> 3 GPUs) and the time until the API server holds the new pool is measured
   (ResourceSlices listed every 10 ms).
3. Inventory through NVML, on the C fake NVML (tests/fakenvml) with a `serve` on the host
   publishing a second driver's pool to the same API server: a MIG layout change with NVML's MIG
   config event, and without the event (found by --rescan-interval).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import add_cluster_arguments, fake_overlay_on_local_cluster, summary
from dradriver.backend.select import open_backend
from dradriver.devicemodel import build_devices
from dradriver.discovery import NodeInventory
from dradriver.kube import KubeClient
from tests.e2e.availability import PrepareProbe
from tests.e2e.plugin import DAEMONSET, DRIVER, NAMESPACE, Deployment, wait
from tests.e2e.realcluster import RealCluster
from tests.fakenvml.harness import CONFIG_ENV, EVENTS_ENV, EventPipe, build_library, config_text
from tests.helpers import ServeProcess, write_gpu_profile

HOST_DIR = Path("/var/lib/dradriver-bench-profile")
NVML_DRIVER = "gpu-nvml.dradriver.dev"


def rollouts(cluster: RealCluster, deployment: Deployment, count: int, tag: str) -> list[float]:
    gaps = []
    for i in range(count):
        probe = PrepareProbe(period=0.02)
        probe.start()
        time.sleep(1)  # the probe's baseline: instances answering before the change
        cluster.kubectl(
            "-n", NAMESPACE, "set", "env", f"daemonset/{DAEMONSET}", "-c", "plugin", f"BENCH_ROUND={tag}{i}"
        )
        deployment.wait_ready()
        time.sleep(1)
        probe.stop()
        gaps.append(probe.longest_outage)
        print(
            f"rollout {tag}{i}: longest outage {probe.longest_outage:.3f} s "
            f"({probe.failed_rounds} of {probe.rounds} probe rounds without an answer)",
            flush=True,
        )
    return gaps


def strategy(cluster: RealCluster, surge: int, unavailable: int) -> None:
    patch = {
        "spec": {"updateStrategy": {"rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable}}}
    }
    cluster.kubectl("-n", NAMESPACE, "patch", f"daemonset/{DAEMONSET}", "-p", json.dumps(patch))


def device_count(client: KubeClient, node: str, driver: str) -> int:
    items = client.list_resource_slices(f"spec.driver={driver},spec.nodeName={node}")["items"]
    newest = max((s["spec"]["pool"]["generation"] for s in items), default=0)
    return sum(
        len(s["spec"].get("devices") or []) for s in items if s["spec"]["pool"]["generation"] == newest
    )


def until(predicate: Callable[[], bool], timeout: float = 60) -> float:
    """Seconds until `predicate()` holds (polled every 10 ms)."""
    started = time.perf_counter()
    while not predicate():
        if time.perf_counter() - started > timeout:
            raise TimeoutError("no change seen")
        time.sleep(0.01)
    return time.perf_counter() - started


def profile_changes(cluster: RealCluster, deployment: Deployment, count: int) -> list[float]:
    HOST_DIR.mkdir(parents=True, exist_ok=True)

    def write(gpus: int) -> None:
        os.replace(write_gpu_profile(HOST_DIR / ".gpus.yaml.new", gpus), HOST_DIR / "gpus.yaml")

    write(2)
    deployment.profile_from_host(HOST_DIR)
    client = cluster.client()
    wait(lambda: device_count(client, cluster.node_name, DRIVER) == 2, 60, "the 2-GPU pool")
    samples = []
    for i in range(count):
        gpus = 3 if i % 2 == 0 else 2
        time.sleep(0.5)
        write(gpus)
        samples.append(until(lambda g=gpus: device_count(client, cluster.node_name, DRIVER) == g))  # type: ignore[misc]
    return samples


def mig_destroyed(inventory: NodeInventory, keep: int) -> NodeInventory:
    first = inventory.gpus[0]
    return dataclasses.replace(
        inventory,
        gpus=(dataclasses.replace(first, mig_devices=first.mig_devices[:keep]), *inventory.gpus[1:]),
    )


def nvml_changes(cluster: RealCluster, count: int, rescan: float, with_event: bool) -> list[float]:
    inventory = open_backend("dgx-a100-mig").discover()
    layouts = [inventory, mig_destroyed(inventory, 1)]
    sizes = [len(build_devices(i, driver_name=NVML_DRIVER).devices) for i in layouts]
    client = cluster.client()
    with tempfile.TemporaryDirectory(prefix="dra-", dir="/tmp") as tmp:
        root = Path(tmp)
        library = build_library(root / "lib")
        config = root / "nvml.conf"
        config.write_text(config_text(inventory))
        events = EventPipe(root / "events")
        env = {"LD_LIBRARY_PATH": str(library.parent), CONFIG_ENV: str(config), EVENTS_ENV: str(events.path)}
        serve = ServeProcess(
            root,
            [
                "--kubeconfig",
                str(cluster.kubeconfig),
                "--node-name",
                cluster.node_name,
                "--rescan-interval",
                str(rescan),
            ],
            {**env, "DRADRIVER_DRIVER_NAME": NVML_DRIVER},
            NVML_DRIVER,
            claims_from_files=True,
            fake_gpus=None,
        ).start()
        try:
            wait(
                lambda: device_count(client, cluster.node_name, NVML_DRIVER) == sizes[0], 60, "the NVML pool"
            )
            samples = []
            for i in range(count):
                target = (i + 1) % 2
                time.sleep(0.5 + (i % 5) * rescan / 5)  # spread the changes over the rescan period
                aside = config.with_name(".nvml.conf.new")
                aside.write_text(config_text(layouts[target]))
                os.replace(aside, config)
                if with_event:
                    events.send("mig 0")
                samples.append(
                    until(lambda t=target: device_count(client, cluster.node_name, NVML_DRIVER) == sizes[t])  # type: ignore[misc]
                )
            return samples
        finally:
            serve.stop()
            events.close()
            cluster.kubectl("delete", "resourceslices", "--field-selector", f"spec.driver={NVML_DRIVER}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_cluster_arguments(parser)
    parser.add_argument("--rollouts", type=int, default=5)
    parser.add_argument("--changes", type=int, default=20)
    parser.add_argument("--rescan", type=float, default=2.0, help="--rescan-interval of the NVML serve")
    args = parser.parse_args()

    results: dict[str, Any] = {}
    with fake_overlay_on_local_cluster(args.bin, args.release) as deployment:
        cluster = deployment.cluster
        try:
            lines = []
            if args.rollouts:
                surge = rollouts(cluster, deployment, args.rollouts, "surge-")
                strategy(cluster, surge=0, unavailable=1)
                deployment.wait_ready()
                replace = rollouts(cluster, deployment, max(2, args.rollouts // 2), "replace-")
                strategy(cluster, surge=1, unavailable=0)
                results |= {"surge": surge, "replace": replace}
                lines += [
                    summary("surge rollout (maxSurge 1): longest outage of NodePrepareResources", surge, "s"),
                    summary("replace rollout (maxSurge 0, maxUnavailable 1), for comparison", replace, "s"),
                ]
            if args.changes:
                files = profile_changes(cluster, deployment, args.changes)
                event = nvml_changes(cluster, args.changes, args.rescan, with_event=True)
                rescan = nvml_changes(cluster, args.changes, args.rescan, with_event=False)
                results |= {"file": files, "event": event, "rescan": rescan}
                lines += [
                    summary("fake profile file replaced -> slices updated", files, "s"),
                    summary("NVML MIG change with its event -> slices updated", event, "s"),
                    summary(f"NVML MIG change, no event (--rescan-interval {args.rescan:g})", rescan, "s"),
                ]
            print("\n".join(lines))
            json.dump(results, sys.stdout)
            print()
            deployment.uninstall()
        finally:
            for name in os.listdir(HOST_DIR) if HOST_DIR.exists() else []:
                (HOST_DIR / name).unlink()
            if HOST_DIR.exists():
                HOST_DIR.rmdir()


if __name__ == "__main__":
    main()
