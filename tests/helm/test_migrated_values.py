"""Values `dradriver migrate` wrote from NVIDIA's chart's values install with the real Helm: the
chart renders them, and the plugin gets what NVIDIA's values asked for."""

from __future__ import annotations

from pathlib import Path

import yaml

from dradriver.offline.migrate.helm import migrate_values
from tests.helm.chart import env_of, only, render

NVIDIA_VALUES = Path(__file__).resolve().parents[1] / "offline" / "migrate" / "nvidia-helm-values"


def test_migrated_gpu_operator_values_render(tmp_path: Path) -> None:
    (values,) = migrate_values(yaml.safe_load((NVIDIA_VALUES / "gpu-operator.yaml").read_text())).outputs
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    objects = render(None, path)
    env = env_of(objects)
    assert env["DRADRIVER_DRIVER_ROOT"] == "/run/nvidia/driver"
    assert env["DRADRIVER_PARTITIONABLE"] == "true"
    pod = only(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {
        "node-role.example.com/gpu": "true",
        "nvidia.com/gpu.deploy.client": "true",
    }
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    # NVIDIA's webhook.enabled: the claim-config policy.
    policies = {o["metadata"]["name"] for o in objects if o["kind"] == "ValidatingAdmissionPolicy"}
    assert "dradriver-claim-configs" in policies
