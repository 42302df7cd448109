"""Issue 25: what N nodes' plugins cost one real kube-apiserver, dradriver beside the Go reference.

Run (repository root, after `make .venv/.installed`; each dradriver build a production install,
`python3 -m venv /tmp/prod && /tmp/prod/bin/pip install .`):

    .venv/bin/python -m bench.bench_fleet --k8s-bin DIR --go-plugin FILE \\
        --ours dradriver=/tmp/prod/bin/dradriver [--ours before=/tmp/old/bin/dradriver=OLD_RBAC] \\
        [--sizes 1,10,50,100] [--idle 40] [--claims 40 --claim-rate 4] [--stagger 1.0] \\
        [--devices 8] [--go-devices 14 ...] [--memprofilerate 65536] [--save-profiles DIR] \\
        [--node-prefix fleet-node] [--beta-resource-apis]

With the defaults one build takes about 8 minutes on 2 cores (100 dradriver instances hold about
7.2 GB, 100 Go ones 4.1 GB).

`--k8s-bin` holds etcd and kube-apiserver (`../shared/k8s/unpack.sh DIR`), `--go-plugin` the
unpacked ../shared/anchors plugin. `--ours LABEL=EXECUTABLE[=RBAC]` adds a dradriver build; its
ClusterRole comes from RBAC (default: this tree's deploy/base/rbac.yaml), so that an older build
runs with the permissions it shipped with. `--no-go` leaves the Go reference out.

Each plugin gets a fresh etcd + kube-apiserver (tests/e2e/cluster.py `ControlPlane`, serving
resource.k8s.io/v1 alone as a 1.36 API server does by default; `--beta-resource-apis` adds
v1beta1 and v1beta2 as the tests' API server does, each with a watch cache of its own) with one
Node object per fake node and, per node, a user bound to the plugin's ClusterRole (as
bench_vs_go). Nothing else talks to that API server but the bench: no kubelet, no controllers.
Then, for each N in --sizes, ascending:

- start: every instance of the previous N is stopped and every ResourceSlice deleted, then N
  instances are spawned at once (or --stagger seconds apart), each with its own node name,
  kubeconfig, directories and a --devices GPU fake profile (dradriver) or `--num-devices` (Go), like a
  DaemonSet rolled out on N fresh nodes. "complete" is when every node's pool has all its slices
  (as many slices of the pool's newest generation as their `resourceSliceCount`), seen by a watch
  the bench holds on all ResourceSlices; the start window ends --settle seconds later.
- idle: a window of --idle seconds with nothing but the instances running;
- churn: --claims ResourceClaims, one every 1/--claim-rate seconds, each allocated to the next
  fake node (status.allocation written through the status subresource, naming the node's pool, a
  device and the driver) and deleted --claim-life claims later: three claim changes each (created,
  allocated, deleted).

Everything is read from the API server itself: its /metrics (apiserver_request_total by verb and
resource, apiserver_longrunning_requests for the watches open, apiserver_watch_events_total and
_sizes for resourceclaims, go_goroutines), /proc of its process (CPU, RSS) and
/proc/net/tcp (its established connections). Requests of the API server's own
loopback clients (system_client="kube-apiserver") and the bench's /metrics scrapes are left out;
before any instance runs, an equally long window with none measures what remains of the control
plane's own traffic, and requests are reported net of that rate (about 0 with nothing else
running). A churn with no instance gives the claim watch events the control plane delivers by
itself (N = 0). Growth per added node is the least-squares slope over the sizes. Instances'
RSS is read from /proc at the end of each idle window.

Memory: at the end of each idle window (and of the control plane's own, N = 0) the bench asks
the API server, as its admin, for /debug/pprof/heap?gc=1 twice (the second with debug=1): it
collects its garbage first, so live heap (HeapAlloc), heap in use and the RSS read right after
are the same state at every size, not wherever the last collection happened to be. The
profile's records are summed by allocation site (bench/go_heap.py) and by what holds them
(HOLDERS: the watch cache, the API server's own informers, connections, ...) and reported per
added node, each variant beside the others.
The API server runs with GODEBUG=memprofilerate=--memprofilerate (one sample per that many bytes
allocated; Go's default of 512 KiB resolves nothing of a few KB per node); --save-profiles keeps
the profiles at N = 0 and the largest N, for `go tool pprof`.

The API server's `apiserver_registered_watchers` is gone in 1.36; the open watches come from
`apiserver_longrunning_requests{verb="WATCH"}`.
"""

from __future__ import annotations

import argparse
import http.client
import os
import re
import shutil
import signal
import ssl
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.bench_vs_go import RBAC, dradriver_argv, go_argv, grant_plugin_role
from bench.common import Samples, cpu_seconds, least_squares_slope, metric_sum, parse_metrics, rss_mb
from bench.go_heap import HeapProfile, Record, bytes_by, bytes_by_site, parse_heap_profile
from dradriver import logs
from dradriver.kube import KubeClient, load_client
from dradriver.kube.client import WatchEvent
from dradriver.kube.reflector import Reflector
from dradriver.kube.retry import Backoff
from tests.e2e.cluster import ControlPlane, node_ip

