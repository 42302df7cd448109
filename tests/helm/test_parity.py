"""The chart against deploy/'s kustomizations, field by field: rendered with the values that
correspond to a kustomization (a release named dradriver in namespace dradriver), it renders the
same objects with the same fields. The differences, each a documented value or Helm's own:

- Helm's labels on every object (app.kubernetes.io/managed-by, instance, version, helm.sh/chart);
- the Namespace only with namespace.create (Helm installs into an existing namespace);
- the DeviceClasses (deviceClasses.enabled; `kubectl apply -f deviceclasses/` otherwise), equal
  to deviceclasses/ but for the labels every chart object carries;
- `dradriver serve` switches the chart sets explicitly (serve.*), each at serve's own default;
- the objects of deploy/components carry the chart's app.kubernetes.io/part-of label too.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from tests.deploy import manifests
from tests.helm.chart import Manifest, by_kind, render, serve_args

#: Labels Helm's conventions add to every object of the chart.
HELM_LABELS = frozenset(
    {
        "app.kubernetes.io/managed-by",
        "app.kubernetes.io/instance",
        "app.kubernetes.io/version",
        "helm.sh/chart",
    }
)
#: Kustomization -> the values that render it.
EQUIVALENTS: dict[str, dict[str, Any]] = {
    "base": {},
    "overlays/fake": {"hostDriver": {"layout": "fake"}},
    "overlays/gpu-operator": {"hostDriver": {"layout": "gpu-operator"}},
}
#: The opt-in components of deploy/components and the values that turn them on.
COMPONENTS: dict[str, dict[str, Any]] = {
    "components/idle-events": {"serve": {"idleThreshold": 5, "idleWindow": 600}},
    "components/claim-config-policy": {"claimConfigPolicy": {"enabled": True}},
}

Key = tuple[str, str, str | None]


def key(obj: Manifest) -> Key:
    return obj["kind"], obj["metadata"]["name"], obj["metadata"].get("namespace")


def by_key(objects: tuple[Manifest, ...] | list[Manifest]) -> dict[Key, Manifest]:
    return {key(o): o for o in objects}


def without_labels(obj: Manifest, labels: frozenset[str] | None = None) -> Manifest:
    """`obj` without these labels (default: all of them)."""
    obj = copy.deepcopy(obj)
    meta = obj["metadata"]
    kept = {k: v for k, v in meta.pop("labels", {}).items() if labels is not None and k not in labels}
    if kept:
        meta["labels"] = kept
    return obj


def differences(chart: Any, kustomize: Any, path: str = "") -> Iterator[str]:
    """The paths where two objects differ, with both values."""
    if isinstance(chart, dict) and isinstance(kustomize, dict):
        for field in sorted(chart.keys() | kustomize.keys()):
            yield from differences(chart.get(field), kustomize.get(field), f"{path}.{field}")
    elif isinstance(chart, list) and isinstance(kustomize, list) and len(chart) == len(kustomize):
        for i, (a, b) in enumerate(zip(chart, kustomize, strict=True)):
            yield from differences(a, b, f"{path}[{i}]")
    elif chart != kustomize:
        yield f"{path}: chart {chart!r}, kustomize {kustomize!r}"


def leaves(value: Any) -> int:
    if isinstance(value, dict):
        return sum(leaves(v) for v in value.values())
    if isinstance(value, list):
        return sum(leaves(v) for v in value)
    return 1


def env_by_name(daemonset: Manifest) -> dict[str, Manifest]:
    [container] = daemonset["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e for e in container["env"]}


def in_name_order(daemonset: Manifest, env: dict[str, Manifest]) -> None:
    """Env and volumes in name order: a strategic-merge patch moves what it adds or changes
    (the fake overlay's variable, the gpu-operator overlay's volume) to the front."""
    pod = daemonset["spec"]["template"]["spec"]
    pod["containers"][0]["env"] = [env[name] for name in sorted(env)]
    pod["volumes"] = sorted(pod["volumes"], key=lambda volume: str(volume["name"]))


def explicit_defaults(chart: Manifest, kustomize: Manifest, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Drop from the chart's DaemonSet (in place) the env vars that only it sets, after checking
    that `dradriver serve` reads each as its default; both end up in_name_order."""
    chart_env, kustomize_env = env_by_name(chart), env_by_name(kustomize)
    extra = sorted(chart_env.keys() - kustomize_env.keys())
    plain = {name: e["value"] for name, e in kustomize_env.items() if "value" in e}
    with_extra = plain | {name: chart_env[name]["value"] for name in extra}
    assert serve_args(with_extra, monkeypatch) == serve_args(plain, monkeypatch), (
        f"the chart's {extra} are not all serve's defaults"
    )
    in_name_order(chart, {name: e for name, e in chart_env.items() if name not in extra})
    in_name_order(kustomize, kustomize_env)
    return extra


