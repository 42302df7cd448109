"""CEL selectors written for NVIDIA's driver, rewritten in place for dradriver."""

from __future__ import annotations

import pytest

from dradriver.backend.select import open_backend
from dradriver.devicemodel import build_devices
from dradriver.devicemodel.attributes import DeviceType
from dradriver.offline.cel import compile_selector
from dradriver.offline.migrate.selectors import rewrite, rewrite_qualified

DRIVER = "gpu.dradriver.dev"


@pytest.mark.parametrize(
    ("before", "after", "note"),
    [
        (
            'device.attributes["gpu.nvidia.com"].productName == "NVIDIA A100-SXM4-40GB"',
            'device.attributes["gpu.dradriver.dev"].productName == "NVIDIA A100-SXM4-40GB"',
            "domain gpu.nvidia.com -> gpu.dradriver.dev",
        ),
        (  # the quoting style is kept
            "device.attributes['gpu.nvidia.com'].profile == '1g.5gb'",
            "device.attributes['gpu.dradriver.dev'].profile == '1g.5gb'",
            "domain gpu.nvidia.com -> gpu.dradriver.dev",
        ),
        (  # NVIDIA's old index is our stable minor, also in the bracket form
            'device.attributes["gpu.nvidia.com"]["index"] == 0',
            'device.attributes["gpu.dradriver.dev"]["minor"] == 0',
            "index -> minor",
        ),
        (  # pcieBusID (up to v25.8) is the standard attribute
            'has(device.attributes["gpu.nvidia.com"].pcieBusID)',
            'has(device.attributes["resource.kubernetes.io"].pciBusID)',
            "pcieBusID -> resource.kubernetes.io/pciBusID",
        ),
        (  # NVIDIA's legacy pcieBusID beside the standard numaNode, which stays as it is
            'has(device.attributes["gpu.nvidia.com"].pcieBusID) && '
            '"numaNode" in device.attributes["resource.kubernetes.io"]',
            'has(device.attributes["resource.kubernetes.io"].pciBusID) && '
            '"numaNode" in device.attributes["resource.kubernetes.io"]',
            "pcieBusID -> resource.kubernetes.io/pciBusID",
        ),
        (
            "device.driver == 'gpu.nvidia.com'",
            "device.driver == 'gpu.dradriver.dev'",
            "driver gpu.nvidia.com -> gpu.dradriver.dev",
        ),
        (
            'device.capacity["gpu.nvidia.com"].multiprocessors.isGreaterThan(quantity("50"))',
            'device.capacity["gpu.dradriver.dev"].multiprocessors.isGreaterThan(quantity("50"))',
            "domain gpu.nvidia.com -> gpu.dradriver.dev",
        ),
        (  # layout and comments stay as written
            "// A100s only\ndevice.attributes['gpu.nvidia.com'].productName.lowerAscii().matches('a100')\n"
            "  && device.attributes[\"resource.kubernetes.io\"].pcieRoot != ''",
            "// A100s only\ndevice.attributes['gpu.dradriver.dev'].productName.lowerAscii().matches('a100')\n"
            "  && device.attributes[\"resource.kubernetes.io\"].pcieRoot != ''",
            "domain gpu.nvidia.com -> gpu.dradriver.dev",
        ),
    ],
)
def test_rewrites(before: str, after: str, note: str) -> None:
    result = rewrite(before, driver=DRIVER, device_types=frozenset({"gpu"}))
    assert result.problems == []
    assert result.expression == after
    assert any(n.startswith(note) for n in result.notes), result.notes
    compile_selector(result.expression)


def test_an_expression_for_dradriver_already_is_left_alone() -> None:
    expression = 'device.attributes["gpu.dradriver.dev"].computeMajor >= 9'
    result = rewrite(expression, driver=DRIVER)
    assert (result.expression, result.notes, result.problems) == (expression, [], [])


def test_another_driver_name() -> None:
    result = rewrite("device.driver == 'gpu.nvidia.com'", driver="gpu.example.com")
    assert result.expression == "device.driver == 'gpu.example.com'"


