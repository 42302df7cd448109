"""Issue 16: dradriver and the Go reference plugin side by side, on one real kube-apiserver.

Run (repository root, after `make .venv/.installed`; dradriver as the DaemonSet runs it, i.e.
a production install: `python3 -m venv /tmp/prod && /tmp/prod/bin/pip install .`):

    .venv/bin/python -m bench.bench_vs_go --k8s-bin DIR --go-plugin FILE --dradriver /tmp/prod/bin/dradriver

`--k8s-bin` is a directory with etcd and kube-apiserver (default $DRADRIVER_E2E_BIN; `make e2e`
unpacks ../shared/k8s there), `--go-plugin` the unpacked ../shared/anchors plugin
(dra-example-kubeletplugin v0.4.0 on the upstream Go kubeletplugin helper).

One etcd + kube-apiserver (tests/e2e/cluster.py `ControlPlane`: TLS, client-certificate
authentication, Node+RBAC authorization) serves both plugins. Each plugin authenticates as its own
user bound to the plugin's ClusterRole from deploy/base/rbac.yaml, has private directories (the
checkpoint on disk under its plugins directory, like /var/lib/kubelet/plugins; CDI specs and
dradriver's device metadata on a tmpfs, as on a node, unless --cdi-on-disk)
and is driven over its unix sockets by the same Python client (dradriver.kubeletclient, the
kubelet's side of the protocol). Rounds alternate the order of the two plugins; each round
starts every plugin twice:

- start-up (8 devices, the anchors' flags): spawn -> GetInfo answered, spawn -> first
  ResourceSlice seen by a watch opened before the spawn, GetInfo round trips, then idle RSS,
  threads and CPU over a quiet window;
- prepare (128 devices, one allocated ResourceClaim per device and plugin): paced single-claim
  NodePrepareResources / NodeUnprepareResources, 100 prepares by 100 back-to-back calls, 64
  claims in one call.

Beside them (unless --no-floor) runs `bench.grpc_floor`, the Python gRPC floor: a plugin on
grpcio that GETs each claim and answers with no work of its own, driven the same way (GetInfo and
the prepare phase; it publishes nothing). dradriver's cost beyond it is dradriver's; its cost
beyond the Go reference is the Python runtime's. `--work-floor` adds the Python work floor
(`bench.grpc_floor --files`): the floor also writing the files each prepare must leave (CDI spec,
device metadata, checkpoint), with nothing else, as the least a Python plugin can do per claim.

The Go plugin runs with its client rate limit raised (--kube-api-qps/burst 1000) in every
phase; `--go-default-limit` adds the back-to-back figures with its default limit (5 QPS,
burst 10), once. Figures are medians over rounds, with the range over rounds.

`--busy N` runs N processes that spin on the CPU for the whole run (a node whose cores are
loaded by something else): every plugin then competes with them alike.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml

from bench.common import cpu_seconds, percentile, proc_status, rss_mb
from dradriver import kubeletclient
from dradriver.kube import ConflictError, KubeClient, load_client
from dradriver.kubeletapi.pluginregistration import api_pb2 as reg_pb
from dradriver.kubeletapi.pluginregistration import api_pb2_grpc as reg_grpc
from dradriver.plugin.driver import ClaimRef
from dradriver.publish import delete_node_slices
from tests.e2e.cluster import ControlPlane, node_ip
from tests.helpers import write_gpu_profile

NODE = "bench-node"
NAMESPACE = "bench"
START_DEVICES = 8
PREPARE_DEVICES = 128
RBAC = Path(__file__).resolve().parent.parent / "deploy" / "base" / "rbac.yaml"


@dataclass(frozen=True)
class Plugin:
    label: str
    driver: str
    #: Claim names are `<prefix>-<i>`.
    prefix: str
    argv: Callable[[Path, Path, int], list[str]]
    #: Whether it publishes ResourceSlices (the start-up and idle figures are a plugin's).
    publishes: bool = True

    def sockets(self, root: Path) -> tuple[Path, Path]:
        """Its registration and DRA sockets under `root`'s kubelet directories (every plugin's layout)."""
        return root / "reg" / f"{self.driver}-reg.sock", root / "plugins" / self.driver / "dra.sock"


def go_argv(binary: Path, node: str, driver: str, root: Path, kubeconfig: Path, devices: int) -> list[str]:
    """The Go reference on `root`'s kubelet directories (reg, plugins) and CDI directory."""
    return [
        str(binary), "--node-name", node, "--driver-name", driver, "--device-profile", "gpu",
        "--num-devices", str(devices), "--cdi-root", str(root / "cdi"),
        "--kubelet-registrar-directory-path", str(root / "reg"),
        "--kubelet-plugins-directory-path", str(root / "plugins"), "--kubeconfig", str(kubeconfig),
    ]  # fmt: skip