@pytest.mark.parametrize("kustomization", list(EQUIVALENTS))
def test_chart_renders_the_kustomization_field_by_field(
    kustomization: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    kustomize = by_key(manifests.render(kustomization))
    chart = by_key(render(EQUIVALENTS[kustomization]))
    assert kustomize.pop(("Namespace", "dradriver", None))  # namespace.create: test below
    for class_key in [k for k in chart if k[0] == "DeviceClass"]:  # deviceClasses.enabled: below
        del chart[class_key]
    assert sorted(chart) == sorted(kustomize)

    fields = 0
    explicit: list[str] = []
    for object_key, expected in kustomize.items():
        ours, theirs = without_labels(chart[object_key], HELM_LABELS), copy.deepcopy(expected)
        if object_key[0] == "DaemonSet":
            explicit = explicit_defaults(ours, theirs, monkeypatch)
        found = list(differences(ours, theirs))
        assert found == [], f"{object_key}:\n" + "\n".join(found)
        fields += leaves(theirs)
    print(
        f"chart vs deploy/{kustomization}: {len(kustomize)} objects, {fields} fields equal; the chart "
        f"adds Helm's 4 labels, the DeviceClasses and serve's defaults {explicit}"
    )


def test_namespace_create_renders_the_kustomizations_namespace() -> None:
    [ours] = by_kind(render({"namespace": {"create": True}}), "Namespace")
    [theirs] = [o for o in manifests.render("base") if o["kind"] == "Namespace"]
    assert list(differences(without_labels(ours, HELM_LABELS), theirs)) == []


def test_device_classes_are_deviceclasses_directory() -> None:
    ours = {o["metadata"]["name"]: without_labels(o) for o in by_kind(render(), "DeviceClass")}
    assert ours == manifests.deviceclasses()


def test_optional_device_classes_add_the_optional_directory() -> None:
    """deviceClasses.optional: `kubectl apply -f deviceclasses/optional/` as well."""
    rendered = by_kind(render({"deviceClasses": {"optional": True}}), "DeviceClass")
    ours = {o["metadata"]["name"]: without_labels(o) for o in rendered}
    assert len(ours) == len(rendered)
    assert ours == manifests.deviceclasses() | manifests.deviceclasses(manifests.OPTIONAL_DEVICECLASSES_DIR)


@pytest.mark.parametrize("component", list(COMPONENTS))
def test_component_values_render_the_components_objects(
    component: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    base = by_key(manifests.render("base"))
    overlay = manifests.render_overlay(tmp_path_factory, {"resources": ["base"], "components": [component]})
    added = {k: o for k, o in by_key(overlay).items() if k not in base}
    assert added, f"deploy/{component} adds nothing"
    chart = by_key(render(COMPONENTS[component]))
    for object_key, expected in added.items():
        assert object_key in chart, f"the chart with {COMPONENTS[component]} lacks {object_key}"
        # deploy/'s part-of label is the base kustomization's: a component's objects lack it.
        ours = without_labels(chart[object_key], HELM_LABELS | {"app.kubernetes.io/part-of"})
        found = list(differences(ours, expected))
        assert found == [], f"{object_key}:\n" + "\n".join(found)
