"""Workloads with claims on the real cluster: their pods, their claims, what their containers got."""

from __future__ import annotations

import json
import re
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.manifests import kubectl
from tests.e2e.plugin import DRIVER, Deployment, wait
from tests.e2e.realcluster import RealCluster

Json = dict[str, Any]


def pods_of(cluster: RealCluster, documents: list[Json], *, terminating: bool = False) -> list[Json]:
    """The live pods the objects of a manifest file made: Pods by name, Jobs and Deployments by
    label; with `terminating`, those being deleted too."""
    pods: list[Json] = []
    for doc in documents:
        namespace = doc["metadata"].get("namespace", "default")
        name = doc["metadata"]["name"]
        if doc["kind"] == "Pod":
            found = cluster.kubectl("-n", namespace, "get", "pod", name, "-o", "json", check=False)
            if found.returncode == 0:
                pods.append(json.loads(found.stdout))
        elif doc["kind"] in {"Job", "Deployment"}:
            if doc["kind"] == "Job":
                selector = f"batch.kubernetes.io/job-name={name}"
            else:
                labels = doc["spec"]["selector"]["matchLabels"]
                selector = ",".join(f"{k}={v}" for k, v in labels.items())
            items = cluster.get_json("pods", "-n", namespace, "-l", selector)["items"]
            assert isinstance(items, list)
            pods += items
    return [p for p in pods if terminating or not p["metadata"].get("deletionTimestamp")]


def expected_pod_count(documents: list[Json]) -> int:
    count = 0
    for doc in documents:
        if doc["kind"] == "Pod":
            count += 1
        elif doc["kind"] == "Job":
            count += int(doc["spec"].get("parallelism", 1))
        elif doc["kind"] == "Deployment":
            count += int(doc["spec"].get("replicas", 1))
    return count


def condition(pod: Json, kind: str) -> Json | None:
    return next((c for c in pod.get("status", {}).get("conditions", []) if c["type"] == kind), None)


def unschedulable(pod: Json) -> bool:
    scheduled = condition(pod, "PodScheduled")
    return (
        scheduled is not None
        and scheduled["status"] == "False"
        and scheduled.get("reason") == "Unschedulable"
    )


def events_for(cluster: RealCluster, pod: Json) -> list[Json]:
    meta = pod["metadata"]
    items = cluster.get_json(
        "events", "-n", meta["namespace"], "--field-selector", f"involvedObject.uid={meta['uid']}"
    )["items"]
    assert isinstance(items, list)
    return items


@dataclass(frozen=True)
class ContainerDevices:
    """What one container was promised: the CDI edits of its devices and of their claims' specs."""

    pod: str
    namespace: str
    container: str
    device_nodes: dict[str, tuple[int, int]]
    env: dict[str, str]
    mounts: list[str]


def claim_names(pod: Json) -> dict[str, str]:
    """Pod-level claim name -> ResourceClaim name."""
    names = {}
    for entry in pod["spec"].get("resourceClaims", []):
        if entry.get("resourceClaimName"):
            names[entry["name"]] = entry["resourceClaimName"]
    for entry in pod.get("status", {}).get("resourceClaimStatuses", []):
        if entry.get("resourceClaimName"):
            names[entry["name"]] = entry["resourceClaimName"]
    return names


def claims_of(pod: Json) -> set[str]:
    """The names of every ResourceClaim the pod uses, the scheduler's extended-resource one too."""
    names = set(claim_names(pod).values())
    extended = pod.get("status", {}).get("extendedResourceClaimStatus")
    if extended:
        names.add(extended["resourceClaimName"])
    return names


