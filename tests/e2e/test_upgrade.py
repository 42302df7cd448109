"""A surge rollout of the plugin on a real node while pods with claims keep arriving.

Throughout the rollout: a steady stream of short pods, each with a one-GPU claim, is created on
the node; the node's ResourceSlices are listed every 50 ms; and (on the local cluster) every
registered instance is asked to prepare an empty set of claims every 50 ms, the way the kubelet
calls it. Afterwards: no pod failed a prepare (so none waited for the kubelet's resync), a pod
prepared before the rollout keeps its claim and its container, and the pool never went missing.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from dradriver.kube import KubeClient, NotFoundError
from tests.e2e.availability import PrepareProbe, SliceWatch, Watcher
from tests.e2e.plugin import DAEMONSET, DRIVER, NAMESPACE, Deployment, wait
from tests.e2e.realcluster import RealCluster
from tests.e2e.workloads import wait_unprepared

pytestmark = pytest.mark.cluster

PODS = "/api/v1/namespaces/default/pods"
TEMPLATES = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaimtemplates"


def pod(name: str, command: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "upgrade-stream"}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 2,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "upgrade-gpu"}],
            "containers": [
                {
                    "name": "app",
                    "image": "busybox:1.37",
                    "command": ["sh", "-c", command],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }


class PodStream(threading.Thread):
    """One short pod with a claim every `interval` seconds until stopped."""

    def __init__(self, client: KubeClient, interval: float) -> None:
        super().__init__(daemon=True)
        self.client, self.interval = client, interval
        self.names: list[str] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            name = f"stream-{len(self.names)}"
            self.client.request("POST", PODS, body=pod(name, "sleep 1"))
            self.names.append(name)
            self.stopped.wait(self.interval)

    def stop(self) -> None:
        self.stopped.set()
        self.join(30)

    def assert_all_prepared(self, cluster: RealCluster) -> None:
        """Every pod of the stream ran to completion, and none waited for a failed prepare."""
        wait(
            lambda: all(phase(self.client, n) == "Succeeded" for n in self.names),
            240,
            "every stream pod to run to completion",
        )
        events = cluster.get_json(
            "events", "-n", "default", "--field-selector", "reason=FailedPrepareDynamicResources"
        )["items"]
        assert isinstance(events, list)
        # Events outlive their pods: only this stream's count (not an earlier test's pods).
        failed = [e for e in events if e["involvedObject"]["name"] in self.names]
        assert failed == [], [e["message"] for e in failed]


@pytest.fixture
def claim_template(real_cluster: RealCluster) -> Iterator[None]:
    client = real_cluster.client()
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "upgrade-gpu"},
        "spec": {
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}
        },
    }
    client.request("POST", TEMPLATES, body=template)
    yield
    real_cluster.kubectl("delete", "pods", "-l", "app=upgrade-stream", "--wait=true", "--timeout=120s")
    real_cluster.kubectl("delete", "pod", "upgrade-keeper", "--ignore-not-found", "--wait=true")
    with contextlib.suppress(NotFoundError):
        client.request("DELETE", f"{TEMPLATES}/upgrade-gpu")


def phase(client: KubeClient, name: str) -> str:
    return str(client.request("GET", f"{PODS}/{name}").get("status", {}).get("phase", ""))


def test_surge_rollout_under_a_stream_of_claims_loses_no_prepare(
    real_cluster: RealCluster, fake_deployment: Deployment, claim_template: None
) -> None:
    client = real_cluster.client()
    devices = len(fake_deployment.devices())
    client.request("POST", PODS, body=pod("upgrade-keeper", 'trap "exit 0" TERM; sleep 3600 & wait'))
    wait(lambda: phase(client, "upgrade-keeper") == "Running", 120, "the keeper pod Running")
    prepared = {c["uid"] for c in fake_deployment.status()["claims"]}
    assert len(prepared) == 1
    old_pod = fake_deployment.pod()

    slices = SliceWatch(client, real_cluster.node_name, devices)
    probe = PrepareProbe()
    watchers: list[Watcher] = [slices] + ([probe] if real_cluster.local is not None else [])
    for watcher in watchers:
        watcher.start()
    stream = PodStream(client, interval=1.0)
    stream.start()
    try:
        wait(lambda: len(stream.names) >= 5, 60, "the stream to get going")
        real_cluster.kubectl(
            "-n", NAMESPACE, "set", "env", f"daemonset/{DAEMONSET}", "-c", "plugin", "DRADRIVER_VERBOSITY=1"
        )
        # Watch the surge happen: the new pod beside the old one, then the old one gone.
        most_plugin_pods = fake_deployment.wait_replaced(old_pod)
        fake_deployment.wait_ready()
        started = len(stream.names)
        wait(lambda: len(stream.names) >= started + 5, 60, "the stream to go on after the rollout")
    finally:
        stream.stop()
        for watcher in watchers:
            watcher.stop()

    stream.assert_all_prepared(real_cluster)
    assert most_plugin_pods == 2, "the rollout did not surge"
    assert fake_deployment.pod() != old_pod
    assert {c["uid"] for c in fake_deployment.status()["claims"]} >= prepared
    keeper = client.request("GET", f"{PODS}/upgrade-keeper")
    assert keeper["status"]["phase"] == "Running"
    assert keeper["status"]["containerStatuses"][0]["restartCount"] == 0
    assert [w.errors for w in watchers] == [[] for _ in watchers]
    assert slices.samples > 0
    assert slices.incomplete == []
    if real_cluster.local is not None:
        assert len(probe.instances) == 2, probe.instances  # both instances answered at some point
        print(
            f"rollout under a stream of {len(stream.names)} pods: {probe.failed_rounds} of "
            f"{probe.rounds} probe rounds found no instance answering NodePrepareResources; "
            f"longest outage {probe.longest_outage:.2f} s"
        )

    real_cluster.kubectl("delete", "pod", "upgrade-keeper", "--wait=true")
    wait_unprepared(fake_deployment, timeout=120)
