"""The plugin's life on a real node: probes, restarts, rollouts, a kubelet restart, force deletion.

A prepared claim must survive every restart of the plugin and of the kubelet (the checkpoint
carries it; the pod keeps running; it is unprepared by whichever instance runs when the pod
goes), the slices the kubelet deletes at its start must come back, and a GPU freed by a
force-deleted pod must go to the next pod at once, not after the kubelet's next resync.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.deploy.manifests import EXAMPLES
from tests.e2e.plugin import NAMESPACE, Deployment, wait
from tests.e2e.realcluster import RealCluster
from tests.e2e.workloads import events_for, load, pods_of, wait_pods, wait_unprepared

pytestmark = pytest.mark.cluster


def running(cluster: RealCluster, documents: list[dict[str, Any]], what: str) -> list[dict[str, Any]]:
    return wait_pods(cluster, documents, lambda p: p["status"].get("phase") == "Running", 120, what)


def claim_uids(deployment: Deployment) -> set[str]:
    return {c["uid"] for c in deployment.status()["claims"]}


def delete(cluster: RealCluster, documents: list[dict[str, Any]]) -> None:
    cluster.kubectl(
        "delete",
        "-f",
        "-",
        "--ignore-not-found",
        "--wait=true",
        "--timeout=90s",
        stdin=yaml.safe_dump_all(documents),
    )
    wait(lambda: not pods_of(cluster, documents), 60, "the pods to go")


@contextlib.contextmanager
def applied(cluster: RealCluster, deployment: Deployment, documents: list[dict[str, Any]]) -> Iterator[None]:
    """The documents applied for the block, and deleted and unprepared after it, also when it
    fails: a test that leaves its pods behind would hold GPUs the next tests need."""
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(documents))
    try:
        yield
    finally:
        delete(cluster, documents)
        wait_unprepared(deployment)


def exec_served(deployment: Deployment) -> bool:
    """Whether the kubelet serves exec into the plugin pod (a restarted one does not know its
    pods for a moment: "pod does not exist")."""
    try:
        deployment.exec("true")
    except AssertionError:
        return False
    return True


def metrics(cluster: RealCluster, deployment: Deployment) -> str:
    """The plugin's /metrics, through the API server's pod proxy (as Prometheus would scrape it)."""
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{deployment.pod()}:8080/proxy/metrics"
    return cluster.kubectl("get", "--raw", path).stdout


def test_probes_do_no_claim_work_and_log_nothing(
    real_cluster: RealCluster, fake_deployment: Deployment
) -> None:
    """The pod is Ready, so its startup probe has passed; the liveness probe keeps running."""
    pod = fake_deployment.pods()[0]
    assert pod["spec"]["containers"][0]["startupProbe"]["exec"]["command"] == ["dradriver", "healthcheck"]
    assert all(c["ready"] for c in pod["status"]["containerStatuses"])
    logs = fake_deployment.all_logs()
    assert "NodeUnprepareResources" not in logs
    assert "NodePrepareResources" not in logs
    assert "dradriver_dra_call_duration_seconds_count" not in metrics(real_cluster, fake_deployment)


def test_plugin_restart_and_rollout_keep_a_prepared_claim(
    real_cluster: RealCluster, fake_deployment: Deployment
) -> None:
    documents = load(EXAMPLES / "single-gpu.yaml")
    with applied(real_cluster, fake_deployment, documents):
        (pod,) = running(real_cluster, documents, "single-gpu Running")
        prepared = claim_uids(fake_deployment)
        assert len(prepared) == 1

        old = fake_deployment.pod()
        real_cluster.kubectl("-n", NAMESPACE, "delete", "pod", old, "--wait=true")
        fake_deployment.wait_ready()
        assert fake_deployment.pod() != old
        assert claim_uids(fake_deployment) == prepared

        # A rollout (any change of the pod template) replaces the plugin the same way.
        fake_deployment.set_env(DRADRIVER_VERBOSITY="1")
        assert claim_uids(fake_deployment) == prepared
        (after,) = pods_of(real_cluster, documents)
        assert after["metadata"]["uid"] == pod["metadata"]["uid"]
        assert after["status"]["phase"] == "Running"
        assert after["status"]["containerStatuses"][0]["restartCount"] == 0


def test_kubelet_restart_republishes_slices_and_keeps_the_claim(
    real_cluster: RealCluster, fake_deployment: Deployment
) -> None:
    local = real_cluster.require_local("it restarts the kubelet")
    documents = load(EXAMPLES / "single-gpu.yaml")
    with applied(real_cluster, fake_deployment, documents):
        running(real_cluster, documents, "single-gpu Running")
        prepared = claim_uids(fake_deployment)
        devices = fake_deployment.devices()
        before = {s["metadata"]["uid"] for s in fake_deployment.slices()}

        local.restart_kubelet()
        # The kubelet deletes the slices of drivers not (yet) registered at its start; the
        # plugin's watch sees that and publishes them again.
        # New slices: the kubelet wipes them in the background after it answers its health check.
        wait(
            lambda: (
                fake_deployment.devices() == devices
                and before.isdisjoint(s["metadata"]["uid"] for s in fake_deployment.slices())
            ),
            60,
            "the slices to be published again",
        )
        wait(lambda: exec_served(fake_deployment), 60, "the restarted kubelet to serve exec again")
        assert claim_uids(fake_deployment) == prepared
        running(real_cluster, documents, "single-gpu still Running")


def test_force_deleted_pods_gpu_goes_to_the_next_pod_at_once(
    real_cluster: RealCluster, fake_deployment: Deployment
) -> None:
    """All GPUs of the node for pod A; A force-deleted; pod B asks for all GPUs again. The
    kubelet unprepares A's claim only after B's prepare: B must not fail its prepare (which
    would leave it waiting a minute or more for the kubelet's next resync)."""
    first = load(EXAMPLES / "all-gpus.yaml")
    second = copy.deepcopy([d for d in first if d["kind"] == "Pod"])
    second[0]["metadata"]["name"] = "all-gpus-b"
    with applied(real_cluster, fake_deployment, first):
        (pod_a,) = running(real_cluster, first, "pod A Running")
        real_cluster.kubectl("delete", "pod", pod_a["metadata"]["name"], "--force", "--grace-period=0")
        started = time.monotonic()
        with applied(real_cluster, fake_deployment, second):
            (pod_b,) = running(real_cluster, second, "pod B Running")
            seconds = time.monotonic() - started
            failed = [
                e["message"]
                for e in events_for(real_cluster, pod_b)
                if e["reason"] == "FailedPrepareDynamicResources"
            ]
            assert failed == [], failed
            print(f"force delete -> next pod Running: {seconds:.2f} s")
