"""GPU Feature Discovery labels as CEL: each selector matches exactly the devices whose node GFD
would have labelled so. GFD's labelling (NVIDIA/k8s-device-plugin internal/lm) is restated here
from the facts discovery reports, and the selectors run through the real CEL evaluator."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from dradriver.backend.select import builtin_profile_names, open_backend
from dradriver.devicemodel import PublishedDevice, build_devices
from dradriver.discovery import Gpu, MigDevice, NodeInventory
from dradriver.offline.cel import compile_selector
from dradriver.offline.migrate.gfd import FAMILIES, Requirement, Translated, translate

DRIVER = "gpu.dradriver.dev"


def gfd_family(major: int, minor: int) -> str:
    """GFD's getArchFamily."""
    table = {1: "tesla", 2: "fermi", 3: "kepler", 5: "maxwell", 6: "pascal", 9: "hopper", 13: "rubin"}
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ampere" if minor < 9 else "ada-lovelace"
    if major in (10, 12):
        return "blackwell"
    return table.get(major, "undefined")


def gfd_product(name: str) -> str:
    """GFD's sanitise: characters outside [A-Za-z0-9-_. ] dropped, whitespace runs joined by '-'."""
    return "-".join(re.sub(r"[^A-Za-z0-9\-_. ]", "", name).split())


