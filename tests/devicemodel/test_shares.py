"""Shareable GPUs (consumable capacity): the policy, the published capacities, and what the real
API server validation and allocator make of them (dra-oracle)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from dradriver.backend.select import open_backend
from dradriver.cli import main
from dradriver.devicemodel import build_devices
from dradriver.devicemodel.shares import COMPUTE_CAPACITY, SharePolicy, parse_policy
from dradriver.slices import build_node_slices, validate_slices
from tests import oracle

DRIVER = "gpu.dradriver.dev"
NODE = "node-1"


@pytest.fixture(scope="module")
def allocator() -> Iterator[oracle.Oracle]:
    yield from oracle.start("allocate")


def _profile(tmp_path: Path, count: int = 1, memory_mib: int = 81920) -> str:
    gpu = {
        "productName": "NVIDIA A100-SXM4-80GB",
        "count": count,
        "architecture": "Ampere",
        "computeCapability": "8.0",
        "memoryMiB": memory_mib,
    }
    path = tmp_path / "gpus.yaml"
    path.write_text(
        yaml.safe_dump({"driverVersion": "570.124.06", "cudaDriverVersion": "12.8", "gpus": [gpu]})
    )
    return str(path)


def _named(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The slices as the API server stores them: generateName has become a name."""
    return [s | {"metadata": {"name": f"{s['metadata']['generateName']}{i}"}} for i, s in enumerate(slices)]


def _devices(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for s in slices for d in s["spec"].get("devices", [])]


def test_parse_policy() -> None:
    assert parse_policy("mps") == SharePolicy("mps")
    assert parse_policy("unenforced:0, GPU-x", count=8) == SharePolicy(
        "unenforced", frozenset({"0", "GPU-x"}), 8
    )
    for bad, message in (
        ("timeslice", "is not one of mps, unenforced"),
        ("mps:", "names no GPU"),
        ("mps:,", "names no GPU"),
    ):
        with pytest.raises(ValueError, match=message):
            parse_policy(bad)
    with pytest.raises(ValueError, match="share count 0"):
        parse_policy("mps", count=0)


def test_a_shared_gpu_is_published_once_with_memory_and_compute(tmp_path: Path) -> None:
    slices = build_node_slices(
        _profile(tmp_path), node_name=NODE, driver_name=DRIVER, shares=SharePolicy("mps")
    )
    (device,) = _devices(slices)
    assert device["allowMultipleAllocations"] is True
    assert device["capacity"] == {
        "memory": {
            "value": "80Gi",
            "requestPolicy": {"default": "20Gi", "validRange": {"min": "256Mi", "step": "1Mi"}},
        },
        COMPUTE_CAPACITY: {
            "value": "100",
            "requestPolicy": {"default": "25", "validRange": {"min": "1", "max": "100", "step": "1"}},
        },
    }
    assert device["attributes"]["type"] == {"string": "gpu"}
    assert validate_slices(slices) == []
    for obj in slices:
        kubernetes_validate.validate(obj, "1.36.0", strict=True)


def test_only_the_selected_gpus_are_shared(tmp_path: Path) -> None:
    library = open_backend(_profile(tmp_path, count=3))
    inventory = library.discover()
    library.close()
    uuid = next(g.uuid for g in inventory.gpus if g.minor == 2)
    devices = build_devices(
        inventory, driver_name=DRIVER, shares=SharePolicy("mps", frozenset({"0", uuid}))
    ).devices
    assert [d.json.get("allowMultipleAllocations", False) for d in devices] == [True, False, True]
    assert "multiprocessors" not in devices[0].json["capacity"]


@pytest.mark.parametrize("profile", ["dgx-h100", "dgx-a100-mig", "mixed", "t4x4"])
@pytest.mark.parametrize("partitionable", [False, True])
def test_shared_slices_pass_the_api_servers_validation(
    allocator: oracle.Oracle, profile: str, partitionable: bool
) -> None:
    """The real validation (dra-oracle allocate with validate) accepts every shared slice,
    MIG devices of shared GPUs included; placements still to be made stay whole."""
    slices = build_node_slices(
        profile, node_name=NODE, driver_name=DRIVER, partitionable=partitionable, shares=SharePolicy("mps")
    )
    devices = _devices(slices)
    assert any(d.get("allowMultipleAllocations") for d in devices)
    assert not any(d.get("allowMultipleAllocations") and d.get("consumesCounters") for d in devices)
    answer = allocator.ask(
        {
            "node": _node(),
            "resourceSlices": _named(slices),
            "deviceClasses": [_class()],
            "claims": [],
            "validate": True,
        }
    )
    assert "invalid" not in answer, answer


