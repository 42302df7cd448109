"""Against a real API server: it accepts everything we ship, and the admission policy holds.

Runs on the real cluster of the e2e harness (`real_cluster`: DRADRIVER_E2E_BIN or
DRADRIVER_E2E_KUBECONFIG, Kubernetes 1.34 or newer). Everything
we ship is applied with a server-side dry run, which runs the API server's full validation and
admission (CEL compilation of the policy and the selectors, name formats, the admin-access
namespace label, priority classes) without storing anything. Namespaces the dry run needs are
created for real and removed again; so are the RBAC and policy objects of the admission test,
which is skipped when dradriver is already installed on that cluster.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.deploy.manifests import (
    DEVICECLASSES,
    KUSTOMIZATIONS,
    Manifest,
    example_files,
    kubectl,
    load_documents,
    render,
)
from tests.e2e.realcluster import RealCluster

pytestmark = pytest.mark.cluster

MINIMUM_MINOR = 34
PLUGIN_USER = "system:serviceaccount:dradriver:dradriver-kubelet-plugin"
NODE_EXTRA = "authentication.kubernetes.io/node-name"
CLUSTER_SCOPED = {"Namespace", "DeviceClass"}


@dataclass
class Cluster:
    kubeconfig: str
    created: list[tuple[str, str]] = field(default_factory=list)

    def run(
        self, *args: str, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [kubectl(), "--kubeconfig", self.kubeconfig, "--request-timeout=30s", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )
        if check:
            assert result.returncode == 0, f"kubectl {' '.join(args)} failed:\n{result.stderr}"
        return result

    def exists(self, kind: str, name: str, namespace: str | None = None) -> bool:
        scope = ["-n", namespace] if namespace else []
        return self.run("get", kind, name, *scope, "--ignore-not-found", "-o", "name").stdout.strip() != ""

    def create(self, objects: list[Manifest]) -> None:
        """Create objects for real, remembering them for clean-up in reverse order."""
        self.run("create", "-f", "-", stdin=yaml.safe_dump_all(objects))
        for obj in objects:
            namespace = obj["metadata"].get("namespace")
            scope = f"-n={namespace}" if namespace else ""
            self.created.append((f"{obj['kind']}/{obj['metadata']['name']}", scope))

    def ensure_namespace(self, namespace: Manifest) -> None:
        """Create a namespace (with its labels) and its default service account, if missing.

        Pods are admitted only if their service account exists; a bare API server has no
        controller-manager to create "default".
        """
        name = namespace["metadata"]["name"]
        if not self.exists("namespace", name):
            self.create([namespace])
        if self.exists("serviceaccount", "default", name):
            return
        # A controller-manager may create it between the check and ours; the namespace's
        # deletion takes it along, so it is not remembered for clean-up.
        account = {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "default", "namespace": name},
        }
        result = self.run("create", "-f", "-", stdin=yaml.safe_dump(account), check=False)
        assert result.returncode == 0 or "AlreadyExists" in result.stderr, (
            f"kubectl create serviceaccount default -n {name} failed:\n{result.stderr}"
        )

    def dry_run_apply(
        self, objects: list[Manifest], namespace: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        scope = ["-n", namespace] if namespace else []
        apply = ["apply", "--server-side", "--dry-run=server", "--field-manager=dradriver-tests"]
        return self.run(*apply, *scope, "-f", "-", stdin=yaml.safe_dump_all(objects), check=False)

    def clean_up(self) -> None:
        """Delete what the tests created and wait until it is gone: a namespace still terminating
        refuses the next module's objects (the e2e DaemonSet's `dradriver` namespace)."""
        for ref, scope in reversed(self.created):
            self.run(
                "delete", ref, *([scope] if scope else []), "--ignore-not-found", "--wait=false", check=False
            )
        for ref, scope in reversed(self.created):
            self.run("wait", "--for=delete", ref, *([scope] if scope else []), "--timeout=80s", check=False)
        self.created.clear()


@pytest.fixture(scope="module")
def cluster(real_cluster: RealCluster) -> Iterator[Cluster]:
    found = Cluster(str(real_cluster.kubeconfig))
    version = json.loads(found.run("version", "-o", "json").stdout)["serverVersion"]
    minor = int("".join(ch for ch in version["minor"] if ch.isdigit()))
    if (int(version["major"]), minor) < (1, MINIMUM_MINOR):
        pytest.skip(
            f"API server is {version['gitVersion']}; dradriver needs Kubernetes 1.{MINIMUM_MINOR} or newer"
        )
    try:
        yield found
    finally:
        found.clean_up()


def namespaces_in(objects: list[Manifest]) -> list[Manifest]:
    return [o for o in objects if o["kind"] == "Namespace"]


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_server_accepts_deployment(cluster: Cluster, kustomization: str) -> None:
    objects = list(render(kustomization))
    for namespace in namespaces_in(objects):
        cluster.ensure_namespace(namespace)
    result = cluster.dry_run_apply(objects)
    assert result.returncode == 0, f"API server rejects deploy/{kustomization}:\n{result.stderr}"


def test_server_accepts_deviceclasses(cluster: Cluster) -> None:
    objects = [doc for path in sorted(DEVICECLASSES.glob("*.yaml")) for doc in load_documents(path)]
    result = cluster.dry_run_apply(objects)
    assert result.returncode == 0, f"API server rejects deviceclasses/:\n{result.stderr}"


@pytest.fixture(scope="module")
def example_namespace(cluster: Cluster) -> str:
    """A fresh namespace for the examples that do not name one."""
    name = f"dradriver-examples-{uuid.uuid4().hex[:8]}"
    cluster.ensure_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    return name


@pytest.mark.parametrize("path", example_files(), ids=lambda p: p.name)
def test_server_accepts_example(cluster: Cluster, example_namespace: str, path: Path) -> None:
    objects = load_documents(path)
    for namespace in namespaces_in(objects):
        cluster.ensure_namespace(namespace)
    for obj in objects:
        # kubectl refuses -n for files that also name a namespace, so place the others here.
        if obj["kind"] not in CLUSTER_SCOPED:
            obj["metadata"].setdefault("namespace", example_namespace)
    result = cluster.dry_run_apply(objects)
    assert result.returncode == 0, f"API server rejects {path.name}:\n{result.stderr}"


def resource_slice(node: str) -> Manifest:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"dradriver-test-{node}-{uuid.uuid4().hex[:6]}"},
        "spec": {
            "driver": "gpu.dradriver.dev",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [],
        },
    }


def as_plugin(node: str | None) -> list[str]:
    """kubectl flags impersonating the plugin's service account as its pod on `node` would be."""
    extra = [f"--as-user-extra={NODE_EXTRA}={node}"] if node else []
    return [f"--as={PLUGIN_USER}", *extra]


