"""Issue 24: pod create -> Running in a slim Debian image without a claim, with a one-GPU claim on
dradriver, and with a one-device claim on the Go reference plugin, on one real single-node
Kubernetes 1.36 running both.

Run: make release VERSION=0.1.0 && .venv/bin/python -m bench.bench_cuda_pods \\
         --bin /var/tmp/dradriver-k8s-bin --release build/release/dradriver-0.1.0 \\
         --go-plugin FILE [--rounds 20]

`--go-plugin` is the unpacked ../shared/anchors plugin (dra-example-kubeletplugin v0.4.0 on the
upstream Go kubeletplugin helper). dradriver runs as the GPU DaemonSet (`deploy/base`) on the
fake host driver of the real-cluster suite (tests/e2e/fakedriver.py: the C fake NVML the plugin
discovers through, the fake libcuda and nvidia-smi the specs mount); the Go reference runs on the
same node as a host process registered with the kubelet (bench_burst.go_on_node: its own
DeviceClass, its client limit raised, a user bound to the plugin's ClusterRole), 8 devices. Both
run the whole time. The images are the suite's probe roots (tests/e2e/cudaimages.py).

Three variants, the same pod each (the Debian slim root's CUDA probe with `--stay` on a read-only
root): (a) no claim; (b) a one-GPU claim from a ResourceClaimTemplate of dradriver's DeviceClass:
it loads libcuda.so.1 by SONAME, sees its GPU and runs nvidia-smi -L (checked on the last round);
(c) a one-device claim of the Go reference's DeviceClass: its CDI spec sets only environment
variables, so the probe finds no libcuda, as without a claim, and stays Running. c - a is what
any claim costs on this platform (scheduler allocation, claim status writes, the kubelet's
NodePrepareResources round trip, containerd's CDI injection) with the reference driver; b - c
is dradriver's share above that floor.

Timed from the client: create -> Running (the pod polled every 5 ms); after each pod is deleted
its claim's unprepare is awaited, untimed. Each round runs the three once, the order rotating
round by round; the first round only warms up. The kubelet's own
dra_grpc_operations_duration_seconds (the node's /metrics) gives each driver's mean
NodePrepareResources over the counted rounds (_sum/_count after the warm-up and at the end).

Where the time goes: containerd's own event stream (`ctr events`, nanosecond timestamps) runs
beside the rounds, and each pod's sandbox and container are looked up by their CRI labels after
it is Running. Per variant, the median of each phase: create -> sandbox created (scheduling,
allocation, the kubelet's NodePrepareResources, sandbox set-up), sandbox created -> container
created (the sandbox's start; the kubelet asks for the container, containerd applies the CDI
edits to its spec), container created -> task created (runc creates the container: its mounts,
device nodes, the read-only root), task created -> started, started -> Running seen by the client.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import re
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.bench_burst import GO_DRIVER, go_on_node, go_unprepared, method_label
from bench.bench_e2e import TEMPLATES, delete, histogram_totals, template
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
GO_DEVICES = 8
METRIC = "dra_grpc_operations_duration_seconds"


@dataclass
class Variant:
    label: str
    #: Pod names are `bench-<tag>-<round>`.
    tag: str
    #: The ResourceClaimTemplate of its claim, and the DRA driver that prepares it; None: no claim.
    template: str | None = None
    driver: str | None = None
    #: Waits until the node holds nothing of this variant's claim any more.
    unprepared: Callable[[], None] = lambda: None
    samples: list[float] = field(default_factory=list)
    #: (pod name, created, Running) of the counted rounds, for the phases.
    pods: list[tuple[str, float, float]] = field(default_factory=list)


#: Phases of a pod's start, each between two of these marks (containerd's topics, or the client's).
MARKS = (
    "create",
    "sandbox /containers/create",
    "/containers/create",
    "/tasks/create",
    "/tasks/start",
    "Running",
)
EVENT = re.compile(r"^(\S+ \S+) (\S+) \S+ \S+ (/\S+) (\{.*\})$")


class ContainerdEvents:
    """`ctr events` beside the rounds: when each container was created and its task created and
    started, by containerd's clock (the same host clock as the client's)."""

    def __init__(self, local: LocalCluster, path: Path) -> None:
        self._local = local
        self._path = path
        self._out = path.open("w")
        self._process = subprocess.Popen(
            [str(local.bin_dir / "ctr"), "--address", str(local.containerd_socket), "events"],
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )
        #: pod name -> (sandbox id, container id)
        self.pods: dict[str, tuple[str, str]] = {}

    def note(self, pod_name: str) -> None:
        """Find the pod's sandbox and container by their CRI labels (while they exist)."""
        ids = self._local.ctr("containers", "ls", "-q", f'labels."io.kubernetes.pod.name"=={pod_name}').stdout
        kinds: dict[str, str] = {}
        for cid in ids.split():
            labels = json.loads(self._local.ctr("containers", "info", cid).stdout).get("Labels") or {}
            kinds[labels.get("io.cri-containerd.kind", "")] = cid
        self.pods[pod_name] = (kinds["sandbox"], kinds["container"])

    def stop(self) -> dict[str, dict[str, float]]:
        """Container id -> topic -> epoch seconds (the first event of each topic)."""
        self._process.terminate()
        self._process.wait(10)
        self._out.close()
        seen: dict[str, dict[str, float]] = {}
        for line in self._path.read_text().splitlines():
            match = EVENT.match(line)
            if not match:
                continue
            stamp, zone, topic, body = match.groups()
            when = _epoch(stamp, zone)
            data = json.loads(body)
            cid = data.get("id") or data.get("container_id")
            if cid:
                seen.setdefault(cid, {}).setdefault(topic, when)
        return seen


