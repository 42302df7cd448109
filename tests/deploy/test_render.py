"""`kubectl kustomize` renders every kustomization, and the rendered objects fit together.

Schema validity is test_schemas.py's job; these tests check what no schema can: that paths,
names and ports agree between objects, that each overlay changes what it claims to, and that
the plugin gets no more access than documented.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from urllib.parse import urlsplit

import pytest

from scripts.build_image import IMAGE_REPOSITORY, version
from tests.deploy.manifests import (
    KUSTOMIZATIONS,
    Manifest,
    container_env,
    one,
    plugin_container,
    render,
    render_overlay,
)

EXPECTED_OBJECTS = {
    ("Namespace", "dradriver"),
    ("ServiceAccount", "dradriver-kubelet-plugin"),
    ("ClusterRole", "dradriver-kubelet-plugin"),
    ("ClusterRoleBinding", "dradriver-kubelet-plugin"),
    ("Role", "dradriver-kubelet-plugin-events"),
    ("RoleBinding", "dradriver-kubelet-plugin-events"),
    ("ValidatingAdmissionPolicy", "dradriver-own-node-slices"),
    ("ValidatingAdmissionPolicyBinding", "dradriver-own-node-slices"),
    ("ResourceQuota", "dradriver-critical-pods"),
    ("DaemonSet", "dradriver-kubelet-plugin"),
    ("NetworkPolicy", "dradriver-kubelet-plugin-metrics"),
}

#: The plugin's whole API access: (api group, resource) -> verbs. Widening it is a decision
#: to document in deploy/base/rbac.yaml and docs/install.md, not something to slip in.
EXPECTED_RBAC = {
    ("resource.k8s.io", "resourceslices"): {"get", "list", "watch", "create", "update", "delete"},
    ("resource.k8s.io", "resourceclaims"): {"get"},
    ("", "nodes"): {"get"},
}
#: ... and in its own namespace only: Events about the Node.
EXPECTED_NAMESPACED_RBAC = {
    ("", "events"): {"create", "patch"},
    ("events.k8s.io", "events"): {"create", "patch"},
}


def daemonset_pod(objects: tuple[Manifest, ...]) -> Manifest:
    pod: Manifest = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    return pod


def host_paths(objects: tuple[Manifest, ...]) -> dict[str, str]:
    """Container mount path -> host path, for every hostPath volume the plugin mounts."""
    pod = daemonset_pod(objects)
    volumes = {v["name"]: v for v in pod["volumes"]}
    return {
        m["mountPath"]: volumes[m["name"]]["hostPath"]["path"]
        for m in plugin_container(objects)["volumeMounts"]
        if "hostPath" in volumes[m["name"]]
    }


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_renders_the_same_set_of_objects(kustomization: str) -> None:
    objects = render(kustomization)
    assert {(o["kind"], o["metadata"]["name"]) for o in objects} == EXPECTED_OBJECTS
    namespaced = [o for o in objects if "namespace" in o["metadata"]]
    # `default` holds the Events Role and its binding alone (where Node Events must be).
    events = {("Role", "dradriver-kubelet-plugin-events"), ("RoleBinding", "dradriver-kubelet-plugin-events")}
    assert {
        o["metadata"]["namespace"] for o in namespaced if (o["kind"], o["metadata"]["name"]) not in events
    } == {"dradriver"}


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_volumes_and_mounts_match(kustomization: str) -> None:
    objects = render(kustomization)
    volumes = {v["name"] for v in daemonset_pod(objects)["volumes"]}
    mounted = {m["name"] for m in plugin_container(objects)["volumeMounts"]}
    assert mounted == volumes, f"unmounted volumes {volumes - mounted}, dangling mounts {mounted - volumes}"


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_kubelet_and_cdi_dirs_have_the_same_path_inside_and_out(kustomization: str) -> None:
    """The kubelet dials the socket path serve reports, and runtimes read CDI specs from the
    host: these mounts must not be remapped, and must be where the env vars point serve."""
    objects = render(kustomization)
    env = container_env(plugin_container(objects))
    mounts = host_paths(objects)
    plugin_data = str(PurePosixPath(env["DRADRIVER_KUBELET_PLUGINS_DIR"]) / env["DRADRIVER_DRIVER_NAME"])
    for path in (env["DRADRIVER_KUBELET_REGISTRY_DIR"], plugin_data, env["DRADRIVER_CDI_DIR"]):
        assert mounts.get(path) == path, f"{path} is not mounted from the same host path"
    assert mounts[env["DRADRIVER_PROC_ROOT"]] == "/proc"  # processes map to pods in the host's view


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_identity_is_consistent(kustomization: str) -> None:
    """The admission policy matches the service account the DaemonSet actually runs as."""
    objects = render(kustomization)
    account = one(objects, "ServiceAccount")["metadata"]
    assert daemonset_pod(objects)["serviceAccountName"] == account["name"]
    subjects = one(objects, "ClusterRoleBinding")["subjects"]
    assert subjects == [
        {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
    ]
    assert (
        one(objects, "ClusterRoleBinding")["roleRef"]["name"]
        == one(objects, "ClusterRole")["metadata"]["name"]
    )
    role_binding = one(objects, "RoleBinding")
    assert role_binding["subjects"] == subjects
    assert role_binding["roleRef"]["name"] == one(objects, "Role")["metadata"]["name"]
    assert_policy_constrains(objects)


def assert_policy_constrains(objects: tuple[Manifest, ...]) -> None:
    """The policy's binding selects the ClusterRoleBinding that grants the DaemonSet's account its
    slice access, and the policy constrains exactly the accounts that binding names."""
    pod = daemonset_pod(objects)
    namespace = one(objects, "DaemonSet")["metadata"]["namespace"]
    username = f"system:serviceaccount:{namespace}:{pod['serviceAccountName']}"
    policy = one(objects, "ValidatingAdmissionPolicy")
    binding = one(objects, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert policy["spec"]["paramKind"] == {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
    }
    param_ref = binding["spec"]["paramRef"]
    assert set(param_ref) == {"selector", "parameterNotFoundAction"}  # by label: survives renames
    selected = [
        o
        for o in objects
        if o["kind"] == "ClusterRoleBinding"
        and param_ref["selector"]["matchLabels"].items() <= o["metadata"].get("labels", {}).items()
    ]
    assert len(selected) == 1, "the policy's parameter must be exactly one ClusterRoleBinding"
    [crb] = selected
    [role] = [
        o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"] == crb["roleRef"]["name"]
    ]
    assert any("resourceslices" in rule["resources"] and "create" in rule["verbs"] for rule in role["rules"])
    [condition] = policy["spec"]["matchConditions"]
    matched = [
        f"system:serviceaccount:{s['namespace']}:{s['name']}"
        for s in crb["subjects"]
        if s["kind"] == "ServiceAccount"
    ]
    assert matched == [username]
    # The condition compares the request's username with those subjects, as built here.
    assert 'params.subjects.exists(s, s.kind == "ServiceAccount"' in condition["expression"]
    assert '"system:serviceaccount:" + s.namespace + ":" + s.name' in condition["expression"]
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    driver = container_env(plugin_container(objects))["DRADRIVER_DRIVER_NAME"]
    assert variables["driver"] == f'"{driver}"'


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_admission_policy_guards_every_slice_write(kustomization: str) -> None:
    spec = one(render(kustomization), "ValidatingAdmissionPolicy")["spec"]
    assert spec["failurePolicy"] == "Fail"
    [rule] = spec["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == ["resource.k8s.io"]
    assert rule["resources"] == ["resourceslices"]
    assert set(rule["operations"]) == {"CREATE", "UPDATE", "DELETE"}
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    assert "authentication.kubernetes.io/node-name" in variables["callerNode"]
    assert "oldObject" in variables["slices"]  # DELETE has no object, only oldObject
    checks = " ".join(v["expression"] for v in spec["validations"])
    for pinned in ("variables.foreignNodes", "s.spec.driver == variables.driver", "s.spec.pool.name"):
        assert pinned in checks


def granted(role: Manifest) -> dict[tuple[str, str], set[str]]:
    verbs: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert "resourceNames" not in rule
        assert "nonResourceURLs" not in rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                verbs.setdefault((group, resource), set()).update(rule["verbs"])
    return verbs


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_rbac_is_exactly_what_the_code_uses(kustomization: str) -> None:
    objects = render(kustomization)
    assert granted(one(objects, "ClusterRole")) == EXPECTED_RBAC
    assert granted(one(objects, "Role")) == EXPECTED_NAMESPACED_RBAC


def test_an_operators_overlay_keeps_the_policy_on_its_account(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A `namespace:` and `namePrefix:` overlay of an operator's (plus the idle-events component):
    the policy follows the renamed account, and so does the Events RoleBinding's subject (the
    Role itself kustomize moves too: rbac.yaml says to patch it back to `default`)."""
    objects = render_overlay(
        tmp_path_factory,
        {
            "resources": ["overlays/fake"],
            "components": ["components/idle-events"],
            "namespace": "gpu-system",
            "namePrefix": "acme-",
        },
    )
    pod = daemonset_pod(objects)
    assert pod["serviceAccountName"] == "acme-dradriver-kubelet-plugin"
    assert one(objects, "RoleBinding")["subjects"] == [
        {"kind": "ServiceAccount", "name": "acme-dradriver-kubelet-plugin", "namespace": "gpu-system"}
    ]
    assert_policy_constrains(objects)
    idle = [o for o in objects if o["metadata"]["name"] == "acme-dradriver-kubelet-plugin-idle-events"]
    assert {o["kind"] for o in idle} == {"ClusterRole", "ClusterRoleBinding"}
    [idle_binding] = [o for o in idle if o["kind"] == "ClusterRoleBinding"]
    assert idle_binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "acme-dradriver-kubelet-plugin", "namespace": "gpu-system"}
    ]


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_node_events_may_be_written_where_the_api_server_keeps_them(kustomization: str) -> None:
    objects = render(kustomization)
    assert one(objects, "Role")["metadata"]["namespace"] == "default"
    assert one(objects, "RoleBinding")["metadata"]["namespace"] == "default"


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_the_token_is_short_lived_and_projected(kustomization: str) -> None:
    objects = render(kustomization)
    pod = daemonset_pod(objects)
    assert pod["automountServiceAccountToken"] is False
    [mount] = [
        m
        for m in plugin_container(objects)["volumeMounts"]
        if m["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount"
    ]
    assert mount["readOnly"] is True
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    sources = volume["projected"]["sources"]
    [token] = [s["serviceAccountToken"] for s in sources if "serviceAccountToken" in s]
    # 3607 is the one lifetime the API server stretches to a year; at most an hour otherwise.
    assert token == {"path": "token", "expirationSeconds": 3600}
    paths = {
        item["path"]
        for s in sources
        for part in s.values()
        if isinstance(part, dict)
        for item in part.get("items", [])
    }
    assert paths == {"ca.crt", "namespace"}


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_the_image_is_named_in_the_projects_registry(kustomization: str) -> None:
    image = plugin_container(render(kustomization))["image"]
    assert image == f"{IMAGE_REPOSITORY}:{version()}"
    assert not image.startswith("docker.io/")


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_probes_and_metrics_port_agree(kustomization: str) -> None:
    container = plugin_container(render(kustomization))
    env = container_env(container)
    metrics_port = int(urlsplit("//" + env["DRADRIVER_METRICS_ADDRESS"]).port or 0)
    [port] = container["ports"]
    assert port["containerPort"] == metrics_port
    readiness = container["readinessProbe"]["httpGet"]
    assert readiness["path"] == "/readyz"
    assert readiness["port"] in (port["name"], metrics_port)
    for probe in ("startupProbe", "livenessProbe"):
        assert container[probe]["exec"]["command"] == ["dradriver", "healthcheck"]
    assert container["command"] == ["dradriver"]
    assert container["args"] == ["serve"]


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_only_labelled_namespaces_reach_the_metrics_port(kustomization: str) -> None:
    """The NetworkPolicy selects the plugin's pods and lets in, on the metrics port only, pods of
    namespaces an admin labelled; nothing a tenant can set (its own pods' labels) opens it."""
    objects = render(kustomization)
    policy = one(objects, "NetworkPolicy")["spec"]
    pod_labels = one(objects, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["policyTypes"] == ["Ingress"]
    [rule] = policy["ingress"]
    [port] = plugin_container(objects)["ports"]
    assert rule["ports"] == [{"port": port["name"], "protocol": "TCP"}]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"metrics.dradriver.dev/scrape": "true"}}}]


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_instance_locks_the_same_host_directory(kustomization: str) -> None:
    """The node-wide instance lock works across DaemonSets only if all mount one host path."""
    objects = render(kustomization)
    lock_dir = container_env(plugin_container(objects))["DRADRIVER_NODE_LOCK_DIR"]
    assert host_paths(objects)[lock_dir] == "/run/dradriver"


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_scheduling_and_rollout(kustomization: str) -> None:
    objects = render(kustomization)
    daemonset = one(objects, "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-node-critical"
    quota_scope = one(objects, "ResourceQuota")["spec"]["scopeSelector"]["matchExpressions"]
    assert quota_scope == [
        {"operator": "In", "scopeName": "PriorityClass", "values": ["system-node-critical"]}
    ]
    assert {"operator": "Exists"} in pod["tolerations"]
    # Surge: the new pod (its sockets named by its pod UID) serves before the old one goes.
    rolling = daemonset["spec"]["updateStrategy"]["rollingUpdate"]
    assert rolling == {"maxUnavailable": 0, "maxSurge": 1}
    env = {e["name"]: e for e in plugin_container(objects)["env"]}
    assert env["DRADRIVER_POD_UID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    resources = plugin_container(objects)["resources"]
    assert set(resources["requests"]) == {"cpu", "memory"}
    assert set(resources["limits"]) == {"memory"}
    for host_namespace in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod.get(host_namespace), f"the plugin needs no {host_namespace}"


def test_base_reads_the_host_driver_with_nvml_privileges() -> None:
    objects = render("base")
    container = plugin_container(objects)
    env = container_env(container)
    assert container["securityContext"]["privileged"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert env["DRADRIVER_DRIVER_ROOT"] == "/"
    assert host_paths(objects)[env["DRADRIVER_DRIVER_ROOT_MOUNT"]] == env["DRADRIVER_DRIVER_ROOT"]
    [driver_mount] = [
        m for m in container["volumeMounts"] if m["mountPath"] == env["DRADRIVER_DRIVER_ROOT_MOUNT"]
    ]
    assert driver_mount["readOnly"] is True
    assert driver_mount["mountPropagation"] == "HostToContainer"
    assert "DRADRIVER_FAKE_GPUS" not in env
    terms = daemonset_pod(objects)["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    keys = {e["key"] for term in terms["nodeSelectorTerms"] for e in term["matchExpressions"]}
    assert keys == {
        "feature.node.kubernetes.io/pci-10de.present",
        "nvidia.com/gpu.present",
        "gpu.dradriver.dev/present",
    }


def test_fake_overlay_runs_unprivileged_without_a_driver() -> None:
    objects = render("overlays/fake")
    container = plugin_container(objects)
    env = container_env(container)
    assert env["DRADRIVER_FAKE_GPUS"] == "dgx-h100"
    assert "DRADRIVER_DRIVER_ROOT" not in env
    assert "DRADRIVER_DRIVER_ROOT_MOUNT" not in env
    security = container["securityContext"]
    assert security["privileged"] is False
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert "/" not in host_paths(objects).values()
    assert "affinity" not in daemonset_pod(objects)


def test_gpu_operator_overlay_reads_the_driver_container_root() -> None:
    objects = render("overlays/gpu-operator")
    container = plugin_container(objects)
    env = container_env(container)
    assert env["DRADRIVER_DRIVER_ROOT"] == "/run/nvidia/driver"
    assert host_paths(objects)[env["DRADRIVER_DRIVER_ROOT_MOUNT"]] == "/run/nvidia/driver"
    [volume] = [
        v
        for v in daemonset_pod(objects)["volumes"]
        if v.get("hostPath", {}).get("path") == "/run/nvidia/driver"
    ]
    assert volume["hostPath"]["type"] == "Directory"
    assert container["securityContext"]["privileged"] is True
    # A GPU client of the GPU operator: its driver manager flips this label to take the plugin off.
    assert daemonset_pod(objects)["nodeSelector"] == {"nvidia.com/gpu.deploy.client": "true"}
    assert "nodeSelector" not in daemonset_pod(render("base"))
    # Everything else is the base unchanged.
    base_env = container_env(plugin_container(render("base")))
    assert {k: v for k, v in env.items() if k != "DRADRIVER_DRIVER_ROOT"} == {
        k: v for k, v in base_env.items() if k != "DRADRIVER_DRIVER_ROOT"
    }