NAMESPACE = "fleet"
CLAIMS = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
WRITES = ("POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION", "APPLY")
#: The bench's own scrapes, left out of every count.
OWN = ("GET /metrics",)

Json = dict[str, Any]


def node_name(prefix: str, i: int) -> str:
    return f"{prefix}-{i:03d}"


@dataclass(frozen=True)
class Variant:
    label: str
    driver: str
    rbac: Path
    #: argv(node, root, kubeconfig)
    argv: Callable[[str, Path, Path], list[str]]
    devices: int


def ours(label: str, executable: Path, rbac: Path, devices: int) -> Variant:
    driver = "gpu.dradriver.dev"

    def argv(node: str, root: Path, kubeconfig: Path) -> list[str]:
        return dradriver_argv(executable, node, driver, root, kubeconfig, devices)

    return Variant(label, driver, rbac, argv, devices)


def go(binary: Path, devices: int, default_devices: int) -> Variant:
    driver = "gpu.example.com"

    def argv(node: str, root: Path, kubeconfig: Path) -> list[str]:
        return go_argv(binary, node, driver, root, kubeconfig, devices)

    label = "Go reference" if devices == default_devices else f"Go reference, {devices} devices"
    return Variant(label, driver, RBAC, argv, devices)


# --- the API server ------------------------------------------------------------------------------


class ApiServer:
    """The API server's /metrics (as its admin) and its process's /proc."""

    def __init__(self, plane: ControlPlane) -> None:
        self._port = plane.apiserver_port
        self._context = ssl.create_default_context(cafile=str(plane.pki.ca.cert))
        self._context.load_cert_chain(
            str(plane.work_dir / "pki/admin.crt"), str(plane.work_dir / "pki/admin.key")
        )
        process = next(c.process for c in plane.components if c.name == "kube-apiserver")
        assert process is not None
        self.pid = process.pid

    def get(self, path: str) -> bytes:
        connection = http.client.HTTPSConnection("127.0.0.1", self._port, context=self._context, timeout=120)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            body = response.read()
            if response.status != 200:
                raise RuntimeError(f"GET {path}: {response.status} {body[:200]!r}")
            return body
        finally:
            connection.close()

    def scrape(self) -> Samples:
        return parse_metrics(self.get("/metrics").decode())

    def heap_profile(self) -> tuple[HeapProfile, str]:
        """Its heap profile (parsed, and the text) right after garbage collections it runs first
        (net/http/pprof's gc=1): live objects only, whenever the last collection happened to be.
        Two: what sync.Pools hold survives one collection (in their victim caches), not two."""
        self.get("/debug/pprof/heap?gc=1")
        text = self.get("/debug/pprof/heap?gc=1&debug=1").decode()
        return parse_heap_profile(text), text

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    def rss(self) -> float:
        return rss_mb(self.pid)

    def connections(self) -> int:
        """Established TCP connections to its port (each HTTP/1.1 watch holds one; HTTP/2
        multiplexes a client's requests on one)."""
        port = f"{self._port:04X}"
        count = 0
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                count += fields[1].rsplit(":", 1)[1] == port and fields[3] == "01"
        return count


@dataclass(frozen=True)
class Memory:
    """The API server's memory right after a garbage collection."""

    rss_mb: float
    #: Bytes of live objects (HeapAlloc after the collection).
    live_mb: float
    #: Heap spans in use (HeapInuse): the live objects and the free room in their spans.
    heap_inuse_mb: float
    #: Its goroutines' stacks (outside the heap): each connection and watch has goroutines.
    stack_mb: float
    #: Free heap pages the runtime keeps from the system (HeapIdle - HeapReleased): part of the RSS
    #: that no object holds; Go's scavenger returns them lazily, down to about 10 % above the
    #: next collection's goal, so their amount depends on what the heap went through before.
    free_retained_mb: float
    #: The runtime's own structures (spans, caches, GC metadata, profiling buckets, the rest).
    runtime_mb: float
    #: Estimated bytes in use by allocation site (bench/go_heap.py); their sum estimates live_mb.
    sites: dict[str, float]
    #: The same bytes by what holds them (HOLDERS).
    holders: dict[str, float]

    @property
    def profiled_mb(self) -> float:
        return sum(self.sites.values()) / 2**20


