"""The plugin's own credentials on a real API server: RBAC gives it what it uses and nothing is
refused (no 403 in its log), and the admission policy keeps its token to its own node's slices;
the optional claim config policy refuses a hostile opaque config before it reaches a node."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.deploy.manifests import REPO
from tests.e2e.plugin import Deployment
from tests.e2e.realcluster import RealCluster
from tests.helpers import wait_for

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


CLAIM_CONFIG_POLICY = REPO / "deploy/components/claim-config-policy/claim-config-policy.yaml"


def claim_with_limit(limit: str) -> str:
    """A ResourceClaim whose opaque config for our driver sets `limit` as its pinned memory limit."""
    return json.dumps(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "e2e-claim-config-policy", "namespace": "default"},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.dradriver.dev"}}],
                    "config": [
                        {
                            "requests": ["gpu"],
                            "opaque": {
                                "driver": "gpu.dradriver.dev",
                                "parameters": {
                                    "apiVersion": "gpu.dradriver.dev/v1alpha1",
                                    "kind": "GpuConfig",
                                    "sharing": {
                                        "strategy": "MPS",
                                        "mps": {"defaultPinnedDeviceMemoryLimit": limit},
                                    },
                                },
                            },
                        }
                    ],
                }
            },
        }
    )


def test_the_optional_claim_config_policy_refuses_a_hostile_config_at_creation(
    real_cluster: RealCluster,
) -> None:
    def dry_run_create(limit: str) -> subprocess.CompletedProcess[str]:
        return real_cluster.kubectl(
            "create", "--dry-run=server", "-f", "-", stdin=claim_with_limit(limit), check=False
        )

    real_cluster.kubectl("apply", "-f", str(CLAIM_CONFIG_POLICY))
    try:
        # A new policy takes effect once the API server's informer has it: wait for the first refusal.
        wait_for(lambda: dry_run_create("1e-9999999").returncode != 0, 60, "the policy to refuse")
        hostile = dry_run_create("1e-9999999")
        assert "defaultPinnedDeviceMemoryLimit must be a quantity" in hostile.stderr, hostile.stderr
        assert "dradriver-claim-configs" in hostile.stderr, hostile.stderr
        good = dry_run_create("10Gi")
        assert good.returncode == 0, good.stderr
    finally:
        real_cluster.kubectl("delete", "--ignore-not-found", "-f", str(CLAIM_CONFIG_POLICY))
