"""The scheduler's `status.allocation` built from a simulated allocation."""

from __future__ import annotations

from dradriver.offline.allocation import parse_claim, parse_device_class, parse_slice, simulate
from dradriver.offline.allocation.result import allocation_status
from dradriver.slices import build_node_slices

DRIVER = "gpu.dradriver.dev"
CLASS_CONFIG = {"opaque": {"driver": DRIVER, "parameters": {"from": "class"}}}
CLAIM_CONFIG = {"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": {"from": "claim"}}}


def test_results_and_configs_are_listed_as_the_scheduler_does() -> None:
    slices = [parse_slice(s) for s in build_node_slices("dgx-h100", node_name="n1", driver_name=DRIVER)]
    classes = {
        "gpu": parse_device_class(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": "gpu"},
                "spec": {
                    "selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}],
                    "config": [CLASS_CONFIG],
                },
            }
        )
    }
    claim = parse_claim(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "default"},
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": 2}},
                        {"name": "fa", "firstAvailable": [{"name": "any", "deviceClassName": "gpu"}]},
                    ],
                    "config": [CLAIM_CONFIG],
                }
            },
        }
    )
    report = simulate([claim], classes, slices, node="n1").nodes[0].claims[0]
    status = allocation_status(report, classes)
    assert status["devices"]["results"] == [
        {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-0"},
        {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-1"},
        {"request": "fa/any", "driver": DRIVER, "pool": "n1", "device": "gpu-2"},
    ]
    assert status["devices"]["config"] == [
        {"source": "FromClass", "requests": ["gpu", "fa/any"], **CLASS_CONFIG},
        {"source": "FromClaim", **CLAIM_CONFIG},
    ]