SLICE_DECODE = "resource/v1.(*ResourceSlice).Unmarshal"
#: What holds a heap record, told by functions on its stack: the first rule whose every part is
#: part of some frame's function. The API server's own informers hold one copy of each object.
HOLDERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("decoded ResourceSlices: the watch cache", (SLICE_DECODE, "etcd3.(*watchChan)")),
    ("decoded ResourceSlices: the API server's own informers", (SLICE_DECODE, "watch.(*StreamWatcher)")),
    ("decoded ResourceSlices: elsewhere", (SLICE_DECODE,)),
    ("encoded objects cached for watchers", ("runtime.(*spliceBuffer).Write",)),
    ("HTTP/2 connections and their requests", ("http2",)),
    ("TLS (connections, certificates)", ("crypto/",)),
    ("HTTP/1.1 connections and their requests", ("net/http.",)),
    ("the watch cache, the rest", ("storage/cacher",)),
)


def holder(record: Record) -> str:
    for name, parts in HOLDERS:
        if all(any(part in function for function in record.frames) for part in parts):
            return name
    return "the rest"


def read_memory(server: ApiServer, save: Path | None) -> Memory:
    """Collects the API server's garbage, then reads its heap profile and RSS (the profile's text
    is written to `save` when given, for `go tool pprof`)."""
    profile, text = server.heap_profile()
    if save is not None:
        save.write_text(text)
    stats = profile.memstats
    return Memory(
        server.rss(),
        stats["HeapAlloc"] / 2**20,
        stats["HeapInuse"] / 2**20,
        stats["Stack"] / 2**20,
        (stats["HeapIdle"] - stats["HeapReleased"]) / 2**20,
        sum(stats[k] for k in ("MSpanSys", "MCacheSys", "BuckHashSys", "GCSys", "OtherSys")) / 2**20,
        bytes_by_site(profile),
        bytes_by(profile, holder),
    )


def goroutines(samples: Samples) -> float:
    return metric_sum(samples, "go_goroutines").get((), 0.0)


def requests(samples: Samples) -> dict[str, float]:
    """Requests so far by "VERB resource[/subresource]" (a non-resource URL by its path), less the
    API server's own loopback clients (system_client="kube-apiserver": leases, endpoints, openapi)."""
    counts = metric_sum(
        samples, "apiserver_request_total", ("verb", "resource", "subresource"), system_client=""
    )
    out: dict[str, float] = {}
    for (verb, resource, subresource), value in counts.items():
        what = f"{resource}/{subresource}" if resource and subresource else resource or subresource
        key = f"{verb} {what}"
        if key not in OWN:
            out[key] = out.get(key, 0.0) + value
    return out


def watches(samples: Samples) -> dict[str, float]:
    """Watches open now, by resource."""
    counts = metric_sum(samples, "apiserver_longrunning_requests", ("resource",), verb="WATCH")
    return {resource: value for (resource,), value in counts.items()}


def claim_watch_events(samples: Samples) -> tuple[float, float]:
    """Watch events delivered for ResourceClaims so far, and their bytes."""
    events = metric_sum(samples, "apiserver_watch_events_total", resource="resourceclaims")
    sizes = metric_sum(samples, "apiserver_watch_events_sizes_sum", resource="resourceclaims")
    return events.get((), 0.0), sizes.get((), 0.0)


def difference(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after.keys() | before.keys()}


@dataclass
class Window:
    """Two scrapes and the API server's CPU between them."""

    seconds: float
    requests: dict[str, float]
    cpu: float


class Meter:
    def __init__(self, server: ApiServer) -> None:
        self.server = server
        self._samples: Samples = {}
        self._at = 0.0
        self._cpu = 0.0

    def mark(self) -> Samples:
        self._cpu, self._at = self.server.cpu(), time.monotonic()
        self._samples = self.server.scrape()
        return self._samples

    def since_mark(self) -> tuple[Window, Samples]:
        samples = self.server.scrape()
        window = Window(
            time.monotonic() - self._at,
            difference(requests(samples), requests(self._samples)),
            self.server.cpu() - self._cpu,
        )
        return window, samples


# --- the pools, as the API server has them -------------------------------------------------------