def dradriver_argv(
    executable: Path, node: str, driver: str, root: Path, kubeconfig: Path, devices: int
) -> list[str]:
    """`serve` on fake GPUs (a profile of `devices` GPUs) with `root`'s directories, as go_argv."""
    profile = write_gpu_profile(root / "profile.yaml", devices)
    return [
        str(executable), "serve", "--fake-gpus", str(profile), "--node-name", node,
        "--driver-name", driver,
        "--kubelet-registry-dir", str(root / "reg"), "--kubelet-plugins-dir", str(root / "plugins"),
        "--cdi-dir", str(root / "cdi"), "--device-metadata-dir", str(root / "run" / "device-metadata"),
        "--kubeconfig", str(kubeconfig),
    ]  # fmt: skip


def go_plugin(binary: Path, raised_limit: bool = True) -> Plugin:
    driver = "gpu.example.com"

    def argv(root: Path, kubeconfig: Path, devices: int) -> list[str]:
        limit = ["--kube-api-qps", "1000", "--kube-api-burst", "1000"] if raised_limit else []
        return [*go_argv(binary, NODE, driver, root, kubeconfig, devices), *limit]

    label = "Go reference" if raised_limit else "Go reference (default client limit)"
    return Plugin(label, driver, "go", argv)


def dradriver_plugin(executable: Path, baseline: bool = False, metadata: bool = True) -> Plugin:
    """dradriver as installed at `executable`; a `baseline` (an earlier build, or the same one
    with its device metadata off, to show what changed in the same run) runs under a driver name
    of its own so both can publish."""
    driver = "gpu-baseline.dradriver.dev" if baseline else "gpu.dradriver.dev"
    switch = [] if metadata else ["--device-metadata", "false"]

    def argv(root: Path, kubeconfig: Path, devices: int) -> list[str]:
        return [*dradriver_argv(executable, NODE, driver, root, kubeconfig, devices), *switch]

    if baseline:
        return Plugin("dradriver baseline" if metadata else "device metadata off", driver, "base", argv)
    return Plugin("dradriver", driver, "dr", argv)


def floor_plugin(work: bool = False) -> Plugin:
    """bench.grpc_floor: what a Python plugin on grpcio costs before doing any work of its own;
    with `work`, the Python work floor: that plugin writing the files a prepare must leave."""
    driver = "work-floor.dradriver.dev" if work else "floor.dradriver.dev"

    def argv(root: Path, kubeconfig: Path, _devices: int) -> list[str]:
        registration, dra = floor.sockets(root)
        return [
            sys.executable, "-m", "bench.grpc_floor", "--registration", str(registration),
            "--dra", str(dra), "--kubeconfig", str(kubeconfig), "--driver", driver, "--pool", NODE,
            *(["--files", str(root)] if work else []),
        ]  # fmt: skip

    label, prefix = ("Python work floor", "work") if work else ("Python gRPC floor", "floor")
    floor = Plugin(label, driver, prefix, argv, publishes=False)
    return floor


# --- the API server side -------------------------------------------------------------------------


def node_and_namespace(admin_kubeconfig: Path) -> KubeClient:
    """An admin client of the API server, which now has NODE and the NAMESPACE of the claims."""
    admin = load_client(str(admin_kubeconfig))
    assert admin is not None
    admin.request(
        "POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}
    )
    admin.request(
        "POST",
        "/api/v1/namespaces",
        body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
    )
    return admin