def _epoch(stamp: str, zone: str) -> float:
    """`2026-11-28 01:20:00.123456789` with `+0000` -> epoch seconds (nanoseconds cut to micro)."""
    day, clock = stamp.split(" ")
    whole, _, fraction = clock.partition(".")
    parsed = datetime.datetime.strptime(f"{day} {whole} {zone}", "%Y-%m-%d %H:%M:%S %z")
    return parsed.timestamp() + float(f"0.{fraction or '0'}")


def phases(
    created: float, running: float, sandbox: dict[str, float], container: dict[str, float]
) -> list[float]:
    marks = [
        created,
        sandbox["/containers/create"],
        container["/containers/create"],
        container["/tasks/create"],
        container["/tasks/start"],
        running,
    ]
    return [b - a for a, b in itertools.pairwise(marks)]


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


def create_to_running(
    client: KubeClient, name: str, claim: str | None, timeout: float = 120
) -> tuple[float, float]:
    """When the pod was created and when it was seen Running (epoch seconds); a pod that fails
    or never runs is an error."""
    started = time.time()
    client.request("POST", PODS, body=pod(name, claim))
    while True:
        status = client.request("GET", f"{PODS}/{name}").get("status", {})
        if status.get("phase") == "Running":
            return started, time.time()
        if status.get("phase") == "Failed" or time.time() - started > timeout:
            raise RuntimeError(f"pod {name} did not reach Running: {json.dumps(status)}")
        time.sleep(0.005)


def prepare_totals(text: str, drivers: list[str]) -> dict[str, tuple[float, float]]:
    """Per driver, the kubelet's NodePrepareResources histogram `_sum` (s) and `_count`."""
    method = method_label("NodePrepareResources")
    return {d: histogram_totals(text, METRIC, {"driver_name": d, "method_name": method}) for d in drivers}


def difference(name: str, minuend: Variant, subtrahend: Variant) -> str:
    median = statistics.median(minuend.samples) - statistics.median(subtrahend.samples)
    return f"{name}: {median * 1e3:+.0f} ms (difference of medians)"