class Pools:
    """Every ResourceSlice, through one watch the bench holds for the whole run."""

    def __init__(self, client: KubeClient) -> None:
        self._slices: dict[str, Json] = {}
        self._changed = threading.Condition()
        self._stop = threading.Event()

        def list_objects() -> tuple[list[Json], str]:
            listed = client.list_resource_slices()
            return listed["items"], listed["metadata"]["resourceVersion"]

        self._reflector = Reflector(
            what="resourceslices",
            list_objects=list_objects,
            watch=lambda rv: client.watch_resource_slices(None, rv),
            on_list=self._listed,
            on_event=self._event,
            backoff=Backoff(),
            log=logs.get_logger(component="bench-fleet"),
        )
        self._thread = threading.Thread(target=self._reflector.run, args=(self._stop,), daemon=True)
        self._thread.start()

    def _listed(self, items: list[Json]) -> None:
        with self._changed:
            self._slices = {s["metadata"]["name"]: s for s in items}
            self._changed.notify_all()

    def _event(self, event: WatchEvent) -> None:
        with self._changed:
            name = event.object["metadata"]["name"]
            if event.type == "DELETED":
                self._slices.pop(name, None)
            else:
                self._slices[name] = event.object
            self._changed.notify_all()

    def _incomplete(self, driver: str, nodes: list[str]) -> int:
        pools: dict[str, list[Json]] = {}
        for s in self._slices.values():
            if s["spec"]["driver"] == driver:
                pools.setdefault(s["spec"]["pool"]["name"], []).append(s["spec"]["pool"])
        missing = 0
        for node in nodes:
            pool = pools.get(node, [])
            newest = max((p["generation"] for p in pool), default=None)
            current = [p for p in pool if p["generation"] == newest]
            if not current or len(current) != current[0]["resourceSliceCount"]:
                missing += 1
        return missing

    def wait_complete(self, driver: str, nodes: list[str], timeout: float) -> float:
        """Waits until every node's pool is complete; returns when (perf_counter)."""
        with self._changed:
            done = self._changed.wait_for(lambda: not self._incomplete(driver, nodes), timeout)
            if not done:
                missing = self._incomplete(driver, nodes)
                raise RuntimeError(f"{missing} of {len(nodes)} pools incomplete after {timeout:.0f}s")
            return time.perf_counter()

    def wait_empty(self, timeout: float) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: not self._slices, timeout), "slices left"

    def close(self) -> None:
        self._stop.set()
        self._reflector.close()
        self._thread.join(10)


# --- the instances -------------------------------------------------------------------------------


@dataclass
class Instance:
    node: str
    process: subprocess.Popen[bytes]
    root: Path


@dataclass
class Fleet:
    variant: Variant
    work: Path
    kubeconfigs: dict[str, Path]
    instances: list[Instance] = field(default_factory=list)

    def spawn(self, node: str) -> Instance:
        root = self.work / node
        shutil.rmtree(root, ignore_errors=True)
        for directory in ("reg", "plugins", "cdi"):
            (root / directory).mkdir(parents=True)
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        with (root / "plugin.log").open("wb") as out:
            process = subprocess.Popen(
                self.variant.argv(node, root, self.kubeconfigs[node]),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        instance = Instance(node, process, root)
        self.instances.append(instance)
        return instance

    def check_alive(self) -> None:
        for instance in self.instances:
            if instance.process.poll() is not None:
                log = (instance.root / "plugin.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{self.variant.label} on {instance.node} exited: {log}")

    def rss_mb(self) -> list[float]:
        return [rss_mb(i.process.pid) for i in self.instances]

    def cpu_seconds(self) -> list[float]:
        return [cpu_seconds(i.process.pid) for i in self.instances]

    def stop(self) -> None:
        """SIGTERM to all at once, then wait; SIGKILL whatever is left after 30 s."""
        for instance in self.instances:
            if instance.process.poll() is None:
                instance.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        for instance in self.instances:
            try:
                instance.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                instance.process.kill()
                instance.process.wait(10)
        self.instances.clear()


# --- the claim churn -----------------------------------------------------------------------------


def allocated_claim(admin: KubeClient, name: str, driver: str, node: str, device: str) -> None:
    claim = admin.request(
        "POST",
        CLAIMS,
        body={
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": driver}}]}},
        },
    )
    claim["status"] = {
        "allocation": {
            "devices": {"results": [{"request": "gpu", "driver": driver, "pool": node, "device": device}]},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            },
        }
    }
    admin.request("PUT", f"{CLAIMS}/{name}/status", body=claim)


def churn(admin: KubeClient, variant: Variant, nodes: list[str], opts: argparse.Namespace, tag: str) -> int:
    """Claims created, allocated and deleted at a steady rate; returns the claim changes made."""
    interval = 1.0 / opts.claim_rate
    alive: list[str] = []
    next_at = time.monotonic()
    for i in range(opts.claims):
        node = nodes[i % len(nodes)]
        name = f"churn-{tag}-{i}"
        allocated_claim(admin, name, variant.driver, node, f"gpu-{(i // len(nodes)) % variant.devices}")
        alive.append(name)
        if len(alive) > opts.claim_life:
            admin.request("DELETE", f"{CLAIMS}/{alive.pop(0)}")
        next_at += interval
        time.sleep(max(0.0, next_at - time.monotonic()))
    for name in alive:
        admin.request("DELETE", f"{CLAIMS}/{name}")
    changes: int = 3 * opts.claims
    return changes


def settled_claim_events(server: ApiServer) -> tuple[float, float, Samples]:
    """Scrapes until the ResourceClaim watch event count stops moving (the last deletes' events
    are sent after the DELETE answered)."""
    samples = server.scrape()
    events = claim_watch_events(samples)
    while True:
        time.sleep(0.5)
        again = server.scrape()
        if claim_watch_events(again) == events:
            return events[0], events[1], again
        samples, events = again, claim_watch_events(again)


