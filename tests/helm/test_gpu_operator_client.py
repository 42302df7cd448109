"""hostDriver.gpuOperatorClient: the plugin as a GPU client of the NVIDIA GPU operator, whose
driver manager takes it off a node by the nodeSelector nvidia.com/gpu.deploy.client before it
unloads the host driver (docs/gpu-operator.md; on a real cluster: tests/e2e/test_deploy_paths.py).
With the gpu-operator layout, the chart and deploy/overlays/gpu-operator agree (test_parity.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helm.chart import only, render, render_error

CLIENT = {"nvidia.com/gpu.deploy.client": "true"}


@pytest.mark.parametrize(
    ("values", "selector"),
    [
        ({}, None),
        ({"hostDriver": {"layout": "gpu-operator"}}, CLIENT),
        ({"hostDriver": {"layout": "gpu-operator", "gpuOperatorClient": False}}, None),
        (
            {"hostDriver": {"gpuOperatorClient": True}, "nodeSelector": {"pool": "gpu"}},
            {"pool": "gpu"} | CLIENT,
        ),
    ],
    ids=["host", "gpu-operator", "turned-off", "turned-on-with-host"],
)
def test_the_gpu_client_label_follows_the_layout_unless_set(
    values: dict[str, Any], selector: dict[str, str] | None
) -> None:
    pod = only(render(values), "DaemonSet")["spec"]["template"]["spec"]
    assert pod.get("nodeSelector") == selector


def test_a_wrong_value_is_one_error_naming_it() -> None:
    failure = render_error({"hostDriver": {"gpuOperatorClient": "yes"}})
    assert "/hostDriver/gpuOperatorClient" in failure.errors
