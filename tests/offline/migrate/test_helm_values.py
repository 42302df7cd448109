"""`dradriver migrate` of a values file written for NVIDIA's DRA driver Helm chart: the values of
dradriver's chart it becomes, a comment per NVIDIA value, and one line per value that has no
equivalent (exit 2, nothing written). Fixtures: hand-written values files in nvidia-helm-values/
using the values NVIDIA's chart documents."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from pydantic import BaseModel

from dradriver.cli import main
from dradriver.offline.migrate.helm import _RULES, OUR_DEFAULTS, NvidiaValues, migrate_values

FIXTURES = Path(__file__).parent / "nvidia-helm-values"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["migrate", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_gpu_operator_values_become_ours_with_a_comment_per_value(capsys: pytest.CaptureFixture[str]) -> None:
    path = FIXTURES / "gpu-operator.yaml"
    code, out, err = run(capsys, str(path))
    assert code == 0, err
    assert err == "1 object(s) in 1 file(s): 1 migrated\n"
    assert yaml.safe_load(out) == {
        "hostDriver": {"layout": "gpu-operator"},
        "imagePullSecrets": [{"name": "regcred"}],
        "image": {"pullPolicy": "IfNotPresent"},
        "serve": {"partitionable": True, "verbosity": 2},
        "claimConfigPolicy": {"enabled": True},
        "nodeSelector": {"node-role.example.com/gpu": "true"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "resources": {"limits": {"memory": "1Gi"}},
    }
    comments = [line for line in out.splitlines() if line.startswith("#   ")]
    # Every value of the file is explained, in the file's order.
    given = [
        "nvidiaDriverRoot",
        "gpuResourcesEnabledOverride",
        "imagePullSecrets",
        "image.repository",
        "image.tag",
        "image.pullPolicy",
        "resources.gpus.enabled",
        "resources.computeDomains.enabled",
        "featureGates.DynamicMIG",
        "featureGates.NVMLDeviceHealthCheck",
        "featureGates.ContextualLogging",
        "logVerbosity",
        "webhook.enabled",
        "webhook.failurePolicy",
        "webhook.tls",
        "kubeletPlugin.priorityClassName",
        "kubeletPlugin.nodeSelector",
        "kubeletPlugin.tolerations",
        "kubeletPlugin.kubeletRegistrarDirectoryPath",
        "kubeletPlugin.kubeletPluginsDirectoryPath",
        "kubeletPlugin.containers.gpus.securityContext",
        "kubeletPlugin.containers.gpus.resources",
        "kubeletPlugin.containers.gpus.healthcheckPort",
    ]
    assert [c.split(":")[0].strip("# ") for c in comments] == given
    assert comments[0] == (
        "#   nvidiaDriverRoot: /run/nvidia/driver -> hostDriver.layout: gpu-operator (the GPU operator's "
        "driver container; the plugin also leaves the node while the operator upgrades the host driver: "
        "hostDriver.gpuOperatorClient)"
    )
    assert "#   logVerbosity: 2 -> serve.verbosity: 2 (the same scale" in out
    assert "(same meaning; the default of dradriver's chart, not written)" in out


def test_values_without_an_equivalent_are_refused_one_line_each(capsys: pytest.CaptureFixture[str]) -> None:
    path = FIXTURES / "compute-domains.yaml"
    code, out, err = run(capsys, str(path))
    assert code == 2
    assert out == f"# dradriver migrate: {path}: not migrated: it has problems (listed on stderr)\n"
    prefix = f"{path}:1: Helm values of NVIDIA's DRA driver chart: "
    lines = err.splitlines()
    assert [line.removeprefix(prefix).split(":")[0] for line in lines[:-1]] == [
        "namespaceOverride",
        "resources.computeDomains.imex",
        "featureGates.PassthroughSupport",
        "featureGates.IMEXDaemonsWithDNSNames",
        "controller",
        "kubeletPlugin.containers.gpus.env[0]",
        "kubeletPlugin.tolerationz",
    ]
    assert all(line.startswith(prefix) for line in lines[:-1])
    assert lines[-1] == "1 object(s) in 1 file(s): 1 failed; 1 file(s) not written, see the problems above"
    assert (
        f"{prefix}resources.computeDomains.imex: ComputeDomains (multi-node NVLink/IMEX) have no equivalent "
        "in dradriver; set resources.computeDomains.enabled: false if this cluster does not use them"
    ) in lines
    assert (
        f"{prefix}kubeletPlugin.tolerationz: not a value of NVIDIA's chart that migrate knows (a typo, or a "
        "newer chart): no equivalent known"
    ) in lines


def test_shares_kubelet_root_and_json_report(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = FIXTURES / "shares-gke.yaml"
    code, out, _ = run(capsys, str(path), "-o", "json")
    assert code == 0
    (entry,) = json.loads(out)["files"][0]["objects"]
    assert entry["object"] == "Helm values of NVIDIA's DRA driver chart"
    assert entry["outputs"] == [
        {
            "hostDriver": {"layout": "gke"},
            "serve": {"gpuShares": {"enforcement": "unenforced", "count": 8}},
            "metrics": {"port": 9400, "networkPolicy": {"enabled": False}},
            "updateStrategy": {"type": "OnDelete"},
            "kubelet": {"rootDir": "/data/kubelet"},
        }
    ]
    moved = {(c["path"], c.get("toPath")) for c in entry["changes"]}
    assert ("consumableShares", "serve.gpuShares.count") in moved
    assert ("kubeletPlugin.kubeletPluginsDirectoryPath", "kubelet.rootDir") in moved
    # --output-dir writes the values file under the input's name.
    assert main(["migrate", str(path), "--output-dir", str(tmp_path)]) == 0
    assert yaml.safe_load((tmp_path / "shares-gke.yaml").read_text()) == entry["outputs"][0]


@pytest.mark.parametrize(
    ("values", "problems"),
    [
        ({"logVerbosity": "loud"}, ["logVerbosity: Input should be a valid integer"]),
        (
            {"featureGates": {"DynamicMIG": "maybe"}},
            ["featureGates.DynamicMIG: Input should be a valid boolean"],
        ),
        (
            {"consumableShares": "unlimited"},
            ["consumableShares: unlimited consumable shares have no equivalent"],
        ),
        (
            {"featureGates": {"ConsumableShares": True}},
            ["featureGates.ConsumableShares: consumable shares need"],
        ),
        (
            {"resourceApiVersion": "resource.k8s.io/v1beta1"},
            ["resourceApiVersion: resource.k8s.io/v1beta1: "],
        ),
        (
            {
                "kubeletPlugin": {
                    "kubeletRegistrarDirectoryPath": "/a/plugins_registry",
                    "kubeletPluginsDirectoryPath": "/b/plugins",
                }
            },
            ["kubeletPlugin.kubeletPluginsDirectoryPath: gives kubelet.rootDir '/b', but "],
        ),
        ({"featureGates": {"SomethingNew": True}}, ["featureGates.SomethingNew: a feature gate of NVIDIA's"]),
        ({"nvidiaDriverRoot": "/opt/nvidia", "webhook": {"enabled": "yes please"}}, ["webhook.enabled: "]),
    ],
)
def test_bad_or_unmatched_values_are_problems_naming_the_value(
    values: dict[str, Any], problems: list[str]
) -> None:
    migration = migrate_values(values)
    assert migration.outputs == []
    found = [f"{p.path}: {p.message}" for p in migration.problems]
    assert len(found) == len(problems), found
    for line, start in zip(found, problems, strict=True):
        assert line.startswith(start), line


def test_a_driver_root_of_its_own_and_another_driver_name() -> None:
    migration = migrate_values(
        {"nvidiaDriverRoot": "/opt/nvidia/", "logVerbosity": 0}, driver="gpu.example.com"
    )
    assert migration.problems == []
    assert migration.outputs == [{"driverName": "gpu.example.com", "hostDriver": {"root": "/opt/nvidia"}}]


def test_every_value_of_nvidias_chart_has_a_rule() -> None:
    """A key the model knows either has a rule or is a part whose keys have rules."""

    def leaves(model: type[BaseModel], prefix: str) -> list[str]:
        found = []
        for name, info in model.model_fields.items():
            path = prefix + (info.alias or name)
            part = next(
                (
                    a
                    for a in getattr(info.annotation, "__args__", ())
                    if isinstance(a, type) and issubclass(a, BaseModel)
                ),
                None,
            )
            found += leaves(part, f"{path}.") if part is not None and path not in _RULES else [path]
        return found

    assert [path for path in leaves(NvidiaValues, "") if path not in _RULES] == []


CHART = Path(__file__).resolve().parents[3] / "deploy" / "helm" / "dradriver"


def _merged(defaults: Any, given: Any) -> Any:
    """`given` over `defaults` as Helm merges a values file into the chart's values."""
    if isinstance(defaults, dict) and isinstance(given, dict):
        return {k: _merged(defaults.get(k), given[k]) if k in given else v for k, v in defaults.items()} | {
            k: v for k, v in given.items() if k not in defaults
        }
    return given


def test_migrated_values_are_valid_values_of_our_chart() -> None:
    """Each fixture's output, over the chart's values.yaml, satisfies its values.schema.json; the
    defaults migrate leaves out are the chart's."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    for path in sorted(FIXTURES.glob("*.yaml")):
        migration = migrate_values(yaml.safe_load(path.read_text()))
        for values in migration.outputs:
            jsonschema.validate(_merged(defaults, values), schema)
    for dotted, value in OUR_DEFAULTS.items():
        node = defaults
        for part in dotted.split("."):
            node = node[part]
        assert node == value, dotted