def api_server_for(
    plane: ControlPlane, plugins: list[Plugin]
) -> tuple[KubeClient, dict[str, Path], dict[str, list[ClaimRef]]]:
    """NODE and NAMESPACE, and per plugin (by prefix) its own user's kubeconfig and its claims;
    with the admin's client."""
    admin = node_and_namespace(plane.admin_kubeconfig)
    kubeconfigs, claims = {}, {}
    for plugin in plugins:
        user = f"bench-{plugin.prefix}-plugin"
        grant_plugin_role(admin, user)
        kubeconfigs[plugin.prefix] = plane.kubeconfig_for(user, user)
        claims[plugin.prefix] = create_claims(admin, plugin, PREPARE_DEVICES)
    return admin, kubeconfigs, claims


def grant_plugin_role(admin: KubeClient, user: str, rbac: Path = RBAC) -> None:
    """The plugin's ClusterRole from `rbac` (deploy/base/rbac.yaml), bound to `user`."""
    role = next(d for d in yaml.safe_load_all(rbac.read_text()) if d["kind"] == "ClusterRole")
    with contextlib.suppress(ConflictError):  # created for the first plugin already
        admin.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterroles", body=role)
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": f"bench-{user}"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": role["metadata"]["name"],
        },
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }
    admin.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", body=binding)


def create_claims(admin: KubeClient, plugin: Plugin, count: int) -> list[ClaimRef]:
    """`count` ResourceClaims allocated to gpu-0.. of `plugin` on NODE, each reserved for a pod."""
    return [
        allocated_claim(
            admin,
            f"{plugin.prefix}-{i}",
            {"deviceClassName": plugin.driver},
            {"request": "gpu", "driver": plugin.driver, "pool": NODE, "device": f"gpu-{i}"},
        )
        for i in range(count)
    ]


def allocated_claim(
    admin: KubeClient, name: str, exactly: dict[str, Any], result: dict[str, Any], *, share: bool = False
) -> ClaimRef:
    """A ResourceClaim in NAMESPACE with one request, allocated on NODE as the scheduler would
    (`result`; with `share`, its shareID is the claim's UID, a lowercase UUID unique per share);
    reserved for a pod."""
    base = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"
    claim = admin.request(
        "POST",
        base,
        body={
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
        },
    )
    claim["status"] = {
        "allocation": {
            "devices": {"results": [result | ({"shareID": claim["metadata"]["uid"]} if share else {})]},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
                ]
            },
        },
        "reservedFor": [{"resource": "pods", "name": f"pod-{name}", "uid": str(uuid.uuid4())}],
    }
    claim = admin.request("PUT", f"{base}/{name}/status", body=claim)
    return ClaimRef(NAMESPACE, name, claim["metadata"]["uid"])


class SliceWatch:
    """Notes when the first ResourceSlice of a driver on NODE appears (a watch, no polling)."""

    def __init__(self, client: KubeClient, driver: str) -> None:
        selector = f"spec.driver={driver},spec.nodeName={NODE}"
        listed = client.list_resource_slices(selector)
        assert not listed["items"], f"{driver} slices left over"
        self._stream = client.watch_resource_slices(selector, listed["metadata"]["resourceVersion"])
        self.seen: float | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for event in self._stream:
            if event.type == "ADDED":
                self.seen = time.perf_counter()
                break
        self._stream.close()

    def wait(self, timeout: float) -> float:
        self._thread.join(timeout)
        assert self.seen is not None, "no ResourceSlice appeared"
        return self.seen

    def close(self) -> None:
        self._stream.close()


# --- one plugin process ----------------------------------------------------------------------------


@dataclass
class Running:
    plugin: Plugin
    process: subprocess.Popen[bytes]
    started: float
    registration: Path
    dra: Path
    root: Path
    log: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


