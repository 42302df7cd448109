"""The chart with the real Helm: `helm lint --strict` and `helm template` for every documented
values combination (ci/*-values.yaml), what each value changes, and the one clear error a wrong
value gets (values.schema.json, `required` and `fail` in the templates).

deploy/'s kustomizations against the chart, field by field: test_parity.py.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path, PurePosixPath

import jsonschema
import pytest
import yaml

from dradriver.health.config import load_health_config
from tests.deploy.manifests import KUBERNETES_VERSIONS
from tests.deploy.test_render import assert_policy_constrains
from tests.deploy.test_schemas import validate
from tests.helm.chart import (
    CHART,
    CI_VALUES,
    Manifest,
    by_kind,
    env_of,
    helm,
    only,
    plugin_container,
    render,
    render_error,
    serve_args,
)

COMBINATIONS = [None, *CI_VALUES]
#: Kinds of the Prometheus Operator's CRDs: no schema in kubernetes-validate.
CRD_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


def combination_id(path: Path | None) -> str:
    return "defaults" if path is None else path.name.removesuffix("-values.yaml")


@functools.cache
def rendered(values: Path | None) -> list[Manifest]:
    """A combination's objects, `helm test` hooks included (rendered once per session)."""
    return render(None, *([values] if values else []), tests=True)


def values_file(name: str) -> Path:
    return CHART / "ci" / f"{name}-values.yaml"


def pod_spec(objects: list[Manifest]) -> Manifest:
    spec: Manifest = only(objects, "DaemonSet")["spec"]["template"]["spec"]
    return spec


def host_path(objects: list[Manifest], volume: str) -> str | None:
    volumes = {v["name"]: v for v in pod_spec(objects)["volumes"]}
    return str(volumes[volume]["hostPath"]["path"]) if volume in volumes else None


@pytest.mark.parametrize("values", COMBINATIONS, ids=combination_id)
def test_lint_strict_passes(values: Path | None) -> None:
    done = helm("lint", "--strict", str(CHART), *(["--values", str(values)] if values else []))
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_rendered_objects_are_valid(version: str) -> None:
    """Every object of every combination, once per shape: the same object with other labels
    or annotations is checked once (DeviceClasses: test_parity.py finds them equal to
    deviceclasses/, which test_schemas.py checks)."""
    distinct: dict[str, tuple[str, Manifest]] = {}
    for values in COMBINATIONS:
        for obj in rendered(values):
            if obj["kind"] not in CRD_KINDS | {"DeviceClass"}:
                meta = {k: v for k, v in obj["metadata"].items() if k not in {"labels", "annotations"}}
                shape = json.dumps(obj | {"metadata": meta}, sort_keys=True)
                distinct.setdefault(shape, (combination_id(values), obj))
    for origin, obj in distinct.values():
        validate(obj, version, f"chart ({origin})")