def gfd_labels(gpu: Gpu, inventory: NodeInventory) -> dict[str, str]:
    """The labels GFD puts on a node of such GPUs (the full-GPU resource's)."""
    major, minor = gpu.compute_capability
    driver = inventory.driver_version.split(".")
    cuda = inventory.cuda_driver_version.split(".")
    return {
        "nvidia.com/gpu.product": gfd_product(gpu.product_name),
        "nvidia.com/gpu.memory": str(gpu.memory_bytes // 2**20),
        "nvidia.com/gpu.family": gfd_family(major, minor),
        "nvidia.com/gpu.compute.major": str(major),
        "nvidia.com/gpu.compute.minor": str(minor),
        "nvidia.com/cuda.driver-version.major": driver[0],
        "nvidia.com/cuda.driver-version.minor": driver[1],
        "nvidia.com/cuda.driver-version.revision": driver[2],
        "nvidia.com/cuda.driver-version.full": inventory.driver_version,
        "nvidia.com/cuda.driver.major": driver[0],
        "nvidia.com/cuda.runtime-version.major": cuda[0],
        "nvidia.com/cuda.runtime-version.minor": cuda[1],
        "nvidia.com/cuda.runtime-version.full": inventory.cuda_driver_version,
        "nvidia.com/mig.capable": "true" if gpu.mig_capable else "false",
    }


def devices() -> Iterator[tuple[PublishedDevice, dict[str, set[str]]]]:
    """Each device with the values of each label its node may carry."""
    for profile in builtin_profile_names():
        inventory = open_backend(profile).discover()
        gpus = {g.minor: g for g in inventory.gpus}
        for device in build_devices(inventory, driver_name=DRIVER).devices:
            hardware = device.hardware
            gpu = gpus[hardware.parent_minor] if isinstance(hardware, MigDevice) else hardware
            assert isinstance(gpu, Gpu)
            labels = {key: {value} for key, value in gfd_labels(gpu, inventory).items()}
            if isinstance(hardware, MigDevice):
                # MIG strategy mixed labels the parent's product, single adds the MIG profile.
                labels["nvidia.com/gpu.product"].add(
                    f"{gfd_product(gpu.product_name)}-MIG-{hardware.profile}"
                )
                labels.pop("nvidia.com/gpu.memory")  # the parent's; MIG devices publish their own
            yield device, labels


ALL = list(devices())
LABELS = sorted({key for _, labels in ALL for key in labels})


def matches(translated: Translated | str, device: PublishedDevice) -> bool:
    assert isinstance(translated, Translated), translated
    if translated.expression is None:
        return True  # implied for this device type
    return compile_selector(translated.expression).matches(device.json, DRIVER)


@pytest.mark.parametrize("key", LABELS)
def test_in_matches_exactly_the_devices_gfd_labels_so(key: str) -> None:
    values = sorted({value for _, labels in ALL for value in labels.get(key, ())})
    for value in values:
        for device, labels in ALL:
            if key not in labels:
                continue
            kind = device.json["attributes"]["type"]["string"]
            translated = translate(Requirement(key, "In", (value,)), kind, DRIVER)
            if isinstance(translated, str):  # a contradiction (a MIG label for a full GPU...): refused
                assert value not in labels[key]
                assert "MIG" in translated
                continue
            assert matches(translated, device) == (value in labels[key]), (device.name, value)
            if len(labels[key]) == 1 and (key != "nvidia.com/mig.capable" or kind == "gpu"):
                excluded = Requirement(key, "NotIn", (value,))
                assert matches(translate(excluded, kind, DRIVER), device) == (value not in labels[key])


@pytest.mark.parametrize(
    "key", ["nvidia.com/gpu.memory", "nvidia.com/gpu.compute.major", "nvidia.com/cuda.driver.major"]
)
def test_gt_and_lt_compare_as_gfd_numbers(key: str) -> None:
    for device, labels in ALL:
        if key not in labels:
            continue
        kind = device.json["attributes"]["type"]["string"]
        (label,) = labels[key]
        number = int(label)
        for threshold in (number - 1, number, number + 1):
            greater = translate(Requirement(key, "Gt", (str(threshold),)), kind, DRIVER)
            less = translate(Requirement(key, "Lt", (str(threshold),)), kind, DRIVER)
            assert matches(greater, device) == (number > threshold)
            assert matches(less, device) == (number < threshold)


def test_families_are_gfds() -> None:
    assert set(FAMILIES) == {gfd_family(m, n) for m in range(1, 14) for n in range(10)} - {"undefined"}


@pytest.mark.parametrize(
    ("requirement", "kind", "problem"),
    [
        (Requirement("nvidia.com/gpu.count", "In", ("8",)), "gpu", "describes the node"),
        (Requirement("nvidia.com/gpu.replicas", "In", ("4",)), "gpu", "describes the node"),
        (Requirement("nvidia.com/mig.strategy", "In", ("mixed",)), "mig", "describes the node"),
        (Requirement("nvidia.com/gpu.product", "In", ("Tesla-T4-SHARED",)), "gpu", "time-slices"),
        (
            Requirement("nvidia.com/gpu.product", "In", ("NVIDIA-A100-SXM4-80GB-MIG-1g.10gb",)),
            "gpu",
            "full GPUs",
        ),
        (Requirement("nvidia.com/gpu.memory", "Gt", ("40000",)), "mig", "full GPU's memory"),
        (Requirement("nvidia.com/gpu.family", "In", ("fermion",)), "gpu", "unknown GPU family"),
        (Requirement("nvidia.com/gpu.product", "DoesNotExist"), "gpu", "excludes every GPU node"),
        (Requirement("nvidia.com/gpu.present", "In", ("false",)), "gpu", "cannot avoid nodes with GPUs"),
        (Requirement("nvidia.com/gpu.product", "Gt", ("3",)), "gpu", "no numeric device attribute"),
        (Requirement("nvidia.com/gpu.memory", "Gt", ("lots",)), "gpu", "needs one integer value"),
    ],
)
def test_labels_without_a_device_equivalent_are_problems(
    requirement: Requirement, kind: str, problem: str
) -> None:
    result = translate(requirement, kind, DRIVER)  # type: ignore[arg-type]
    assert isinstance(result, str)
    assert problem in result


def test_implied_labels_need_no_selector() -> None:
    present = translate(Requirement("nvidia.com/gpu.present", "In", ("true",)), "gpu", DRIVER)
    assert present == Translated(None, "implied: the claim asks for a GPU")
    capable = translate(Requirement("nvidia.com/mig.capable", "In", ("true",)), "mig", DRIVER)
    assert isinstance(capable, Translated)
    assert capable.expression is None