def load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_cluster_arguments(parser)
    parser.add_argument("--go-plugin", type=Path, required=True, help="the unpacked Go reference plugin")
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
        with (
            fake_host_driver(Path("/"), "dgx-h100", work / "driver") as driver,
            go_on_node(local, cluster.client(), args.go_plugin, GO_DEVICES),
        ):
            deployment = Deployment(cluster, release, "base", env=driver.serve_env)
            deployment.install()
            client = cluster.client()
            dradriver = Variant(
                "one-GPU claim, dradriver", "dradriver", "bench-gpu", DEFAULT_DRIVER_NAME,
                lambda: wait_unprepared(deployment),
            )  # fmt: skip
            go = Variant("one-device claim, Go reference", "go", "bench-go", GO_DRIVER, go_unprepared)
            variants = [Variant("no claim", "plain"), dradriver, go]
            for v in (dradriver, go):
                client.request(
                    "POST", TEMPLATES, body=template(str(v.template), {"deviceClassName": v.driver})
                )

            def node_metrics() -> str:
                return cluster.kubectl(
                    "get", "--raw", f"/api/v1/nodes/{cluster.node_name}/proxy/metrics"
                ).stdout

            drivers = [DEFAULT_DRIVER_NAME, GO_DRIVER]
            events = ContainerdEvents(local, work / "containerd-events.txt")
            print(f"load average at the start: {load()}", flush=True)
            for i in range(args.rounds + 1):  # the first round warms the image and the connections
                if i == 1:
                    before = prepare_totals(node_metrics(), drivers)
                for variant in variants[i % 3 :] + variants[: i % 3]:
                    name = f"bench-{variant.tag}-{i}"
                    created, running = create_to_running(client, name, variant.template)
                    events.note(name)
                    if variant is dradriver and i == args.rounds and not args.earlier:  # CUDA worked

                        def probed(pod_name: str = name) -> str:
                            log = cluster.kubectl("logs", pod_name).stdout
                            return log if "probe ok" in log or "error" in log else ""

                        log = wait(probed, 30, "the probe's output")
                        assert cuda.parse_probe(log).ok, log
                    delete(client, name)
                    variant.unprepared()
                    if i:
                        variant.samples.append(running - created)
                        variant.pods.append((name, created, running))
                print(f"round {i}{' (warm-up)' if not i else ''} done, load average {load()}", flush=True)
            after = prepare_totals(node_metrics(), drivers)
            seen = events.stop()
            print(f"load average at the end: {load()}")
            for variant in variants:
                print(summary(f"pod create -> Running, slim image, {variant.label}", variant.samples))
            plain = variants[0]
            print(difference("dradriver's claim (b - a)", dradriver, plain))
            print(difference("the platform's floor for a claim, Go reference (c - a)", go, plain))
            print(difference("dradriver above the floor (b - c)", dradriver, go))
            for d in drivers:
                added, calls = (after[d][k] - before[d][k] for k in (0, 1))
                mean = f"{added / calls * 1e3:.2f} ms" if calls else "-"
                print(
                    f"kubelet NodePrepareResources to {d}, mean of the counted rounds: {mean} (n={calls:.0f})"
                )
            served = [
                float(record["ms"]) / 1e3
                for line in deployment.all_logs().splitlines()
                if line.startswith("{")
                and (record := json.loads(line)).get("event") == "NodePrepareResources"
            ]
            print(summary("dradriver-side NodePrepareResources (its log)", served[1:]))
            names = [f"{a} -> {b}" for a, b in itertools.pairwise(MARKS)]
            print("phases, median ms (" + "; ".join(names) + "):")
            for variant in variants:
                rows = [
                    phases(created, running, seen[events.pods[name][0]], seen[events.pods[name][1]])
                    for name, created, running in variant.pods
                ]
                medians = [statistics.median(column) * 1e3 for column in zip(*rows, strict=True)]
                print(f"  {variant.label}: " + " | ".join(f"{m:.1f}" for m in medians))
            deployment.uninstall()
    finally:
        local.stop()


if __name__ == "__main__":
    main()