@pytest.mark.parametrize("values", COMBINATIONS, ids=combination_id)
def test_volumes_mounts_and_paths_agree(values: Path | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every mount has its volume, and serve is pointed where the kubelet's dirs, the CDI dir
    and the driver root are mounted (the same path inside and out for what the kubelet dials)."""
    objects = render(None, *([values] if values else []))
    spec = pod_spec(objects)
    mounts = {m["name"]: m["mountPath"] for m in plugin_container(objects)["volumeMounts"]}
    assert set(mounts) == {v["name"] for v in spec["volumes"]}
    args = serve_args(env_of(objects), monkeypatch)
    assert (
        mounts["plugins-registry"]
        == str(args["kubelet_registry_dir"])
        == host_path(objects, "plugins-registry")
    )
    plugin_dir = str(PurePosixPath(args["kubelet_plugins_dir"]) / args["driver_name"])
    assert mounts["plugin-data"] == plugin_dir == host_path(objects, "plugin-data")
    assert mounts["cdi"] == str(args["cdi_dir"]) == host_path(objects, "cdi")
    if args["fake_gpus"] is None:
        assert mounts["driver-root"] == str(args["driver_root_mount"])
        assert host_path(objects, "driver-root") == str(args["driver_root"])


@pytest.mark.parametrize(
    ("layout", "root"),
    [("host", "/"), ("gpu-operator", "/run/nvidia/driver"), ("gke", "/home/kubernetes/bin/nvidia")],
)
def test_layout_sets_the_driver_root(layout: str, root: str) -> None:
    objects = render({"hostDriver": {"layout": layout}})
    assert env_of(objects)["DRADRIVER_DRIVER_ROOT"] == root
    assert host_path(objects, "driver-root") == root
    assert plugin_container(objects)["securityContext"]["privileged"] is True
    terms = pod_spec(objects)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    keys = {e["key"] for term in terms["nodeSelectorTerms"] for e in term["matchExpressions"]}
    assert ("cloud.google.com/gke-accelerator" in keys) == (layout == "gke")


def test_root_replaces_the_layouts() -> None:
    objects = render(None, values_file("custom-paths"))
    assert env_of(objects)["DRADRIVER_DRIVER_ROOT"] == host_path(objects, "driver-root") == "/opt/nvidia"


def test_fake_layout_runs_unprivileged_on_every_node_without_host_paths() -> None:
    objects = render(None, values_file("fake"))
    env = env_of(objects)
    assert env["DRADRIVER_FAKE_GPUS"] == "t4x4"
    assert not {"DRADRIVER_DRIVER_ROOT", "DRADRIVER_DRIVER_ROOT_MOUNT", "DRADRIVER_HOST_DEV"} & set(env)
    assert host_path(objects, "driver-root") is None
    assert host_path(objects, "host-dev") is None
    context = plugin_container(objects)["securityContext"]
    assert context["privileged"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert "affinity" not in pod_spec(objects)


def test_all_options_reach_serve_and_the_objects(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    values = yaml.safe_load(values_file("all-options").read_text())
    objects = render(None, values_file("all-options"))
    args = serve_args(env_of(objects), monkeypatch)
    assert (args["log_format"], args["verbosity"], args["partitionable"]) == ("console", 4, True)
    assert args["gpu_shares"] == "mps:0,1"
    assert args["gpu_share_count"] == 8
    assert (args["rescan_interval"], args["stale_claim_grace"], args["shutdown_grace"]) == (60, 600, 15)
    assert args["metrics_tenant_labels"] is False
    assert args["telemetry_interval"] == 10
    assert (args["idle_threshold"], args["idle_window"]) == (5, 1800)
    assert args["require_admission_policy"] is True
    assert env_of(objects)["TZ"] == "UTC"
    assert plugin_container(objects)["image"] == (
        f"{values['image']['repository']}:{values['image']['tag']}@{values['image']['digest']}"
    )
    assert plugin_container(objects)["imagePullPolicy"] == "Always"
    assert pod_spec(objects)["imagePullSecrets"] == [{"name": "registry-credentials"}]
    assert pod_spec(objects)["nodeSelector"] == {"node-role.example.com/gpu": "true"}

    # The health policy: a ConfigMap mounted where --health-config looks, which serve accepts.
    [config_map] = [c for c in by_kind(objects, "ConfigMap") if c["metadata"]["name"].endswith("-health")]
    [mount] = [m for m in plugin_container(objects)["volumeMounts"] if m["name"] == "health-config"]
    assert str(args["health_config"]) == f"{mount['mountPath']}/health.yaml"
    health_file = tmp_path / "health.yaml"
    health_file.write_text(config_map["data"]["health.yaml"])
    assert load_health_config(health_file).taint_effect == "NoExecute"
    assert (
        "checksum/health-config" in only(objects, "DaemonSet")["spec"]["template"]["metadata"]["annotations"]
    )

    # Idle claims: Events in every namespace, as deploy/components/idle-events grants.
    assert any(r["metadata"]["name"].endswith("-idle-events") for r in by_kind(objects, "ClusterRoleBinding"))
    for obj in objects:
        assert obj["metadata"]["labels"]["team"] == "gpu-platform", obj["kind"]
        assert obj["metadata"]["annotations"]["owner"] == "gpu-platform@example.com", obj["kind"]
    assert only(objects, "ServiceMonitor")["metadata"]["labels"]["release"] == "prometheus"
    assert only(objects, "Service")["spec"]["clusterIP"] == "None"
    dashboard = next(c for c in by_kind(objects, "ConfigMap") if "dradriver.json" in c["data"])
    assert dashboard["metadata"]["namespace"] == "monitoring"
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_minimal_renders_the_plugin_and_its_access_only() -> None:
    kinds = sorted(o["kind"] for o in render(None, values_file("minimal"), tests=True))
    assert kinds == [
        "ClusterRole",
        "ClusterRoleBinding",
        "DaemonSet",
        "Role",
        "RoleBinding",
        "ServiceAccount",
    ]
    assert "priorityClassName" not in pod_spec(render(None, values_file("minimal")))


def test_driver_name_reaches_every_object_that_names_the_driver() -> None:
    name = "gpu.example.com"
    objects = render({"driverName": name, "claimConfigPolicy": {"enabled": True}}, tests=True)
    assert env_of(objects)["DRADRIVER_DRIVER_NAME"] == name
    assert host_path(objects, "plugin-data") == f"/var/lib/kubelet/plugins/{name}"
    classes = by_kind(objects, "DeviceClass")
    assert {c["metadata"]["name"] for c in classes} >= {name, f"mig.{name}", f"gpu-share.{name}"}
    for obj in classes + by_kind(objects, "ValidatingAdmissionPolicy"):
        text = yaml.safe_dump(obj)
        assert '"gpu.dradriver.dev"' not in text, obj["metadata"]["name"]
    # The opaque config's API version is the driver's own, whatever its name.
    assert "gpu.dradriver.dev/v1alpha1" in yaml.safe_dump(by_kind(objects, "ValidatingAdmissionPolicy"))
    claim_template = only(objects, "ResourceClaimTemplate")
    assert claim_template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == name


@pytest.mark.parametrize("values", [{"fullnameOverride": "acme"}, {"nameOverride": "gpus"}], ids=str)
def test_renamed_objects_still_refer_to_each_other(values: Manifest) -> None:
    """Another prefix for every name: the DaemonSet runs as the account its bindings name, and
    the admission policy constrains exactly that account."""
    objects = render(values)
    assert only(objects, "DaemonSet")["metadata"]["name"] != "dradriver-kubelet-plugin"
    assert_policy_constrains(tuple(objects))
    account = pod_spec(objects)["serviceAccountName"]
    assert only(objects, "ServiceAccount")["metadata"]["name"] == account
    assert only(objects, "RoleBinding")["subjects"][0]["name"] == account


def test_smoke_test_is_a_helm_test_hook_claiming_one_gpu() -> None:
    hooks = [o for o in render(tests=True) if o["kind"] in {"Pod", "ResourceClaimTemplate"}]
    assert {o["metadata"]["annotations"]["helm.sh/hook"] for o in hooks} == {"test"}
    pod = only(hooks, "Pod")
    [claim] = pod["spec"]["resourceClaims"]
    assert claim["resourceClaimTemplateName"] == only(hooks, "ResourceClaimTemplate")["metadata"]["name"]
    assert pod["spec"]["containers"][0]["resources"]["claims"] == [{"name": claim["name"]}]


@pytest.mark.parametrize(
    ("values", "field", "message"),
    [
        ({"serve": {"verbosity": "high"}}, "/serve/verbosity", "got string, want integer"),
        ({"serve": {"verbosity": 11}}, "/serve/verbosity", "maximum"),
        ({"hostDriver": {"layout": "gcp"}}, "/hostDriver/layout", "must be one of"),
        ({"image": {"digest": "0123abcd"}}, "/image/digest", "does not match pattern"),
        ({"image": {"pullPolicy": "always"}}, "/image/pullPolicy", "must be one of"),
        ({"driverName": "GPU.Example.com"}, "/driverName", "does not match pattern"),
        ({"serve": {"gpuShares": {"enforcement": "mig"}}}, "/serve/gpuShares/enforcement", "must be one of"),
        ({"serve": {"idleThreshold": 5}}, "/serve", "missing property 'idleWindow'"),
        (
            {"serve": {"idleThreshold": 5, "idleWindow": 60, "telemetryInterval": 0}},
            "/serve/telemetryInterval",
            "",
        ),
        ({"serve": {"rescanInterval": -1}}, "/serve/rescanInterval", "minimum"),
        ({"kubelet": {"rootDir": "var/lib/kubelet"}}, "/kubelet/rootDir", "does not match pattern"),
        ({"metrics": {"port": 0}}, "/metrics/port", "minimum"),
        ({"serve": {"partitonable": True}}, "/serve", "additional properties 'partitonable' not allowed"),
        ({"imageTag": "0.1.0"}, "", "additional properties 'imageTag' not allowed"),
        (
            {"serve": {"healthConfig": {"taintEffect": "Evict"}}},
            "/serve/healthConfig/taintEffect",
            "must be one of",
        ),
        (
            {"serve": {"healthConfig": {"quietPeriod": 60}}},
            "/serve/healthConfig",
            "additional properties 'quietPeriod' not allowed",
        ),
    ],
    ids=lambda v: str(v) if isinstance(v, str) else None,
)
def test_schema_refuses_a_wrong_value_naming_it(values: Manifest, field: str, message: str) -> None:
    failure = render_error(values)
    assert failure.code == 1
    assert "values don't meet the specifications of the schema" in failure.errors
    assert f"at '{field}'" in failure.errors, failure.errors
    assert message in failure.errors, failure.errors


def test_schema_holds_where_helm_keeps_the_defaults_nulls() -> None:
    """Helm 3 keeps a default's `null` (serve.idleThreshold, serve.idleWindow) as a key, Helm 4
    drops it: the idle pair's rule must hold either way (checked here by jsonschema, draft 7)."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    validator = jsonschema.Draft7Validator(schema)
    validator.validate(defaults)
    half = copy.deepcopy(defaults)
    half["serve"]["idleThreshold"] = 5
    with pytest.raises(jsonschema.ValidationError, match="None is not of type 'number'"):
        validator.validate(half)


def test_lint_strict_refuses_what_the_schema_refuses() -> None:
    done = helm("lint", "--strict", str(CHART), "--set", "serve.verbosity=high")
    assert done.returncode == 1
    assert "at '/serve/verbosity'" in done.stdout + done.stderr


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"hostDriver": {"layout": "fake"}, "fakeGpus": {"profile": ""}},
            "fakeGpus.profile: the fake layout needs a profile",
        ),
        (
            {"hostDriver": {"layout": "fake", "root": "/run/nvidia/driver"}},
            'hostDriver.root "/run/nvidia/driver": the fake layout has no host driver',
        ),
    ],
)
def test_template_refuses_what_only_a_combination_makes_wrong(values: Manifest, message: str) -> None:
    failure = render_error(values)
    assert failure.code == 1
    assert message in failure.errors, failure.errors
