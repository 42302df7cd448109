"""The plugin's own credentials on a real API server: RBAC gives it what it uses and nothing is
refused (no 403 in its log), and the admission policy keeps its token to its own node's slices."""

from __future__ import annotations

import json

import pytest

from tests.e2e.plugin import Deployment
from tests.e2e.realcluster import RealCluster

pytestmark = pytest.mark.cluster

#: Run inside the plugin container with its service account token (in-cluster config).
CREATE_SLICE = """
import json, sys
from dradriver.kube import KubeError, load_client
node = sys.argv[1]
body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"generateName": "e2e-admission-"},
        "spec": {"driver": "e2e.admission.example.com", "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "d0"}]}}
try:
    created = load_client().request("POST", "/apis/resource.k8s.io/v1/resourceslices", body=body)
    print(json.dumps({"created": created["metadata"]["name"]}))
except KubeError as err:
    print(json.dumps({"error": str(err)}))
"""


def create_as_plugin(deployment: Deployment, node: str) -> dict[str, str]:
    result: dict[str, str] = json.loads(deployment.exec("python", "-c", CREATE_SLICE, node))
    return result


def test_policy_keeps_the_plugin_to_its_own_node(
    real_cluster: RealCluster, fake_deployment: Deployment
) -> None:
    node = real_cluster.node_name
    foreign = create_as_plugin(fake_deployment, "some-other-node")
    assert "error" in foreign, foreign
    assert (
        f"may only write ResourceSlices with spec.nodeName '{node}', not 'some-other-node'"
        in foreign["error"]
    )

    own = create_as_plugin(fake_deployment, node)
    assert "created" in own, own
    real_cluster.kubectl("delete", "resourceslice", own["created"])

    logs = fake_deployment.all_logs()
    assert " 403" not in logs
    assert "Forbidden" not in logs
