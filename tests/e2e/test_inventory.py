"""The live inventory on a real node: the fake GPU profile of the running plugin is rewritten.

The plugin reads its profile from a host directory (a kustomize-style patch of the fake
DaemonSet), and the test replaces the file atomically, as a ConfigMap update or an operator
would: a GPU appears and the scheduler hands it to the next pod; an idle GPU disappears from the
slices; a GPU a running pod holds disappears and stays published, tainted, until the pod goes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dradriver.kube.events import NODE_EVENTS_NAMESPACE
from tests.e2e.plugin import DRIVER, Deployment, wait
from tests.e2e.realcluster import RealCluster
from tests.e2e.workloads import wait_unprepared
from tests.helpers import write_gpu_profile

pytestmark = pytest.mark.cluster

HOST_DIR = Path("/var/lib/dradriver-e2e-profile")


def write_profile(count: int) -> None:
    aside = write_gpu_profile(HOST_DIR / ".gpus.yaml.new", count)
    os.replace(aside, HOST_DIR / "gpus.yaml")


@pytest.fixture(scope="module")
def profile_deployment(real_cluster: RealCluster, fake_deployment: Deployment) -> Iterator[Deployment]:
    real_cluster.require_local("it writes the plugin's profile file on the node")
    HOST_DIR.mkdir(parents=True, exist_ok=True)
    write_profile(2)
    fake_deployment.profile_from_host(HOST_DIR)
    wait(lambda: fake_deployment.devices() == ["gpu-0", "gpu-1"], 60, "the slices of the 2-GPU profile")
    yield fake_deployment
    for name in os.listdir(HOST_DIR):
        (HOST_DIR / name).unlink()
    HOST_DIR.rmdir()


def gpu_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "inventory"}},
        "spec": {
            "terminationGracePeriodSeconds": 2,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "inventory-gpu"}],
            "containers": [
                {
                    "name": "app",
                    "image": "busybox:1.37",
                    "command": ["sh", "-c", 'trap "exit 0" TERM; sleep 3600 & wait'],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }


TEMPLATE = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaimTemplate",
    "metadata": {"name": "inventory-gpu", "namespace": "default"},
    "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}},
}


def phase(cluster: RealCluster, name: str) -> str:
    status = cluster.get_json("pod", name)["status"]
    assert isinstance(status, dict)
    return str(status.get("phase", ""))


def start_pods(cluster: RealCluster, *names: str) -> dict[str, str]:
    """Create the pods, wait for them to run; pod name -> the GPU it was given."""
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all([gpu_pod(n) for n in names]))
    given = {}
    for name in names:
        wait(lambda n=name: phase(cluster, n) == "Running", 120, f"{name} Running")
        claims = cluster.get_json("resourceclaims", "-n", "default")["items"]
        assert isinstance(claims, list)
        (claim,) = [
            c for c in claims if any(r.get("name") == name for r in c["status"].get("reservedFor") or [])
        ]
        given[name] = claim["status"]["allocation"]["devices"]["results"][0]["device"]
    return given


def taints(deployment: Deployment, device: str) -> list[tuple[str, str]]:
    for slice_ in deployment.slices():
        for d in slice_["spec"].get("devices", []):
            if d["name"] == device:
                return [(t["key"], t["value"]) for t in d.get("taints") or []]
    return []


def test_profile_changes_reach_the_slices_and_the_scheduler(
    real_cluster: RealCluster, profile_deployment: Deployment
) -> None:
    deployment = profile_deployment
    real_cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(TEMPLATE))
    try:
        held = start_pods(real_cluster, "inv-a", "inv-b")
        assert sorted(held.values()) == ["gpu-0", "gpu-1"]

        write_profile(3)  # a GPU appears: the next pod can only get it
        wait(lambda: deployment.devices() == ["gpu-0", "gpu-1", "gpu-2"], 30, "gpu-2 in the slices")
        assert start_pods(real_cluster, "inv-c") == {"inv-c": "gpu-2"}

        real_cluster.kubectl("delete", "pod", "inv-c", "--wait=true")
        wait(lambda: len(deployment.status()["claims"]) == 2, 60, "inv-c's claim unprepared")
        write_profile(2)  # the idle gpu-2 goes
        wait(lambda: deployment.devices() == ["gpu-0", "gpu-1"], 30, "gpu-2 gone from the slices")

        write_profile(1)  # gpu-1, held by a running pod, goes: kept, tainted, until unprepared
        holder = next(pod for pod, gpu in held.items() if gpu == "gpu-1")
        wait(lambda: taints(deployment, "gpu-1") != [], 30, "gpu-1 tainted")
        assert taints(deployment, "gpu-1") == [(f"{DRIVER}/unhealthy", "device-gone")]
        assert deployment.devices() == ["gpu-0", "gpu-1"]

        def gone_event() -> bool:
            # Sent from the Events queue: it may follow the taint.
            events: Any = real_cluster.get_json(
                "events", "-n", NODE_EVENTS_NAMESPACE, "--field-selector", "reason=DeviceUnhealthy"
            )["items"]
            return any("gpu-1" in e["message"] and "no longer on the node" in e["message"] for e in events)

        wait(gone_event, 30, "the DeviceUnhealthy Event of gpu-1")

        real_cluster.kubectl("delete", "pod", holder, "--wait=true")
        wait(lambda: deployment.devices() == ["gpu-0"], 60, "gpu-1 gone once its claim is unprepared")
    finally:
        real_cluster.kubectl("delete", "pods", "-l", "app=inventory", "--wait=true", "--timeout=120s")
        real_cluster.kubectl("delete", "-f", "-", "--ignore-not-found", stdin=yaml.safe_dump(TEMPLATE))
    wait_unprepared(deployment, timeout=120)