def _node() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}


def _class() -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DRIVER},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }


def _claim(name: str, capacity: dict[str, str] | None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": DRIVER}
    if capacity is not None:
        exactly["capacity"] = {"requests": capacity}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def _allocate_in_turn(
    allocator: oracle.Oracle, slices: list[dict[str, Any]], claims: list[dict[str, Any]]
) -> list[dict[str, Any] | None]:
    """Allocate the claims one after the other, as the scheduler does pod by pod."""
    allocated: list[dict[str, Any]] = []
    out: list[dict[str, Any] | None] = []
    for claim in claims:
        answer = allocator.ask(
            {
                "node": _node(),
                "resourceSlices": _named(slices),
                "deviceClasses": [_class()],
                "claims": [claim],
                "allocatedClaims": allocated,
                "validate": True,
            }
        )
        assert "error" not in answer, answer
        assert "invalid" not in answer, answer
        if answer.get("unsatisfiable"):
            out.append(None)
            continue
        (result,) = answer["results"]
        allocated.append(claim | {"status": {"allocation": result["allocation"]}})
        out.append(result["allocation"])
    return out


def test_the_scheduler_fits_four_20gi_shares_on_an_80gi_gpu(allocator: oracle.Oracle, tmp_path: Path) -> None:
    slices = build_node_slices(
        _profile(tmp_path), node_name=NODE, driver_name=DRIVER, shares=SharePolicy("mps")
    )
    claims = [_claim(f"c{i}", {"memory": "20Gi"}) for i in range(5)]
    allocations = _allocate_in_turn(allocator, slices, claims)
    assert allocations[4] is None
    shares = set()
    for allocation in allocations[:4]:
        assert allocation is not None
        (result,) = allocation["devices"]["results"]
        assert result["consumedCapacity"] == {"memory": "20Gi", COMPUTE_CAPACITY: "25"}
        shares.add(result["shareID"])
    assert len(shares) == 4


def test_unrequested_amounts_are_one_share_of_count(allocator: oracle.Oracle, tmp_path: Path) -> None:
    """A request naming nothing gets 1/count of the GPU; a request is rounded up to whole MiB."""
    slices = build_node_slices(
        _profile(tmp_path), node_name=NODE, driver_name=DRIVER, shares=SharePolicy("mps", count=2)
    )
    allocations = _allocate_in_turn(
        allocator,
        slices,
        [_claim("a", None), _claim("b", {"memory": "1000M", COMPUTE_CAPACITY: "10"}), _claim("c", None)],
    )
    first, second, third = allocations
    assert first is not None
    assert second is not None
    assert third is None
    assert first["devices"]["results"][0]["consumedCapacity"] == {"memory": "40Gi", COMPUTE_CAPACITY: "50"}
    assert second["devices"]["results"][0]["consumedCapacity"] == {"memory": "954Mi", COMPUTE_CAPACITY: "10"}


def test_dry_run_shows_the_shares_of_each_device(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def claim(name: str, requests: dict[str, str]) -> dict[str, Any]:
        selector = {"cel": {"expression": 'device.attributes["gpu.dradriver.dev"].minor == 0'}}
        exactly = {"deviceClassName": DRIVER, "selectors": [selector], "capacity": {"requests": requests}}
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
        }

    path = tmp_path / "claims.yaml"
    path.write_text(
        yaml.safe_dump_all(
            [claim("a", {"memory": "20Gi", COMPUTE_CAPACITY: "25"}), claim("b", {"memory": "30Gi"})]
        )
    )
    code = main(["dry-run", "--claim", str(path), "--fake-gpus", "dgx-h100", "--gpu-shares", "mps:0"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "shares of gpu.dradriver.dev/fake-node/gpu-0: 2 (memory 50Gi, computePercent 50)" in out
    assert main(["dry-run", "--claim", str(path), "--slices", str(path), "--gpu-shares", "mps"]) == 2
    assert "--gpu-shares applies to --fake-gpus only" in capsys.readouterr().err