# --- one plugin, every size ----------------------------------------------------------------------


@dataclass
class Step:
    n: int
    start_requests: dict[str, float] = field(default_factory=dict)
    start_seconds: float = 0.0
    complete_after_first: float = 0.0
    complete_after_last: float = 0.0
    spawn_spread: float = 0.0
    start_cpu: float = 0.0
    idle_requests: dict[str, float] = field(default_factory=dict)
    idle_cpu: float = 0.0
    watches: dict[str, float] = field(default_factory=dict)
    memory: Memory = field(default_factory=lambda: Memory(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, {}, {}))
    goroutines: float = 0.0
    connections: int = 0
    instance_rss_mb: list[float] = field(default_factory=list)
    #: CPU seconds of each instance from its spawn to the end of the start window, and in the idle window.
    instance_start_cpu: list[float] = field(default_factory=list)
    instance_idle_cpu: list[float] = field(default_factory=list)
    churn_events_per_change: float = 0.0
    churn_bytes_per_change: float = 0.0
    churn_requests: dict[str, float] = field(default_factory=dict)
    churn_changes: int = 1
    load: str = ""


@dataclass
class Result:
    variant: Variant
    baseline_rate: dict[str, float]
    baseline_cpu: float
    baseline_memory: Memory
    baseline_goroutines: float
    baseline_connections: int
    baseline_watches: dict[str, float]
    baseline_events_per_change: float
    steps: list[Step]


def net(window: Window, rate: dict[str, float], per: int) -> dict[str, float]:
    """A window's requests less the control plane's own rate, per instance."""
    keys = window.requests.keys() | rate.keys()
    return {k: (window.requests.get(k, 0.0) - rate.get(k, 0.0) * window.seconds) / per for k in keys}


def run_variant(variant: Variant, opts: argparse.Namespace) -> Result:
    sizes: list[int] = opts.sizes
    nodes = [node_name(opts.node_prefix, i) for i in range(max(sizes))]
    work = Path(tempfile.mkdtemp(prefix="bench-fleet-", dir="/var/tmp"))
    plane = ControlPlane(
        opts.k8s_bin, work / "plane", advertise_address=node_ip(), beta_resource_apis=opts.beta_resource_apis
    )
    if opts.memprofilerate:
        plane.apiserver_env["GODEBUG"] = f"memprofilerate={opts.memprofilerate}"
    fleet = Fleet(variant, work / "nodes", {})
    pools = None

    def profile_file(n: int) -> Path | None:
        if opts.save_profiles is None or n not in (0, max(sizes)):
            return None
        label = re.sub(r"[^A-Za-z0-9_.-]+", "-", variant.label)
        path: Path = opts.save_profiles / f"{label}-N{n}.heap.txt"
        return path

    try:
        plane.start()
        admin = load_client(str(plane.admin_kubeconfig))
        assert admin is not None
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        admin.request("POST", "/api/v1/namespaces", body=namespace)
        for node in nodes:
            admin.request(
                "POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}
            )
            user = f"fleet-{node}"
            grant_plugin_role(admin, user, variant.rbac)
            fleet.kubeconfigs[node] = plane.kubeconfig_for(user, user)
        pools = Pools(admin)
        server = ApiServer(plane)
        meter = Meter(server)
        print(f"{variant.label}: control plane alone for {opts.idle:.0f}s", flush=True)
        time.sleep(opts.settle)
        meter.mark()
        time.sleep(opts.idle)
        quiet, quiet_samples = meter.since_mark()
        baseline_memory = read_memory(server, profile_file(0))
        rate = {k: v / quiet.seconds for k, v in quiet.requests.items()}
        before_events = claim_watch_events(quiet_samples)
        changes = churn(admin, variant, nodes, opts, "0")
        events, _, _ = settled_claim_events(server)
        result = Result(
            variant,
            rate,
            quiet.cpu / quiet.seconds,
            baseline_memory,
            goroutines(quiet_samples),
            server.connections(),
            watches(quiet_samples),
            (events - before_events[0]) / changes,
            [],
        )
        for n in sizes:
            fleet.stop()
            admin.request("DELETE", SLICES)
            pools.wait_empty(60)
            step = Step(n, load=f"{os.getloadavg()[0]:.2f}")
            meter.mark()
            first = last = time.perf_counter()
            for i, node in enumerate(nodes[:n]):
                if i and opts.stagger:
                    time.sleep(opts.stagger)
                last = time.perf_counter()
                fleet.spawn(node)
            try:
                complete = pools.wait_complete(variant.driver, nodes[:n], opts.start_timeout)
            finally:
                fleet.check_alive()  # an instance that exited says why
            step.complete_after_first, step.complete_after_last = complete - first, complete - last
            step.spawn_spread = last - first
            time.sleep(opts.settle)
            started, _ = meter.since_mark()
            step.start_seconds = started.seconds
            step.start_requests = net(started, rate, n)
            step.start_cpu = started.cpu
            step.instance_start_cpu = fleet.cpu_seconds()
            meter.mark()
            time.sleep(opts.idle)
            idle, idle_samples = meter.since_mark()
            step.instance_idle_cpu = [
                (after - before) / idle.seconds
                for before, after in zip(step.instance_start_cpu, fleet.cpu_seconds(), strict=True)
            ]
            fleet.check_alive()
            step.idle_requests = {k: v * 60 / idle.seconds for k, v in net(idle, rate, n).items()}
            step.idle_cpu = idle.cpu / idle.seconds
            step.watches = difference(watches(idle_samples), result.baseline_watches)
            step.memory = read_memory(server, profile_file(n))
            step.goroutines = goroutines(idle_samples)
            step.connections = server.connections()
            step.instance_rss_mb = fleet.rss_mb()
            meter.mark()
            events_before, bytes_before, _ = settled_claim_events(server)
            changes = step.churn_changes = churn(admin, variant, nodes[:n], opts, str(n))
            events, sizes_after, _ = settled_claim_events(server)
            churned, _ = meter.since_mark()
            step.churn_events_per_change = (events - events_before) / changes
            step.churn_bytes_per_change = (sizes_after - bytes_before) / changes
            # The bench's own writes (a create, a status update and a delete per claim) left out.
            own = {"POST resourceclaims": opts.claims, "PUT resourceclaims/status": opts.claims}
            own["DELETE resourceclaims"] = opts.claims
            step.churn_requests = {k: v - own.get(k, 0) / n for k, v in net(churned, rate, n).items()}
            result.steps.append(step)
            print(f"{variant.label} N={n}: {summary_line(step)}", flush=True)
        return result
    finally:
        fleet.stop()
        if pools is not None:
            pools.close()
        plane.stop()
        shutil.rmtree(work, ignore_errors=True)