@contextlib.contextmanager
def launch(plugin: Plugin, kubeconfig: Path, devices: int, opts: argparse.Namespace) -> Iterator[Running]:
    root = Path(tempfile.mkdtemp(prefix=f"vs-{plugin.prefix}-", dir="/tmp"))
    tmpfs_dirs = []
    if not opts.cdi_on_disk and Path("/dev/shm").is_dir():
        # As on a node: /var/run/cdi and /run (the DaemonSet's device metadata dir) are tmpfs.
        for name in ("cdi", "run"):
            tmpfs_dirs.append(Path(tempfile.mkdtemp(prefix=f"vs-{plugin.prefix}-{name}-", dir="/dev/shm")))
            (root / name).symlink_to(tmpfs_dirs[-1])
    for directory in ("reg", "plugins"):  # the kubelet's directories exist before any plugin starts
        (root / directory).mkdir()
    argv = plugin.argv(root, kubeconfig, devices)
    registration, dra = plugin.sockets(root)
    log = root / "plugin.log"
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    with log.open("wb") as out:
        started = time.perf_counter()
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    running = Running(plugin, process, started, registration, dra, root, log)
    try:
        yield running
    finally:
        running.stop()
        shutil.rmtree(root, ignore_errors=True)
        for tmpfs_dir in tmpfs_dirs:
            shutil.rmtree(tmpfs_dir, ignore_errors=True)


def get_info_answered(running: Running, timeout: float = 30) -> float:
    """Seconds from spawn to the first GetInfo answer (polled every millisecond)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if running.process.poll() is not None:
            raise RuntimeError(f"{running.plugin.label} exited: {running.log.read_text()[-2000:]}")
        if running.registration.exists():
            try:
                with grpc.insecure_channel(f"unix://{running.registration}") as channel:
                    reg_grpc.RegistrationStub(channel).GetInfo(reg_pb.InfoRequest(), timeout=1)
                return time.perf_counter() - running.started
            except grpc.RpcError:
                pass
        time.sleep(0.001)
    raise RuntimeError(f"{running.plugin.label}: no GetInfo answer within {timeout}s")


def get_info_round_trips(registration: Path, calls: int) -> list[float]:
    with grpc.insecure_channel(f"unix://{registration}") as channel:
        stub = reg_grpc.RegistrationStub(channel)
        for _ in range(100):
            stub.GetInfo(reg_pb.InfoRequest())
        samples = []
        for _ in range(calls):
            t = time.perf_counter()
            stub.GetInfo(reg_pb.InfoRequest())
            samples.append(time.perf_counter() - t)
    return samples


def prepared(response: Any, refs: list[ClaimRef]) -> None:
    errors = {r.uid: response.claims[r.uid].error for r in refs if response.claims[r.uid].error}
    assert not errors, errors
    assert all(response.claims[r.uid].devices for r in refs), response


# --- figures -------------------------------------------------------------------------------------


@dataclass
class Figures:
    """One plugin's figures in one round, in seconds (bytes, counts where named)."""

    values: dict[str, float] = field(default_factory=dict)

    def set(self, name: str, value: float) -> None:
        self.values[name] = value


def alternate(items: list[Plugin], n: int) -> list[Plugin]:
    """`items`, reversed every other time: each plugin goes first as often as the other."""
    return items if n % 2 == 0 else items[::-1]


