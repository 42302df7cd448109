"""Publishing figures: first publish, recovery after an external delete, steady-state traffic.

    python -m bench.bench_publish (--k8s-bin DIR | --kubeconfig PATH) [--runs 30] [--steady-seconds 600]

Against a real kube-apiserver: one started from the Kubernetes binaries in --k8s-bin (with its
etcd; `../shared/k8s/unpack.sh DIR`), or the one --kubeconfig names (Nodes it creates are removed
again). Without either, against the test suite's loopback fake API server — a fake's figures are
not the product's.
All connections go through a loopback TCP forwarder that counts them.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import yaml

from bench.common import real_api_server, summary
from dradriver import logs
from dradriver.kube import KubeClient, load_client
from dradriver.publish import SliceController, delete_node_slices, plan_pool
from tests.helpers import wait_for
from tests.publish.fakeslices import desired_slices, fake_devices
from tests.publish.kubefake import FakeApiServer
from tests.publish.tcpproxy import TcpProxy

DRIVER = "gpu.bench.dradriver.dev"


class Bench:
    def __init__(self, kubeconfig: Path, tmp: Path) -> None:
        self.tmp = tmp
        config = yaml.safe_load(kubeconfig.read_text())
        context = next(c for c in config["contexts"] if c["name"] == config["current-context"])["context"]
        cluster = next(c for c in config["clusters"] if c["name"] == context["cluster"])["cluster"]
        scheme, _, hostport = cluster["server"].partition("://")
        host, _, port = hostport.rstrip("/").rpartition(":")
        self.proxy = TcpProxy(host.strip("[]"), int(port))
        if scheme == "https" and not cluster.get("tls-server-name"):
            cluster["tls-server-name"] = host
        cluster["server"] = f"{scheme}://127.0.0.1:{self.proxy.port}"
        self.kubeconfig = tmp / "kubeconfig-proxied"
        self.kubeconfig.write_text(yaml.safe_dump(config))
        self.direct = self.client(kubeconfig)
        self.direct_kubeconfig = kubeconfig
        self.nodes: list[str] = []

    def slice_requests(self) -> Counter[str]:
        """The API server's own count of ResourceSlice requests by verb (its /metrics):
        completed requests, plus the watches open now as WATCH (counted only when they end)."""
        kubectl = Path(sys.executable).parent / "kubectl"
        raw = subprocess.run(
            [str(kubectl), "--kubeconfig", str(self.direct_kubeconfig), "get", "--raw", "/metrics"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        counts: Counter[str] = Counter()
        for line in raw.splitlines():
            if 'resource="resourceslices"' not in line or 'group="resource.k8s.io"' not in line:
                continue
            verb = re.search(r'verb="([A-Z]+)"', line)
            if verb is None:
                continue
            if line.startswith("apiserver_request_total{"):
                counts[verb.group(1)] += int(float(line.rsplit(" ", 1)[1]))
            elif line.startswith("apiserver_longrunning_requests{"):
                counts["open " + verb.group(1)] += int(float(line.rsplit(" ", 1)[1]))
        return counts

    def client(self, kubeconfig: Path | None = None) -> KubeClient:
        client = load_client(str(kubeconfig or self.kubeconfig))
        assert client is not None
        return client

    def node(self) -> str:
        name = f"dradriver-bench-{uuid.uuid4().hex[:10]}"
        self.direct.request(
            "POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
        )
        self.nodes.append(name)
        return name

    def count(self, node: str) -> int:
        return len(self.direct.list_resource_slices(f"spec.driver={DRIVER},spec.nodeName={node}")["items"])

    def cleanup(self) -> None:
        for node in self.nodes:
            delete_node_slices(self.direct, driver_name=DRIVER, node_name=node)
            self.direct.request("DELETE", f"/api/v1/nodes/{node}")
        self.proxy.close()


def desired_for(node: str, devices: int) -> Callable[[], list[dict[str, Any]]]:
    rendered = desired_slices(fake_devices(devices), driver=DRIVER, node=node)
    return lambda: rendered


def first_publish(bench: Bench, devices: int, runs: int) -> list[float]:
    client = bench.client()
    samples = []
    for _ in range(runs + 1):  # the first run warms up lazy imports and is not counted
        node = bench.node()
        controller = SliceController(
            client, driver_name=DRIVER, node_name=node, desired=desired_for(node, devices)
        )
        start = time.perf_counter()
        controller.start()
        assert controller.wait_published(30)
        samples.append(time.perf_counter() - start)
        controller.stop()
    return samples[1:]


def recovery(bench: Bench, devices: int, runs: int) -> list[float]:
    node = bench.node()
    desired = desired_for(node, devices)
    expected = len(desired())
    controller = SliceController(bench.client(), driver_name=DRIVER, node_name=node, desired=desired)
    controller.start()
    assert controller.wait_published(30)
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        delete_node_slices(bench.direct, driver_name=DRIVER, node_name=node)
        wait_for(
            lambda: controller.status.in_sync and bench.count(node) == expected, 30, "republished", 0.005
        )
        samples.append(time.perf_counter() - start)
        time.sleep(0.2)
    controller.stop()
    return samples


def steady(bench: Bench, fake: FakeApiServer | None, seconds: float) -> str:
    node = bench.node()
    controller = SliceController(
        bench.client(), driver_name=DRIVER, node_name=node, desired=desired_for(node, 300)
    )
    connections_before = bench.proxy.connections
    requests_before = len(fake.requests) if fake else 0
    server_before = Counter[str]() if fake else bench.slice_requests()
    controller.start()
    assert controller.wait_published(30)
    time.sleep(1.0)
    published = controller.status.writes.total
    connections = bench.proxy.connections - connections_before
    requests = fake.requests_since(requests_before) if fake else []
    server_published = Counter[str]() if fake else bench.slice_requests()
    time.sleep(seconds)
    writes = controller.status.writes.total - published
    new_connections = bench.proxy.connections - connections_before - connections
    later = fake.requests_since(requests_before + len(requests)) if fake else []
    server_after = Counter[str]() if fake else bench.slice_requests()
    controller.stop()
    if fake:
        lists = [r for r in requests + later if r.path.endswith("/resourceslices") and r.method == "GET"]
        in_window, whole = (
            str(len(later)),
            f"{sum(not r.watch for r in lists)} list, {sum(r.watch for r in lists)} watch",
        )
    else:  # the API server's metrics; the bench's own GETs of the window are none
        window = server_after.copy()
        window.subtract({k: v for k, v in server_published.items() if not k.startswith("open ")})
        in_window = str(sum(v for k, v in window.items() if not k.startswith("open ")))
        run = server_after.copy()
        run.subtract({k: v for k, v in server_before.items() if not k.startswith("open ")})
        whole = ", ".join(f"{v} {k}" for k, v in sorted(run.items()) if v)
    return (
        f"after publish ({published} writes, {connections} connections opened): over {seconds:.0f} s, "
        f"{writes} writes, {in_window} requests, {new_connections} new connections; "
        f"ResourceSlice requests over the whole run: {whole}"
    )


def plan_cost(devices: int, runs: int) -> list[float]:
    """CPU time of one sync pass's decision when nothing changed (every watch event costs one)."""
    want = desired_for("node-a", devices)()
    owner = [{"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "u", "controller": True}]
    stored = [
        {**s, "metadata": {"name": f"{i:05x}-{DRIVER}-node-a-x", "uid": str(i), "ownerReferences": owner}}
        for i, s in enumerate(want)
    ]
    plan_pool(stored, want, driver=DRIVER, node="node-a", node_uid="u")  # warm-up
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        assert plan_pool(stored, want, driver=DRIVER, node="node-a", node_uid="u").in_sync
        samples.append(time.perf_counter() - start)
    return samples


def cold_client_load(kubeconfig: Path, runs: int) -> list[float]:
    code = (
        "import time; t = time.perf_counter(); from dradriver.kube import load_client; "
        f"c = load_client({str(kubeconfig)!r}); print(time.perf_counter() - t)"
    )
    return [float(subprocess.check_output([sys.executable, "-c", code], text=True)) for _ in range(runs)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", type=Path)
    parser.add_argument("--k8s-bin", type=Path, help="start a real kube-apiserver from these binaries")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--steady-seconds", type=float, default=600)
    args = parser.parse_args()
    logs.configure("console", 0, stream=sys.stderr)
    with contextlib.ExitStack() as stack:
        if args.k8s_bin is not None:
            args.kubeconfig = stack.enter_context(real_api_server(args.k8s_bin))
        run(args)


def run(args: argparse.Namespace) -> None:
    with TemporaryDirectory() as tmp:
        fake = None
        kubeconfig = args.kubeconfig
        if kubeconfig is None:
            fake = FakeApiServer().start()
            kubeconfig = fake.write_kubeconfig(Path(tmp) / "kubeconfig")
        bench = Bench(kubeconfig, Path(tmp))
        print(f"server: {'loopback fake API server (tests/publish/kubefake.py)' if fake else kubeconfig}")
        try:
            print(summary("import + load_client, cold process", cold_client_load(kubeconfig, 10)))
            print(summary("sync decision, 300 devices, nothing to do", plan_cost(300, args.runs)))
            for devices in (8, 300):
                print(summary(f"first publish, {devices} devices", first_publish(bench, devices, args.runs)))
            print(summary("deleted externally -> back, 300 devices", recovery(bench, 300, args.runs)))
            print(f"steady state, 300 devices: {steady(bench, fake, args.steady_seconds)}")
        finally:
            bench.cleanup()
            if fake:
                fake.stop()


if __name__ == "__main__":
    main()