@pytest.fixture(scope="module")
def policy_installed(cluster: Cluster) -> Cluster:
    """The plugin's RBAC and admission policy, installed for real from deploy/base."""
    kinds = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy"}
    kinds |= {"ValidatingAdmissionPolicyBinding"}
    objects = [o for o in render("base") if o["kind"] in kinds | {"Namespace"}]
    for obj in objects:
        meta = obj["metadata"]
        if obj["kind"] in kinds and cluster.exists(obj["kind"], meta["name"], meta.get("namespace")):
            pytest.skip(
                f"dradriver is installed on this cluster ({obj['kind']} {meta['name']}); leaving it alone"
            )
    for namespace in namespaces_in(objects):
        cluster.ensure_namespace(namespace)
    cluster.create([o for o in objects if o["kind"] != "Namespace"])
    return cluster


def create_slice(cluster: Cluster, slice_: Manifest, *flags: str) -> subprocess.CompletedProcess[str]:
    return cluster.run(
        "create", "--dry-run=server", *flags, "-f", "-", stdin=yaml.safe_dump(slice_), check=False
    )


def test_plugin_writes_only_its_own_nodes_slices(policy_installed: Cluster) -> None:
    cluster = policy_installed
    foreign = resource_slice("node-b")
    # The policy takes effect once the API server's policy informer has seen it.
    deadline = time.monotonic() + 30
    while (denied := create_slice(cluster, foreign, *as_plugin("node-a"))).returncode == 0:
        assert time.monotonic() < deadline, "the plugin on node-a could create a slice of node-b"
        time.sleep(0.5)
    assert "may only write ResourceSlices with spec.nodeName 'node-a', not 'node-b'" in denied.stderr

    own = create_slice(cluster, resource_slice("node-a"), *as_plugin("node-a"))
    assert own.returncode == 0, own.stderr

    tokenless = create_slice(cluster, resource_slice("node-a"), *as_plugin(None))
    assert tokenless.returncode != 0
    assert f"token names no node (user extra {NODE_EXTRA})" in tokenless.stderr

    # Other users (here the test's admin) are not restricted by the policy.
    assert create_slice(cluster, foreign).returncode == 0


def test_plugin_deletes_only_its_own_nodes_slices(policy_installed: Cluster) -> None:
    """DELETE has no object, only oldObject: the policy must read the node from there."""
    cluster = policy_installed
    slice_ = resource_slice("node-b")
    cluster.create([slice_])
    ref = f"resourceslice/{slice_['metadata']['name']}"
    deadline = time.monotonic() + 30
    while (
        denied := cluster.run("delete", ref, "--dry-run=server", *as_plugin("node-a"), check=False)
    ).returncode == 0:
        assert time.monotonic() < deadline, "the plugin on node-a could delete a slice of node-b"
        time.sleep(0.5)
    assert "not 'node-b'" in denied.stderr
    allowed = cluster.run("delete", ref, "--dry-run=server", *as_plugin("node-b"), check=False)
    assert allowed.returncode == 0, allowed.stderr
