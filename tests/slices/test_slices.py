"""Slice rendering: every built-in profile, golden files, splitting and naming."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from dradriver.backend.select import builtin_profile_names, open_backend
from dradriver.cli._output import dump_yaml_documents
from dradriver.devicemodel import build_devices
from dradriver.discovery import NodeInventory
from dradriver.slices import build_node_slices, render_slices, slice_name_prefix, validate_slices
from tests.helpers import write_gpu_profile

DRIVER = "gpu.dradriver.dev"
NODE = "gpu-node-1"
GOLDEN = Path(__file__).with_name("golden")
UPDATE_ENV = "DRADRIVER_UPDATE_GOLDEN"


def _devices(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [device for s in slices for device in s["spec"].get("devices", [])]


@pytest.mark.parametrize("partitionable", [False, True], ids=["static", "partitionable"])
@pytest.mark.parametrize("profile", builtin_profile_names())
def test_every_builtin_profile_renders_valid_slices(profile: str, partitionable: bool) -> None:
    slices = build_node_slices(profile, node_name=NODE, driver_name=DRIVER, partitionable=partitionable)
    assert validate_slices(slices) == []
    count = len(slices)
    for index, obj in enumerate(slices):
        assert obj["apiVersion"] == "resource.k8s.io/v1"
        assert obj["kind"] == "ResourceSlice"
        assert obj["metadata"] == {"generateName": f"{index:05x}-{DRIVER}-{NODE}-"}
        spec = obj["spec"]
        assert (spec["driver"], spec["nodeName"]) == (DRIVER, NODE)
        assert spec["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": count}
        assert ("devices" in spec) != ("sharedCounters" in spec)  # counters live in slices of their own
        assert "ownerReferences" not in obj["metadata"]
    # The OpenAPI schemas of every supported Kubernetes version agree (strict: no unknown fields).
    for version in ("1.34.0", "1.35.0", "1.36.0", "1.37.0"):
        for obj in slices:
            kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("profile", ["dgx-h100", "dgx-a100-mig"])
def test_golden(profile: str) -> None:
    text = dump_yaml_documents(build_node_slices(profile, node_name=NODE, driver_name=DRIVER))
    golden = GOLDEN / f"{profile}.yaml"
    if os.environ.get(UPDATE_ENV):
        golden.write_text(text)
    assert text == golden.read_text(), f"rendering changed; rerun with {UPDATE_ENV}=1 if intended"
    # The YAML reads back as the same objects (e.g. "0000:07:00.0" stays a string).
    assert list(yaml.safe_load_all(text)) == build_node_slices(profile, node_name=NODE, driver_name=DRIVER)


def _many_gpus(count: int) -> NodeInventory:
    base = open_backend("t4x4").discover()
    gpu = base.gpus[0]
    gpus = tuple(
        replace(gpu, index=i, minor=i, uuid=f"GPU-{i:08d}", pci_bus_id=f"{i // 200:04x}:{i % 200:02x}:00.0")
        for i in range(count)
    )
    return replace(base, gpus=gpus)


def test_split_at_128_devices_in_stable_order() -> None:
    devices = build_devices(_many_gpus(300), driver_name=DRIVER)
    slices = render_slices(devices, node_name=NODE, driver_name=DRIVER, generation=7)
    assert [len(s["spec"]["devices"]) for s in slices] == [128, 128, 44]
    assert [d["name"] for d in _devices(slices)] == [f"gpu-{i}" for i in range(300)]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {3}
    assert {s["spec"]["pool"]["generation"] for s in slices} == {7}
    assert validate_slices(slices) == []


def test_split_at_64_devices_when_counters_are_used(tmp_path: Path) -> None:
    profile = write_gpu_profile(tmp_path / "mig.yaml", 6, mig_empty=True)
    slices = build_node_slices(str(profile), node_name=NODE, driver_name=DRIVER, partitionable=True)
    assert [len(s["spec"].get("devices", [])) for s in slices] == [64, 64, 22, 0]
    assert [len(s["spec"].get("sharedCounters", [])) for s in slices] == [0, 0, 0, 6]
    consumed = {c["counterSet"] for d in _devices(slices) for c in d.get("consumesCounters", [])}
    assert consumed == {f"gpu-{m}-counters" for m in range(6)}


def test_empty_node_publishes_one_empty_slice() -> None:
    devices = build_devices(replace(_many_gpus(1), gpus=()), driver_name=DRIVER)
    [only] = render_slices(devices, node_name=NODE, driver_name=DRIVER)
    assert only["spec"]["devices"] == []
    assert only["spec"]["pool"]["resourceSliceCount"] == 1
    assert validate_slices([only]) == []


def test_generate_name_index_widens_past_five_hex_digits() -> None:
    assert slice_name_prefix(0, 1, driver_name=DRIVER, node_name="n") == f"00000-{DRIVER}-n-"
    assert slice_name_prefix(255, 0x100000, driver_name=DRIVER, node_name="n") == f"000ff-{DRIVER}-n-"
    assert slice_name_prefix(255, 0x100001, driver_name=DRIVER, node_name="n") == f"0000ff-{DRIVER}-n-"
    names = [slice_name_prefix(i, 20, driver_name=DRIVER, node_name="n") for i in range(20)]
    assert names == sorted(names)  # the scheduler orders slices by name


def test_render_refuses_a_device_set_built_for_another_driver() -> None:
    devices = build_devices(_many_gpus(1), driver_name="gpu.example.com")
    with pytest.raises(ValueError, match=r"built for driver 'gpu\.example\.com'"):
        render_slices(devices, node_name=NODE, driver_name=DRIVER)