@pytest.mark.parametrize(
    ("expression", "types", "problem"),
    [
        ('device.capacity["gpu.nvidia.com"].memorySlice3 == quantity("1")', {"mig"}, "placementStart"),
        ('device.attributes["gpu.nvidia.com"].partition2 == 1', {"gpu"}, "Fabric Manager partition"),
        ('device.attributes["gpu.nvidia.com"].vendorID == "10de"', {"gpu"}, "VFIO devices only"),
        ('device.attributes["gpu.nvidia.com"].colour == "green"', {"gpu"}, "publishes no attribute 'colour'"),
        ('device.attributes["gpu.nvidia.com"].index == 0', {"mig"}, "a MIG device's NVML index"),
        (
            'device.attributes["gpu.dradriver.dev"].pciBusID == "x"',
            {"gpu"},
            "dradriver publishes no attribute",
        ),
        (
            'device.capacity["gpu.nvidia.com"].shares.isGreaterThan(quantity("1"))',
            {"gpu"},
            "consumable shares",
        ),
        ('device.attributes["gpu.nvidia.com"].exists(k, k == "uuid")', {"gpu"}, "used as a whole map"),
        ('device.driver == "compute-domain.nvidia.com"', {"gpu"}, "ComputeDomains"),
        ('device.attributes["gpu.nvidia.com"].type == "vfio"', {"gpu"}, "VFIO passthrough"),
        ('device.attributes["gpu.nvidia.com"].uuid == ', {"gpu"}, "does not compile: ERROR: <input>:1:"),
    ],
)
def test_what_has_no_equivalent_is_a_problem(expression: str, types: set[str], problem: str) -> None:
    result = rewrite(expression, driver=DRIVER, device_types=frozenset(types))  # type: ignore[arg-type]
    assert any(problem in p for p in result.problems), result.problems
    assert result.expression == expression or result.problems


def test_constraint_attributes() -> None:
    gpu: frozenset[DeviceType] = frozenset({"gpu"})
    mig: frozenset[DeviceType] = frozenset({"mig"})
    assert rewrite_qualified("gpu.nvidia.com/parentUUID", driver=DRIVER, device_types=mig) == (
        "gpu.dradriver.dev/parentUUID",
        "",
    )
    assert rewrite_qualified("resource.kubernetes.io/pcieRoot", driver=DRIVER, device_types=gpu) == (
        "resource.kubernetes.io/pcieRoot",
        "",
    )
    assert rewrite_qualified("resource.kubernetes.io/numaNode", driver=DRIVER, device_types=gpu) == (
        "resource.kubernetes.io/numaNode",
        "",
    )
    assert "Fabric Manager" in str(
        rewrite_qualified("gpu.nvidia.com/partition4", driver=DRIVER, device_types=gpu)
    )


def test_a_rewritten_selector_selects_what_nvidias_did() -> None:
    """gpu-test6's selector (productName regex, index) on the A100 40GB quickstart node: GPUs 4 and 6."""
    expression = (
        "device.attributes['gpu.nvidia.com'].productName.lowerAscii().matches('^.*a100.*$') &&\n"
        "(device.attributes['gpu.nvidia.com'].index == 0 ||\n"
        " device.attributes['gpu.nvidia.com'].index == 2 ||\n"
        " device.attributes['gpu.nvidia.com'].index == 4 ||\n"
        " device.attributes['gpu.nvidia.com'].index == 6)"
    )
    selector = compile_selector(
        rewrite(expression, driver=DRIVER, device_types=frozenset({"gpu"})).expression
    )
    devices = build_devices(open_backend("dgx-a100-40gb-mig").discover(), driver_name=DRIVER).devices
    gpus = [d for d in devices if d.json["attributes"]["type"]["string"] == "gpu"]
    assert [d.name for d in gpus if selector.matches(d.json, DRIVER)] == ["gpu-4", "gpu-6"]