# --- the report ----------------------------------------------------------------------------------


def total(counts: dict[str, float], verbs: tuple[str, ...] | None = None) -> float:
    return sum(v for k, v in counts.items() if verbs is None or k.split(" ", 1)[0] in verbs)


def summary_line(step: Step) -> str:
    return (
        f"start {total(step.start_requests):.1f} req/node, complete {step.complete_after_last:.1f}s "
        f"after the last spawn ({step.complete_after_first:.1f}s after the first), "
        f"idle {total(step.idle_requests):.2f} req/node/min "
        f"({total(step.idle_requests, WRITES):.2f} writes), "
        f"watches {total(step.watches):.0f}, claim events/change {step.churn_events_per_change:.2f}, "
        f"API server RSS {step.memory.rss_mb:.0f} MB, live heap {step.memory.live_mb:.0f} MB, "
        f"instance RSS median {statistics.median(step.instance_rss_mb):.1f} MB, "
        f"load {step.load}"
    )


def breakdown(counts: dict[str, float], threshold: float = 0.05) -> str:
    """The per-node requests by verb and resource, those above the noise."""
    shown = sorted((k, v) for k, v in counts.items() if abs(v) >= threshold)
    return ", ".join(f"{k} {v:.1f}" for k, v in shown) or "none"


ROWS: list[tuple[str, str, Callable[[Step], float]]] = [
    ("start: requests per node", "{:.1f}", lambda s: total(s.start_requests)),
    ("start: writes per node", "{:.1f}", lambda s: total(s.start_requests, WRITES)),
    ("start: last spawn -> every pool complete (s)", "{:.1f}", lambda s: s.complete_after_last),
    ("start: first spawn -> every pool complete (s)", "{:.1f}", lambda s: s.complete_after_first),
    ("start: first spawn -> last spawn (s)", "{:.1f}", lambda s: s.spawn_spread),
    ("idle: requests per node per minute", "{:.2f}", lambda s: total(s.idle_requests)),
    ("idle: writes per node per minute", "{:.2f}", lambda s: total(s.idle_requests, WRITES)),
    ("watches open (all instances)", "{:.0f}", lambda s: total(s.watches)),
    ("ResourceClaim watches open", "{:.0f}", lambda s: s.watches.get("resourceclaims", 0.0)),
    ("claim churn: watch events per claim change", "{:.2f}", lambda s: s.churn_events_per_change),
    ("claim churn: watch bytes per claim change", "{:,.0f}", lambda s: s.churn_bytes_per_change),
    (
        "claim churn: plugin requests per node per claim change",
        "{:.3f}",
        lambda s: total(s.churn_requests) / s.churn_changes,
    ),
    ("API server idle CPU (% of a core)", "{:.2f}", lambda s: s.idle_cpu * 100),
    ("API server CPU during start (s)", "{:.1f}", lambda s: s.start_cpu),
    ("API server goroutines after idle", "{:.0f}", lambda s: s.goroutines),
    ("TCP connections to the API server", "{:.0f}", lambda s: s.connections),
    (
        "instance CPU from spawn to complete + settle, median (s)",
        "{:.2f}",
        lambda s: statistics.median(s.instance_start_cpu),
    ),
    (
        "instance idle CPU, median (% of a core)",
        "{:.2f}",
        lambda s: statistics.median(s.instance_idle_cpu) * 100,
    ),
    ("instance RSS, median (MB)", "{:.1f}", lambda s: statistics.median(s.instance_rss_mb)),
    ("instances' RSS, all (MB)", "{:,.0f}", lambda s: sum(s.instance_rss_mb)),
]


