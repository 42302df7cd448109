"""Device health end to end: a fake XID reaches the pod's status (KEP-4680), taints the device so
the scheduler avoids it, and recovery clears both — with the health config an operator would set
through a ConfigMap (a quiet period of seconds, not minutes)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from tests.e2e.plugin import DAEMONSET, DRIVER, NAMESPACE, Deployment, wait
from tests.e2e.realcluster import RealCluster
from tests.e2e.workloads import pods_of, unschedulable, wait_pods, wait_unprepared

pytestmark = pytest.mark.cluster

DEVICE = "gpu-3"
#: Long enough for the scheduler to be seen holding a pod back, short enough for a test: the
#: quiet period outlasts what the test does while the device must stay tainted (a pod
#: deleted and unprepared, another held back), up to about 20 s on a loaded machine.
HEALTH_CONFIG = "quietPeriodSeconds: 40\nrecheckIntervalSeconds: 1\n"


def pinned_pod(name: str) -> list[dict[str, Any]]:
    """A pod whose claim can only get gpu-3 (by its minor number)."""
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": DRIVER,
                                "selectors": [
                                    {"cel": {"expression": f'device.attributes["{DRIVER}"].minor == 3'}}
                                ],
                            },
                        }
                    ]
                }
            }
        },
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": name}],
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
    return [template, pod]


def with_health_config(cluster: RealCluster, deployment: Deployment) -> None:
    """`--health-config` from a ConfigMap, the way an operator sets it."""
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "dradriver-health", "namespace": NAMESPACE},
        "data": {"health.yaml": HEALTH_CONFIG},
    }
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(configmap))
    patch = {
        "spec": {
            "template": {
                "spec": {
                    "volumes": [{"name": "health", "configMap": {"name": "dradriver-health"}}],
                    "containers": [
                        {
                            "name": "plugin",
                            "env": [
                                {"name": "DRADRIVER_HEALTH_CONFIG", "value": "/etc/dradriver/health.yaml"}
                            ],
                            "volumeMounts": [
                                {"name": "health", "mountPath": "/etc/dradriver", "readOnly": True}
                            ],
                        }
                    ],
                }
            }
        }
    }
    cluster.kubectl(
        "-n", NAMESPACE, "patch", "daemonset", DAEMONSET, "--type=strategic", "-p", json.dumps(patch)
    )
    deployment.wait_ready()


def device_health(pod: dict[str, Any]) -> str | None:
    """gpu-3's health in the pod's status (containerStatuses[].allocatedResourcesStatus). The
    kubelet names a DRA device by its first CDI device ID (`<kind>=<claim uid>-gpu-3`), else
    `<driver>/<pool>/gpu-3`."""
    for status in pod["status"].get("containerStatuses", []):
        for entry in status.get("allocatedResourcesStatus") or []:
            for resource in entry.get("resources") or []:
                if resource["resourceID"].endswith((f"-{DEVICE}", f"/{DEVICE}")):
                    return str(resource.get("health", ""))
    return None


def require_health_in_pod_status(cluster: RealCluster) -> None:
    metrics = cluster.kubectl("get", "--raw", f"/api/v1/nodes/{cluster.node_name}/proxy/metrics").stdout
    if 'kubernetes_feature_enabled{name="ResourceHealthStatus"' not in metrics or any(
        line.startswith('kubernetes_feature_enabled{name="ResourceHealthStatus"') and line.endswith(" 0")
        for line in metrics.splitlines()
    ):
        pytest.skip(
            "the cluster's kubelet has ResourceHealthStatus (alpha in 1.36) off: no health in pod status"
        )


def taints(deployment: Deployment) -> list[dict[str, Any]]:
    return [
        t
        for s in deployment.slices()
        for d in s["spec"]["devices"]
        if d["name"] == DEVICE
        for t in d.get("taints", [])
    ]


def test_xid_reaches_the_pod_taints_the_device_and_recovers(
    real_cluster: RealCluster, fake_deployment: Deployment
) -> None:
    require_health_in_pod_status(real_cluster)
    with_health_config(real_cluster, fake_deployment)
    first = pinned_pod("pinned-a")
    real_cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(first))
    wait_pods(real_cluster, first, lambda p: p["status"].get("phase") == "Running", 120, "pinned-a Running")
    wait(
        lambda: device_health(pods_of(real_cluster, first)[0]) == "Healthy",
        60,
        "Healthy in the pod status",
    )

    fake_deployment.exec("dradriver", "fake-event", "--device", DEVICE, "--xid", "79")
    wait(
        lambda: device_health(pods_of(real_cluster, first)[0]) == "Unhealthy",
        60,
        "Unhealthy in the pod status",
    )
    (taint,) = wait(lambda: taints(fake_deployment), 30, "the device taint")
    assert (taint["key"], taint["effect"]) == (f"{DRIVER}/unhealthy", "NoSchedule")
    # The 1.36 kubelet opens the v1alpha1 stream whatever else is advertised (a 1.37 one opens v1).
    opened = [line for line in fake_deployment.all_logs().splitlines() if "health stream opened" in line]
    assert opened, "no health stream opened"
    assert all('"api": "v1alpha1"' in line for line in opened), opened

    real_cluster.kubectl("delete", "-f", "-", "--wait=true", stdin=yaml.safe_dump_all(first))
    wait_unprepared(fake_deployment)

    # While tainted the scheduler will not give gpu-3 to anyone; recovery frees it again.
    second = pinned_pod("pinned-b")
    real_cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(second))
    wait_pods(real_cluster, second, unschedulable, 15, "pinned-b held back by the taint")
    assert taints(fake_deployment)
    wait(lambda: not taints(fake_deployment), 80, "the taint to be removed after the quiet period")
    (pod,) = wait_pods(
        real_cluster, second, lambda p: p["status"].get("phase") == "Running", 120, "pinned-b Running"
    )
    assert device_health(pod) in {"Healthy", None}
    real_cluster.kubectl("delete", "-f", "-", "--wait=true", stdin=yaml.safe_dump_all(second))
    wait_unprepared(fake_deployment)