def start_phase(
    plugins: list[Plugin],
    kubeconfigs: dict[str, Path],
    admin: KubeClient,
    opts: argparse.Namespace,
    out: dict[str, Figures],
) -> None:
    """Each plugin is started alone (spawn -> GetInfo, -> first slice); then all keep running for
    interleaved GetInfo round trips and one idle window measured for all at once."""
    with contextlib.ExitStack() as stack:
        running: dict[str, Running] = {}
        for plugin in plugins:
            watch = None
            if plugin.publishes:
                delete_node_slices(admin, driver_name=plugin.driver, node_name=NODE)
                stack.callback(delete_node_slices, admin, driver_name=plugin.driver, node_name=NODE)
                watch = SliceWatch(admin, plugin.driver)
                stack.callback(watch.close)
            launched = stack.enter_context(launch(plugin, kubeconfigs[plugin.prefix], START_DEVICES, opts))
            answered = get_info_answered(launched)
            kubeletclient.register(launched.registration)
            if watch is not None:
                out[plugin.prefix].set("start_getinfo", answered)
                out[plugin.prefix].set("first_slice", watch.wait(60) - launched.started)
            running[plugin.prefix] = launched
        samples: dict[str, list[float]] = {p.prefix: [] for p in plugins}
        stubs = {}
        for prefix, launched in running.items():
            channel = stack.enter_context(grpc.insecure_channel(f"unix://{launched.registration}"))
            stubs[prefix] = reg_grpc.RegistrationStub(channel)
            for _ in range(100):  # warm-up
                stubs[prefix].GetInfo(reg_pb.InfoRequest())
        for block in range(max(1, opts.getinfo_calls // 100)):
            for plugin in alternate(plugins, block):
                stub, into = stubs[plugin.prefix], samples[plugin.prefix]
                for _ in range(100):
                    t = time.perf_counter()
                    stub.GetInfo(reg_pb.InfoRequest())
                    into.append(time.perf_counter() - t)
        for prefix, values in samples.items():
            out[prefix].set("getinfo_p50", statistics.median(values))
            out[prefix].set("getinfo_p99", percentile(values, 99))
        time.sleep(opts.settle)
        publishing = {prefix: r for prefix, r in running.items() if r.plugin.publishes}
        before = {prefix: cpu_seconds(r.process.pid) for prefix, r in publishing.items()}
        time.sleep(opts.idle_seconds)
        for prefix, launched in publishing.items():
            pid = launched.process.pid
            out[prefix].set("idle_cpu", (cpu_seconds(pid) - before[prefix]) / opts.idle_seconds)
            out[prefix].set("idle_rss_mb", rss_mb(pid))
            out[prefix].set("threads", int(proc_status(pid)["Threads"]))


def prepare_phase(
    plugins: list[Plugin],
    kubeconfigs: dict[str, Path],
    claims: dict[str, list[ClaimRef]],
    opts: argparse.Namespace,
    out: dict[str, Figures],
    *,
    paced: bool = True,
) -> None:
    """All plugins run at once and take turns call by call (paced) or batch by batch, so that
    they share whatever else the machine is doing."""
    with contextlib.ExitStack() as stack:
        clients: dict[str, kubeletclient.DRAClient] = {}
        for plugin in plugins:
            launched = stack.enter_context(launch(plugin, kubeconfigs[plugin.prefix], PREPARE_DEVICES, opts))
            get_info_answered(launched)
            kubeletclient.register(launched.registration)
            client = stack.enter_context(kubeletclient.DRAClient(launched.dra))
            client.wait_ready(30)
            refs = claims[plugin.prefix]
            for ref in refs[:20]:  # warm-up: driver initialised, connections open
                prepared(client.prepare([ref]), [ref])
                client.unprepare([ref])
            clients[plugin.prefix] = client
        if paced:
            prepares: dict[str, list[float]] = {p.prefix: [] for p in plugins}
            unprepares: dict[str, list[float]] = {p.prefix: [] for p in plugins}
            for n in range(opts.paced):
                for plugin in alternate(plugins, n):
                    client, ref = clients[plugin.prefix], claims[plugin.prefix][n % PREPARE_DEVICES]
                    time.sleep(opts.pace_ms / 1000)
                    t = time.perf_counter()
                    response = client.prepare([ref])
                    prepares[plugin.prefix].append(time.perf_counter() - t)
                    prepared(response, [ref])
                    t = time.perf_counter()
                    client.unprepare([ref])
                    unprepares[plugin.prefix].append(time.perf_counter() - t)
            for prefix, samples in prepares.items():
                out[prefix].set("prepare_p50", statistics.median(samples))
                out[prefix].set("prepare_p99", percentile(samples, 99))
                out[prefix].set("unprepare_p50", statistics.median(unprepares[prefix]))
                out[prefix].set("unprepare_p99", percentile(unprepares[prefix], 99))
        batches: dict[str, list[float]] = {p.prefix: [] for p in plugins}
        singles: dict[str, list[float]] = {p.prefix: [] for p in plugins}
        for n in range(opts.repeats):
            for plugin in alternate(plugins, n):
                client, refs = clients[plugin.prefix], claims[plugin.prefix]
                t = time.perf_counter()
                for ref in refs[:100]:
                    prepared(client.prepare([ref]), [ref])
                batches[plugin.prefix].append(time.perf_counter() - t)
                client.unprepare(refs[:100])
        for n in range(opts.repeats):
            for plugin in alternate(plugins, n):
                client, refs = clients[plugin.prefix], claims[plugin.prefix][:64]
                t = time.perf_counter()
                response = client.prepare(refs)
                singles[plugin.prefix].append(time.perf_counter() - t)
                prepared(response, refs)
                client.unprepare(refs)
        for prefix, samples in batches.items():
            out[prefix].set("back_to_back_100", statistics.median(samples))
            out[prefix].set("one_call_64", statistics.median(singles[prefix]))


#: (key, label, unit, how to compare: the target's factor of Go's figure, or None)
ROWS: list[tuple[str, str, str, float | None]] = [
    ("prepare_p50", "NodePrepareResources p50", "ms", 0.8),
    ("prepare_p99", "NodePrepareResources p99", "ms", 1.0),
    ("unprepare_p50", "NodeUnprepareResources p50", "ms", 1.0),
    ("unprepare_p99", "NodeUnprepareResources p99", "ms", None),
    ("back_to_back_100", "100 prepares, back to back", "ms", 1.0),
    ("one_call_64", "64 claims in one call", "ms", 1.0),
    ("getinfo_p50", "GetInfo round trip p50", "ms", 1.5),
    ("getinfo_p99", "GetInfo round trip p99", "ms", None),
    ("start_getinfo", "start -> GetInfo answers", "ms", None),
    ("first_slice", "start -> first ResourceSlice", "ms", None),
    ("idle_rss_mb", "idle RSS", "MB", None),
    ("threads", "idle threads", "", None),
    ("idle_cpu", "idle CPU, % of a core", "%", None),
]
SCALE = {"ms": 1e3, "MB": 1.0, "": 1.0, "%": 100.0}


def fmt(value: float, unit: str) -> str:
    scaled = value * SCALE[unit]
    if unit == "ms" and scaled >= 100:
        return f"{scaled:,.0f}"
    return f"{scaled:.2f}" if unit in ("ms", "%") else f"{scaled:.1f}" if unit == "MB" else f"{scaled:.0f}"


def cell(rounds: list[Figures], key: str, unit: str) -> tuple[str, float | None]:
    values = [r.values[key] for r in rounds if key in r.values]
    if not values:
        return "-", None
    median = statistics.median(values)
    spread = f" ({fmt(min(values), unit)} to {fmt(max(values), unit)})" if len(values) > 1 else ""
    return f"{fmt(median, unit)}{spread}", median


def report(
    results: dict[str, list[Figures]],
    go_default: Figures | None,
    loads: list[str],
    baseline_label: str = "dradriver baseline",
) -> str:
    go, ours = results.get("go", []), results.get("dr", [])
    baseline, floor, work = results.get("base"), results.get("floor"), results.get("work")
    extra = (
        (f" {baseline_label} |" if baseline is not None else "")
        + (" Python gRPC floor | floor / Go | dradriver / floor |" if floor is not None else "")
        + (" Python work floor | dradriver - work floor |" if work is not None else "")
    )
    columns = 5 + (baseline is not None) + 3 * (floor is not None) + 2 * (work is not None)
    lines = [
        f"| figure (median of rounds; range) | Go reference | dradriver | dradriver / Go | target |{extra}",
        "|" + " --- |" * columns,
    ]
    for key, label, unit, factor in ROWS:
        go_text, go_value = cell(go, key, unit)
        our_text, our_value = cell(ours, key, unit)
        target = f"<= {factor:g} x Go" if factor is not None else ""
        unit_label = f" ({unit})" if unit else ""
        row = f"| {label}{unit_label} | {go_text} | {our_text} | {ratio(our_value, go_value)} | {target} |"
        if baseline is not None:
            row += f" {cell(baseline, key, unit)[0]} |"
        if floor is not None:
            floor_text, floor_value = cell(floor, key, unit)
            row += f" {floor_text} | {ratio(floor_value, go_value)} | {ratio(our_value, floor_value)} |"
        if work is not None:
            work_text, work_value = cell(work, key, unit)
            above = (
                fmt(our_value - work_value, unit)
                if unit == "ms" and our_value is not None and work_value is not None
                else "-"
            )
            row += f" {work_text} | {above} |"
        lines.append(row)
    if go_default is not None:
        for key, label in (
            ("back_to_back_100", "100 prepares, back to back"),
            ("one_call_64", "64 claims in one call"),
        ):
            lines.append(
                f"| {label}, Go's default client limit (ms) | {fmt(go_default.values[key], 'ms')} |"
                + " |" * (columns - 2)
            )
    lines.append("")
    lines.append("load average (1 min) at each round's start and end: " + ", ".join(loads))
    return "\n".join(lines)


def ratio(value: float | None, go_value: float | None) -> str:
    return f"{value / go_value:.2f}" if go_value and value is not None else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k8s-bin", type=Path, default=os.environ.get("DRADRIVER_E2E_BIN"))
    parser.add_argument("--go-plugin", type=Path, required=True)
    parser.add_argument("--dradriver", type=Path, default=Path(shutil.which("dradriver") or "dradriver"))
    parser.add_argument(
        "--baseline", type=Path, help="an earlier dradriver build to run beside, for comparison"
    )
    parser.add_argument(
        "--metadata-off",
        action="store_true",
        help="run --dradriver a second time with --device-metadata false, as the baseline column",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--paced", type=int, default=300, help="paced prepare/unprepare pairs per round")
    parser.add_argument("--pace-ms", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each batch figure per round")
    parser.add_argument("--getinfo-calls", type=int, default=2000)
    parser.add_argument("--settle", type=float, default=5.0)
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    parser.add_argument(
        "--cdi-on-disk", action="store_true", help="CDI specs and /run (device metadata) on disk, not a tmpfs"
    )
    parser.add_argument("--go-default-limit", action="store_true")
    parser.add_argument(
        "--no-floor", action="store_true", help="leave out the Python gRPC floor (bench.grpc_floor)"
    )
    parser.add_argument(
        "--work-floor",
        action="store_true",
        help="add the Python work floor (bench.grpc_floor --files): the floor writing each claim's files",
    )
    parser.add_argument("--only", choices=["go", "dradriver"], help="drive one plugin only (profiling)")
    parser.add_argument("--busy", type=int, default=0, help="processes spinning on the CPU during the run")
    opts = parser.parse_args()
    if opts.k8s_bin is None:
        parser.error("--k8s-bin (or DRADRIVER_E2E_BIN) is required")

    work = Path(tempfile.mkdtemp(prefix="bench-vs-go-", dir="/var/tmp"))
    plane = ControlPlane(opts.k8s_bin, work, advertise_address=node_ip())
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(opts.busy)]
    try:
        plane.start()
        plugins = [go_plugin(opts.go_plugin), dradriver_plugin(opts.dradriver)]
        if opts.baseline is not None and opts.metadata_off:
            parser.error("--baseline and --metadata-off both fill the baseline column: give one")
        if opts.baseline is not None:
            plugins.append(dradriver_plugin(opts.baseline, baseline=True))
        if opts.metadata_off:
            plugins.append(dradriver_plugin(opts.dradriver, baseline=True, metadata=False))
        if not opts.no_floor:
            plugins.append(floor_plugin())
        if opts.work_floor:
            plugins.append(floor_plugin(work=True))
        if opts.only:
            plugins = [p for p in plugins if (p.prefix == "go") == (opts.only == "go") and p.publishes]
        admin, kubeconfigs, claims = api_server_for(plane, plugins)
        results: dict[str, list[Figures]] = {p.prefix: [] for p in plugins}
        loads = []
        for n in range(opts.rounds):
            load_start = os.getloadavg()[0]
            order = alternate(plugins, n)
            figures = {p.prefix: Figures() for p in plugins}
            start_phase(order, kubeconfigs, admin, opts, figures)
            prepare_phase(order, kubeconfigs, claims, opts, figures)
            for plugin in plugins:
                results[plugin.prefix].append(figures[plugin.prefix])
                values = ", ".join(f"{k}={v:.4g}" for k, v in figures[plugin.prefix].values.items())
                print(f"round {n + 1} {plugin.label}: {values}", flush=True)
            loads.append(f"{load_start:.2f}→{os.getloadavg()[0]:.2f}")
        go_default = None
        if opts.go_default_limit and not opts.only:
            limited = go_plugin(opts.go_plugin, raised_limit=False)
            go_default = {"go": Figures()}
            prepare_phase([limited], kubeconfigs, claims, opts, go_default, paced=False)
        print()
        labels = {p.prefix: p.label for p in plugins}
        print(report(results, go_default["go"] if go_default else None, loads, labels.get("base", "")))
        if opts.busy:
            print(f"{opts.busy} processes spinning on the CPU during the run")
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
        plane.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