#: Read after each idle window (N = 0: the control plane alone), right after a garbage collection.
MEMORY_ROWS: list[tuple[str, str, Callable[[Memory], float]]] = [
    ("API server RSS (MB)", "{:.1f}", lambda m: m.rss_mb),
    ("API server live heap (MB)", "{:.1f}", lambda m: m.live_mb),
    ("API server live heap, the heap profile's estimate (MB)", "{:.1f}", lambda m: m.profiled_mb),
    ("API server heap in use (MB)", "{:.1f}", lambda m: m.heap_inuse_mb),
    ("API server goroutine stacks (MB)", "{:.2f}", lambda m: m.stack_mb),
    ("API server free heap kept from the system (MB)", "{:.1f}", lambda m: m.free_retained_mb),
    ("API server runtime structures (MB)", "{:.1f}", lambda m: m.runtime_mb),
    ("API server RSS less the free heap kept (MB)", "{:.1f}", lambda m: m.rss_mb - m.free_retained_mb),
]


def table_row(label: str, zero: str, form: str, sizes: list[int], values: list[float]) -> str:
    slope = f"{least_squares_slope(sizes, values):.3g}" if len(sizes) > 1 else "-"
    cells = " | ".join(form.format(v) for v in values)
    return f"| {label} | {zero} | {cells} | {slope} |"


def report(results: list[Result], sizes: list[int]) -> str:
    lines = []
    head = " | ".join(f"N={n}" for n in sizes)
    for result in results:
        lines += [f"#### {result.variant.label}", ""]
        lines.append(f"| figure | N=0 | {head} | slope per added node |")
        lines.append("|" + " --- |" * (len(sizes) + 3))
        for label, form, value in ROWS:
            values = [value(s) for s in result.steps]
            zero = {
                "watches open (all instances)": "0",
                "ResourceClaim watches open": "0",
                "claim churn: watch events per claim change": f"{result.baseline_events_per_change:.2f}",
                "API server idle CPU (% of a core)": f"{result.baseline_cpu * 100:.2f}",
                "API server goroutines after idle": f"{result.baseline_goroutines:.0f}",
                "TCP connections to the API server": f"{result.baseline_connections}",
            }.get(label, "")
            lines.append(table_row(label, zero, form, sizes, values))
        for label, form, read in MEMORY_ROWS:
            zero = form.format(read(result.baseline_memory))
            lines.append(table_row(label, zero, form, sizes, [read(s.memory) for s in result.steps]))
        lines.append("")
        for step in result.steps:
            lines.append(f"- N={step.n} start, per node: {breakdown(step.start_requests)}")
            lines.append(f"- N={step.n} idle, per node per minute: {breakdown(step.idle_requests)}")
            lines.append(f"- N={step.n} watches open: {breakdown(step.watches)}; load average {step.load}")
        lines.append(
            "- control plane alone, per minute: "
            + breakdown({k: v * 60 for k, v in result.baseline_rate.items()})
        )
        lines.append("")
    lines += growth_report(results, "holder", lambda memory: memory.holders, len(HOLDERS) + 1)
    # A site: the first frame outside the runtime and the generic helpers (bench/go_heap.py).
    lines += growth_report(
        results, "allocation site", lambda memory: {f"`{k}`": v for k, v in memory.sites.items()}, 20
    )
    return "\n".join(lines)


def growth(result: Result, read: Callable[[Memory], dict[str, float]]) -> tuple[dict[str, float], ...]:
    """Heap bytes per added node by key (allocation site, holder), each reading after a garbage
    collection: from N = 0 to the largest N, and the least-squares slope over the sizes (without
    N = 0, so that what the first instance adds once, such as a new metric series, is left out)."""
    memories = [result.baseline_memory, *(step.memory for step in result.steps)]
    keys = {key for memory in memories for key in read(memory)}
    zero, largest = read(result.baseline_memory), read(result.steps[-1].memory)
    overall = {key: (largest.get(key, 0.0) - zero.get(key, 0.0)) / result.steps[-1].n for key in keys}
    if len(result.steps) < 2:
        return (overall,)
    ns = [step.n for step in result.steps]
    slope = {
        key: least_squares_slope(ns, [read(step.memory).get(key, 0.0) for step in result.steps])
        for key in keys
    }
    return overall, slope