def promised(cluster: RealCluster, deployment: Deployment, pod: Json) -> list[ContainerDevices]:
    """Per container: the device nodes, env and mounts its claims' CDI specs inject into it.

    A container gets the results of the requests it references (all of a claim's, when it names
    no request); the extended-resource claim the scheduler makes maps requests to containers.
    """
    namespace = pod["metadata"]["namespace"]
    names = claim_names(pod)
    references: dict[str, list[tuple[str, str | None]]] = {}
    for container in pod["spec"]["containers"]:
        refs = references.setdefault(container["name"], [])
        for claim in (container.get("resources") or {}).get("claims", []):
            refs.append((names[claim["name"]], claim.get("request")))
    extended = pod.get("status", {}).get("extendedResourceClaimStatus")
    if extended:
        for mapping in extended.get("requestMappings", []):
            references.setdefault(mapping["containerName"], []).append(
                (extended["resourceClaimName"], mapping["requestName"])
            )
    # Each claim and its CDI spec once, however many containers use it.
    claims = {name: cluster.get_json("resourceclaim", "-n", namespace, name) for name in _used(references)}
    specs: dict[str, Json] = {}
    result = []
    for container, refs in references.items():
        edits: list[Json] = []
        for claim_name, request in refs:
            claim = claims[claim_name]
            uid = claim["metadata"]["uid"]  # type: ignore[index]
            results = claim["status"]["allocation"]["devices"]["results"]  # type: ignore[index]
            ours = [
                r
                for r in results
                if r["driver"] == DRIVER and (request is None or r["request"].split("/")[0] == request)
            ]
            if not ours:
                continue
            if uid not in specs:
                specs[uid] = deployment.cdi_spec(uid)
            spec = specs[uid]
            edits.append(spec.get("containerEdits", {}))
            for allocated in ours:
                edits += [
                    d["containerEdits"]
                    for d in spec["devices"]
                    if d["name"].startswith(f"{uid}-{allocated['device']}")
                ]
        result.append(_merged(pod, container, edits))
    return result


def _used(references: dict[str, list[tuple[str, str | None]]]) -> list[str]:
    return sorted({claim for refs in references.values() for claim, _ in refs})


def promised_by_specs(pod: Json, specs: list[Json]) -> list[ContainerDevices]:
    """For a pod whose claims are gone (a finished Job's): every device of the CDI specs recorded
    while it ran goes to each container that uses a claim."""
    edits = [spec.get("containerEdits", {}) for spec in specs]
    edits += [d["containerEdits"] for spec in specs for d in spec["devices"]]
    return [
        _merged(pod, c["name"], edits)
        for c in pod["spec"]["containers"]
        if (c.get("resources") or {}).get("claims")
    ]


def _merged(pod: Json, container: str, edits: list[Json]) -> ContainerDevices:
    nodes: dict[str, tuple[int, int]] = {}
    env_values: dict[str, set[str]] = {}
    mounts: list[str] = []
    for edit in edits:
        for node in edit.get("deviceNodes", []):
            nodes[node["path"]] = (node["major"], node["minor"])
        for entry in edit.get("env", []):
            key, _, value = entry.partition("=")
            env_values.setdefault(key, set()).add(value)
        mounts += [m["containerPath"] for m in edit.get("mounts", [])]
    # A variable that several edits set to different values has no single promised value.
    env = {k: next(iter(v)) for k, v in env_values.items() if len(v) == 1}
    meta = pod["metadata"]
    return ContainerDevices(meta["name"], meta["namespace"], container, nodes, env, mounts)


_STAT = re.compile(r"^(?P<path>\S+) (?P<kind>.+) (?P<major>[0-9a-f]+):(?P<minor>[0-9a-f]+)$")


def inspect_container(
    cluster: RealCluster, promise: ContainerDevices
) -> tuple[dict[str, tuple[int, int]], dict[str, str], set[str]]:
    """What the running container has: its char devices (of the promised paths), env and mounts."""
    paths = " ".join(promise.device_nodes)
    script = (
        f'for d in {paths}; do stat -c "%n %F %t:%T" "$d" 2>/dev/null || echo "$d missing 0:0"; done; '
        'echo ---; env; echo ---; cut -d" " -f2 /proc/mounts'
    )
    output = cluster.kubectl(
        "-n", promise.namespace, "exec", promise.pod, "-c", promise.container, "--", "sh", "-c", script
    ).stdout
    stat_part, env_part, mount_part = output.split("---\n")
    nodes = {}
    for line in stat_part.splitlines():
        match = _STAT.match(line)
        if match and match["kind"] == "character special file":
            nodes[match["path"]] = (int(match["major"], 16), int(match["minor"], 16))
    env = dict(line.partition("=")[::2] for line in env_part.splitlines() if "=" in line)
    return nodes, env, set(mount_part.split())


