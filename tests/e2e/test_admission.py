"""The plugin's own credentials on a real API server: RBAC gives it what it uses and nothing is
refused (no 403 in its log), and the admission policy keeps its token to its own node's slices;
the optional claim config policy refuses a hostile opaque config before it reaches a node."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dradriver.kube import ApiError, KubeClient, load_client
from dradriver.publish.admission import probe
from tests.deploy.manifests import REPO, one, render
from tests.e2e.plugin import DRIVER, Deployment, wait
from tests.e2e.realcluster import RealCluster
from tests.helpers import ServeProcess, short_tmpdir, wait_for

pytestmark = pytest.mark.cluster

#: Run inside the plugin container with its service account token (in-cluster config); a dry
#: run, so that the plugin's own controller never sees the slice.
CREATE_SLICE = """
import json, sys
from dradriver.kube import KubeError, load_client
node, driver = sys.argv[1], sys.argv[2]
body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"generateName": "e2e-admission-"},
        "spec": {"driver": driver, "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "d0"}]}}
try:
    created = load_client().request(
        "POST", "/apis/resource.k8s.io/v1/resourceslices", query=[("dryRun", "All")], body=body
    )
    print(json.dumps({"created": created["metadata"]["name"]}))
except KubeError as err:
    print(json.dumps({"error": str(err)}))
"""


def create_as_plugin(deployment: Deployment, node: str) -> dict[str, str]:
    result: dict[str, str] = json.loads(deployment.exec("python", "-c", CREATE_SLICE, node, DRIVER))
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
    assert "admission policy keeps this node's token to its own ResourceSlices" in fake_deployment.all_logs()

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


# -- the policy as rendered, against a node's token, without the plugin's image -------------------

#: A Node object of the tests' own (no kubelet behind it): the node a token is bound to.
TOKEN_NODE = "dradriver-e2e-admission-node"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


@dataclass
class NodeToken:
    """A kubeconfig holding the plugin account's token bound to a pod on TOKEN_NODE."""

    kubeconfig: Path
    client: KubeClient
    policy_binding: dict[str, Any]


@pytest.fixture(scope="module")
def node_token(real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeToken]:
    """The fake overlay's account, RBAC and admission policy (not its DaemonSet), and a token of
    that account bound to a pod on TOKEN_NODE, as the kubelet gives the plugin's pod."""
    objects = [o for o in render("overlays/fake") if o["kind"] != "DaemonSet"]
    account = one(objects, "ServiceAccount")["metadata"]
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "dradriver-e2e-token-holder", "namespace": account["namespace"]},
        "spec": {
            "nodeName": TOKEN_NODE,
            "serviceAccountName": account["name"],
            "containers": [{"name": "c", "image": "dradriver-e2e-never-runs"}],
        },
    }
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": TOKEN_NODE}}
    documents = yaml.safe_dump_all([*objects, node, pod])
    real_cluster.kubectl("apply", "-f", "-", stdin=documents)
    try:
        token = real_cluster.kubectl(
            "-n", account["namespace"], "create", "token", account["name"],
            "--bound-object-kind", "Pod", "--bound-object-name", pod["metadata"]["name"], "--duration", "15m",
        ).stdout.strip()  # fmt: skip
        config = yaml.safe_load(real_cluster.kubeconfig.read_text())
        config["users"] = [{"name": "plugin", "user": {"token": token}}]
        for context in config["contexts"]:
            context["context"]["user"] = "plugin"
        kubeconfig = tmp_path_factory.mktemp("token") / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump(config))
        client = load_client(str(kubeconfig))
        assert client is not None
        binding = one(objects, "ValidatingAdmissionPolicyBinding")
        # The policy takes a moment to load after an install.
        wait(lambda: probe(client, DRIVER).outcome == "enforced", 30, "the policy in force")
        yield NodeToken(kubeconfig, client, binding)
    finally:
        real_cluster.kubectl("delete", "-f", "-", "--ignore-not-found", "--wait=false", stdin=documents)


def slice_for(node: str, *, driver: str = DRIVER, pool: str | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": "e2e-admission-"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": pool or node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "d0"}],
        },
    }


def refusal(client: KubeClient, method: str, path: str, body: dict[str, Any] | None = None) -> str:
    with pytest.raises(ApiError) as refused:
        client.request(method, path, body=body)
    return refused.value.message


def test_a_nodes_token_writes_only_its_own_nodes_pool_of_this_driver(
    real_cluster: RealCluster, node_token: NodeToken
) -> None:
    client = node_token.client
    own = client.create_resource_slice(slice_for(TOKEN_NODE))
    client.delete_resource_slice(own["metadata"]["name"])

    prefix = f"the dradriver kubelet plugin on node '{TOKEN_NODE}' may only write ResourceSlices"
    assert f"{prefix} with spec.nodeName '{TOKEN_NODE}', not 'other-node'" in refusal(
        client, "POST", SLICES, slice_for("other-node")
    )
    assert "may only write ResourceSlices of driver " + DRIVER in refusal(
        client, "POST", SLICES, slice_for(TOKEN_NODE, driver="other.example.com")
    )
    assert f"{prefix} of pool '{TOKEN_NODE}'" in refusal(
        client, "POST", SLICES, slice_for(TOKEN_NODE, pool="other-node")
    )

    # Another node's slice, written by someone else, cannot be changed or deleted either.
    admin = real_cluster.client()
    theirs = admin.create_resource_slice(slice_for("other-node"))
    try:
        name = theirs["metadata"]["name"]
        assert "not 'other-node'" in refusal(client, "PUT", f"{SLICES}/{name}", theirs)
        assert "not 'other-node'" in refusal(client, "DELETE", f"{SLICES}/{name}")
    finally:
        admin.delete_resource_slice(theirs["metadata"]["name"])


def test_serve_detects_at_start_that_the_policy_is_missing(
    real_cluster: RealCluster, node_token: NodeToken
) -> None:
    binding = node_token.policy_binding
    real_cluster.kubectl("delete", "validatingadmissionpolicybinding", binding["metadata"]["name"])
    try:
        wait(lambda: probe(node_token.client, DRIVER).outcome == "not-enforced", 30, "the policy gone")
        with short_tmpdir() as root:
            serve = ServeProcess(
                root,
                [
                    "--kubeconfig",
                    str(node_token.kubeconfig),
                    "--node-name",
                    TOKEN_NODE,
                    "--require-admission-policy",
                ],
                {"DRADRIVER_DRIVER_NAME": DRIVER},
                DRIVER,
                claims_from_files=False,
            ).start()
            try:
                assert serve.proc is not None
                assert serve.proc.wait(60) == 1, serve.log()
                assert "the ResourceSlice admission policy is not in force" in serve.log()
            finally:
                serve.kill()
    finally:
        real_cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(binding))
    wait(lambda: probe(node_token.client, DRIVER).outcome == "enforced", 30, "the policy back")