def growth_report(
    results: list[Result], what: str, read: Callable[[Memory], dict[str, float]], top: int
) -> list[str]:
    """The keys whose bytes grow most with N, every variant's growth side by side."""
    tables = [table for result in results for table in growth(result, read)]
    hows = ("N=0 to largest", "slope over sizes")
    columns = [f"{r.variant.label}: {how}" for r in results for how in hows[: 2 if len(r.steps) > 1 else 1]]
    shown: set[str] = set()
    for table in tables:
        shown.update(sorted(table, key=lambda key: -abs(table[key]))[:top])
    ordered = sorted(shown, key=lambda key: -max(abs(table.get(key, 0.0)) for table in tables))
    lines = [
        f"#### The API server's heap by {what}, KB per added node (each reading after a GC)",
        "",
        f"| {what} | " + " | ".join(columns) + " |",
        "|" + " --- |" * (len(columns) + 1),
    ]
    for key in ordered:
        lines.append(
            f"| {key} | " + " | ".join(f"{table.get(key, 0.0) / 1024:.1f}" for table in tables) + " |"
        )
    others = [sum(v for key, v in table.items() if key not in shown) / 1024 for table in tables]
    if any(others):
        lines.append("| all others | " + " | ".join(f"{v:.1f}" for v in others) + " |")
    lines.append("| all | " + " | ".join(f"{sum(table.values()) / 1024:.1f}" for table in tables) + " |")
    lines.append("")
    return lines


def variant_arg(value: str) -> tuple[str, Path, Path]:
    label, _, rest = value.partition("=")
    executable, _, rbac = rest.partition("=")
    if not label or not executable:
        raise argparse.ArgumentTypeError(f"{value!r}: expected LABEL=EXECUTABLE[=RBAC]")
    return label, Path(executable), Path(rbac) if rbac else RBAC


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k8s-bin", type=Path, default=os.environ.get("DRADRIVER_E2E_BIN"))
    parser.add_argument("--go-plugin", type=Path)
    parser.add_argument("--no-go", action="store_true")
    parser.add_argument("--ours", type=variant_arg, action="append", default=[])
    parser.add_argument(
        "--sizes", type=lambda v: sorted(int(n) for n in v.split(",")), default=[1, 10, 50, 100]
    )
    parser.add_argument(
        "--beta-resource-apis",
        action="store_true",
        help="serve resource.k8s.io v1beta1 and v1beta2 too, as the tests' API server does (a watch "
        "cache for each; the default is a 1.36 API server's own: v1 alone)",
    )
    parser.add_argument(
        "--node-prefix",
        default="fleet-node",
        help="node names: PREFIX-000 ...; serve refuses a second instance of a driver on one node name "
        "on the host, so two runs side by side need two prefixes",
    )
    parser.add_argument(
        "--devices", type=int, default=8, help="GPUs per node (fake profile or --num-devices)"
    )
    parser.add_argument(
        "--go-devices",
        type=int,
        action="append",
        help="run the Go reference with this many devices instead of --devices (repeatable: one "
        "variant each); a slice of as many bytes as dradriver's is the content-matched floor",
    )
    parser.add_argument("--idle", type=float, default=40.0, help="seconds of each idle window")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds after every pool is complete")
    parser.add_argument("--stagger", type=float, default=0.0, help="seconds between two spawns")
    parser.add_argument("--start-timeout", type=float, default=300.0)
    parser.add_argument("--claims", type=int, default=40)
    parser.add_argument("--claim-rate", type=float, default=4.0, help="claims created per second")
    parser.add_argument("--claim-life", type=int, default=4, help="claims alive at once")
    parser.add_argument(
        "--memprofilerate",
        type=int,
        default=64 * 1024,
        help="the API server's heap profile samples one allocation per this many bytes (Go's default: "
        "512 KiB; 0 leaves it); finer sampling resolves smaller allocation sites",
    )
    parser.add_argument(
        "--save-profiles", type=Path, help="a directory for the heap profiles at N = 0 and the largest N"
    )
    opts = parser.parse_args()
    if opts.k8s_bin is None:
        parser.error("--k8s-bin (or DRADRIVER_E2E_BIN) is required")
    variants = [ours(label, executable, rbac, opts.devices) for label, executable, rbac in opts.ours]
    if not opts.no_go:
        if opts.go_plugin is None:
            parser.error("--go-plugin is required (or --no-go)")
        variants.extend(go(opts.go_plugin, n, opts.devices) for n in opts.go_devices or [opts.devices])
    if opts.save_profiles is not None:
        opts.save_profiles.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    results = [run_variant(v, opts) for v in variants]
    print()
    print(f"started {started}, {os.cpu_count()} CPUs, load average now {os.getloadavg()}")
    print(report(results, opts.sizes))


if __name__ == "__main__":
    main()