def check_container(cluster: RealCluster, promise: ContainerDevices) -> None:
    nodes, env, mounts = inspect_container(cluster, promise)
    where = f"{promise.namespace}/{promise.pod}/{promise.container}"
    assert nodes == promise.device_nodes, f"{where}: device nodes {nodes} != promised {promise.device_nodes}"
    for key, value in promise.env.items():
        assert env.get(key) == value, f"{where}: env {key}={env.get(key)!r}, promised {value!r}"
    missing = [m for m in promise.mounts if m not in mounts]
    assert not missing, f"{where}: mounts missing: {missing}"


_LS_DEVICE = re.compile(r"^c\S*\s+\d+\s+\S+\s+\S+\s+(\d+),\s*(\d+)\s.*\s(/dev/\S+)$")


def check_log(cluster: RealCluster, promise: ContainerDevices) -> None:
    """For a container that has finished: what it printed (`env` filtered to NVIDIA_/CUDA_, and
    `ls -l /dev/nvidia*`) shows the promised env and character devices."""
    log = cluster.kubectl("-n", promise.namespace, "logs", promise.pod, "-c", promise.container).stdout
    where = f"{promise.namespace}/{promise.pod}/{promise.container}"
    printed = {}
    for line in log.splitlines():
        if match := _LS_DEVICE.match(line):
            printed[match[3]] = (int(match[1]), int(match[2]))
    shown = {
        k: v
        for k, v in promise.device_nodes.items()
        if k.startswith("/dev/nvidia") and "/nvidia-caps/" not in k
    }
    assert printed == shown, f"{where}: listed devices {printed} != promised {shown}"
    for key, value in promise.env.items():
        if key.startswith(("NVIDIA_", "CUDA_")):
            assert f"{key}={value}" in log.splitlines(), f"{where}: {key}={value} not in its output"


def load(path: Path) -> list[Json]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def wait_unprepared(deployment: Deployment, timeout: float = 60) -> None:
    """The node holds nothing any more: empty checkpoint, no claim CDI spec."""

    def state() -> tuple[list[Json], list[str]]:
        return deployment.status()["claims"], deployment.cdi_files()

    try:
        wait(lambda: state() == ([], []), timeout, "an empty checkpoint and no claim CDI spec")
    except AssertionError as err:
        raise AssertionError(f"{err}; checkpoint claims, CDI specs: {state()}") from None


def wait_pods(
    cluster: RealCluster, documents: list[Json], phase_ok: Any, timeout: float, what: str
) -> list[Json]:
    count = expected_pod_count(documents)

    def ready() -> list[Json] | None:
        pods = pods_of(cluster, documents)
        return pods if len(pods) == count and all(phase_ok(p) for p in pods) else None

    result: list[Json] = wait(ready, timeout, what, interval=0.3)
    return result


@dataclass
class ClaimHistory:
    """Every version of every ResourceClaim the API server sent since the history began."""

    versions: list[Json] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reserved(self, namespace: str, name: str, pod_uid: str) -> bool:
        """Whether a version of the claim was allocated and reserved for the pod."""
        with self.lock:
            return any(
                c["metadata"]["namespace"] == namespace
                and c["metadata"]["name"] == name
                and c.get("status", {}).get("allocation")
                and any(r.get("uid") == pod_uid for r in c["status"].get("reservedFor", []))
                for c in self.versions
            )


@contextmanager
def claim_history(cluster: RealCluster) -> Iterator[ClaimHistory]:
    """Watch ResourceClaims (all namespaces) from now on: the claims of a short-lived pod are
    deallocated and deleted again before a test could look at them."""
    listed = cluster.get_json("resourceclaims", "-A")
    version = listed["metadata"]["resourceVersion"]  # type: ignore[index]
    # From the listed version: no event is lost however late the connection comes up.
    path = f"/apis/resource.k8s.io/v1/resourceclaims?watch=1&resourceVersion={version}"
    watcher = subprocess.Popen(
        [kubectl(), "--kubeconfig", str(cluster.kubeconfig), "get", "--raw", path],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    history = ClaimHistory()

    def read() -> None:
        assert watcher.stdout is not None
        for line in watcher.stdout:
            event = json.loads(line)
            if event.get("type") in {"ADDED", "MODIFIED", "DELETED"}:
                with history.lock:
                    history.versions.append(event["object"])

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield history
    finally:
        watcher.terminate()
        watcher.wait(10)
        reader.join(10)
