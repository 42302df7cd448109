"""dry-run's allocation simulator against the scheduler's allocator (dra-oracle allocate).

For every generated scenario both must reach the same verdict: an allocation, "cannot allocate",
or an error (a CEL runtime error in a selector). When both allocate, ours must be one the real
allocator accepts: claim after claim, our earlier allocations are handed back as allocated claims
(so a device taken twice is refused) and the claim is pinned to exactly the devices we chose for
each request (so a broken constraint, counter or taint is refused). A scenario the oracle gives
up on (past its time limit) has no verdict to compare with; such scenarios are counted.

CI runs a fixed seed and a bounded number of scenarios; `make fuzz-cel` runs many more
(DRADRIVER_FUZZ_SCENARIOS, DRADRIVER_FUZZ_SEED). DRADRIVER_FUZZ_REPORT=FILE records counts.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, seed, settings

from dradriver.cli import main
from dradriver.offline.allocation import (
    DeviceClass,
    Simulation,
    parse_claim,
    parse_device_class,
    parse_slice,
    simulate,
)
from dradriver.offline.allocation.result import allocation_status
from dradriver.quantity import Quantity
from tests.offline.allocation.allocation_strategy import NODE, V1, device_classes, profile_slices, scenarios
from tests.oracle import Oracle

SCENARIOS = int(os.environ.get("DRADRIVER_FUZZ_SCENARIOS", "40"))
SEED = int(os.environ.get("DRADRIVER_FUZZ_SEED", "14"))
REPORT = os.environ.get("DRADRIVER_FUZZ_REPORT")
PIN_DOMAIN = "dradriver.test"
# Our search is slower than the real allocator's: a scenario the oracle decides within its
# time limit (conftest.ALLOCATE_TIMEOUT) gets up to this long here.
TIMEOUT_SECONDS = 600.0
PLAIN_FIELDS = ("request", "driver", "pool", "device", "adminAccess")

counts: dict[str, int] = {
    "scenarios": 0,
    "satisfiable": 0,
    "unsatisfiable": 0,
    "errors": 0,
    "identical": 0,
    # satisfiable with at least one device shared (allowMultipleAllocations) between allocations
    "shared": 0,
    # the oracle gave up (its time limit): no verdict to compare with
    "oracle timeouts": 0,
}


def ours_classes(request: dict[str, Any]) -> dict[str, DeviceClass]:
    return {c.name: c for c in (parse_device_class(obj) for obj in request["deviceClasses"])}


def ours(request: dict[str, Any]) -> Simulation:
    classes = ours_classes(request)
    slices = [parse_slice(obj) for obj in request["resourceSlices"]]
    claims = [parse_claim(obj) for obj in request["allocatedClaims"] + request["claims"]]
    return simulate(claims, classes, slices, node=NODE, timeout=TIMEOUT_SECONDS)


def our_results(simulation: Simulation, request: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """What the scheduler would write into each claim's status.allocation.devices.results."""
    node = simulation.nodes[0]
    reports = node.claims[len(request["allocatedClaims"]) :]
    return [allocation_status(report, ours_classes(request))["devices"]["results"] for report in reports]


def comparable(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Results without share IDs (random in the scheduler), consumed capacity by value."""
    out = []
    for result in results:
        entry = {k: v for k, v in result.items() if k in PLAIN_FIELDS}
        if "consumedCapacity" in result:
            entry["consumedCapacity"] = {
                name: Quantity.parse(value).exact() for name, value in result["consumedCapacity"].items()
            }
        entry["shared"] = "shareID" in result
        out.append(entry)
    return out


def their_results(answer: dict[str, Any]) -> list[list[dict[str, Any]]]:
    return [claim["allocation"]["devices"]["results"] for claim in answer["results"]]


def pinned(request: dict[str, Any], index: int, results: list[dict[str, Any]]) -> dict[str, Any]:
    """Claim `index`, each request (or the chosen subrequest) limited to the devices we chose."""
    claim: dict[str, Any] = copy.deepcopy(request["claims"][index])
    chosen: dict[str, list[str]] = {}
    for result in results:
        chosen.setdefault(result["request"], []).append(f"{result['pool']}/{result['device']}")
    for item in claim["spec"]["devices"]["requests"]:
        options = [(item["name"], item["exactly"])] if "exactly" in item else []
        for sub in item.get("firstAvailable") or []:
            options.append((f"{item['name']}/{sub['name']}", sub))
        for name, body in options:
            slots = chosen.get(name, [])
            pin = f'device.attributes["{PIN_DOMAIN}"].slot in {json.dumps(slots)}' if slots else "false"
            body["selectors"] = [*body.get("selectors", []), {"cel": {"expression": pin}}]
            if slots and body.get("allocationMode") == "All":
                continue
            if slots:
                body["count"] = len(slots)
    return claim


def with_slots(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = copy.deepcopy(slices)
    for slice_ in out:
        pool = slice_["spec"]["pool"]["name"]
        for device in slice_["spec"].get("devices") or []:
            device.setdefault("attributes", {})[f"{PIN_DOMAIN}/slot"] = {"string": f"{pool}/{device['name']}"}
    return out


def allocated_claim(request: dict[str, Any], index: int, results: list[dict[str, Any]]) -> dict[str, Any]:
    claim: dict[str, Any] = copy.deepcopy(request["claims"][index])
    claim["status"] = {"allocation": {"devices": {"results": results}}}
    return claim


def check(oracle: Oracle, request: dict[str, Any]) -> None:
    counts["scenarios"] += 1
    answer = oracle.ask(request)
    assert not str(answer.get("error", "")).startswith(("invalid input", "internal panic")), answer
    if answer.get("timeout"):
        counts["oracle timeouts"] += 1
        return
    simulation = ours(request)
    node = simulation.nodes[0]
    if "error" in answer:
        counts["errors"] += 1
        assert node.error is not None, f"Kubernetes fails with {answer['error']!r}, we allocate or not"
        return
    assert node.error is None, f"we fail with {node.error!r}; Kubernetes: {answer}"
    if answer.get("unsatisfiable"):
        counts["unsatisfiable"] += 1
        assert not node.satisfiable, f"we allocate, Kubernetes cannot: {answer.get('reason')}"
        return
    counts["satisfiable"] += 1
    assert node.satisfiable, f"Kubernetes allocates {their_results(answer)}, we do not: {node.reason}"
    mine = our_results(simulation, request)
    if any("shareID" in result for results in mine for result in results):
        counts["shared"] += 1
    if [comparable(r) for r in mine] == [comparable(r) for r in their_results(answer)]:
        counts["identical"] += 1
    # Ours must be an allocation the real allocator accepts, claim after claim.
    slices = with_slots(request["resourceSlices"])
    held = list(request["allocatedClaims"])
    for index, results in enumerate(mine):
        verify = {
            **request,
            "resourceSlices": slices,
            "claims": [pinned(request, index, results)],
            "allocatedClaims": held,
        }
        verdict = oracle.ask_ok(verify)
        assert "results" in verdict, f"claim {index}: Kubernetes refuses our allocation {results}: {verdict}"
        held = [*held, allocated_claim(request, index, results)]


@pytest.fixture(scope="module", autouse=True)
def _report() -> Any:
    yield
    if REPORT:
        path = Path(REPORT)
        previous = json.loads(path.read_text()) if path.exists() else {}
        path.write_text(json.dumps({**previous, "allocation": {"seed": SEED, **counts}}) + "\n")


@pytest.mark.timeout(1800)
@seed(SEED)
@settings(
    max_examples=SCENARIOS,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    # No explain phase: its tracer slows every search a hundredfold (Python < 3.12).
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
)
@given(request=scenarios())
def test_generated_scenarios_agree_with_the_scheduler(
    allocate_oracle: Oracle, request: dict[str, Any]
) -> None:
    check(allocate_oracle, request)


NIC_DRIVER = "nic.example.com"
NIC_CLASS = {
    "apiVersion": V1,
    "kind": "DeviceClass",
    "metadata": {"name": NIC_DRIVER},
    "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{NIC_DRIVER}"'}}]},
}


def nic_slice(numa_nodes: list[int]) -> dict[str, Any]:
    """Another driver's NICs on these NUMA nodes, under the standard attribute."""
    devices = [
        {"name": f"nic-{i}", "attributes": {"resource.kubernetes.io/numaNode": {"int": numa}}}
        for i, numa in enumerate(numa_nodes)
    ]
    return {
        "apiVersion": V1,
        "kind": "ResourceSlice",
        "metadata": {"name": f"{NODE}-nics"},
        "spec": {
            "driver": NIC_DRIVER,
            "nodeName": NODE,
            "pool": {"name": f"{NODE}-nics", "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


#: GPU 5 of dgx-h100 is on NUMA node 1; its NIC must be too.
GPU_WITH_NIC = {
    "apiVersion": V1,
    "kind": "ResourceClaim",
    "metadata": {"name": "gpu-nic", "namespace": "default", "uid": "uid-gpu-nic"},
    "spec": {
        "devices": {
            "requests": [
                {
                    "name": "gpu",
                    "exactly": {
                        "deviceClassName": "gpu.dradriver.dev",
                        "selectors": [
                            {"cel": {"expression": 'device.attributes["gpu.dradriver.dev"].minor == 5'}}
                        ],
                    },
                },
                {"name": "nic", "exactly": {"deviceClassName": NIC_DRIVER}},
            ],
            "constraints": [
                {"requests": ["gpu", "nic"], "matchAttribute": "resource.kubernetes.io/numaNode"}
            ],
        }
    },
}


@pytest.mark.parametrize(
    ("nic_numa", "nic"), [([0, 1], "nic-1"), ([0, 0], None)], ids=["aligned", "no-nic-on-node-1"]
)
def test_a_gpu_and_another_drivers_nic_aligned_on_the_standard_numa_node(
    allocate_oracle: Oracle,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    nic_numa: list[int],
    nic: str | None,
) -> None:
    """dry-run (the CLI, on the slices dradriver publishes) and the scheduler's allocator agree on
    a claim that aligns one of our GPUs with another driver's NIC by resource.kubernetes.io/numaNode."""
    slices = [*copy.deepcopy(list(profile_slices("dgx-h100", False))), nic_slice(nic_numa)]
    request = {
        "node": {"metadata": {"name": NODE}},
        "deviceClasses": [*device_classes(), NIC_CLASS],
        "resourceSlices": slices,
        "claims": [GPU_WITH_NIC],
        "allocatedClaims": [],
    }
    check(allocate_oracle, request)
    answer = allocate_oracle.ask(request)
    (tmp_path / "slices.yaml").write_text(yaml.safe_dump_all(slices))
    (tmp_path / "claim.yaml").write_text(yaml.safe_dump_all([GPU_WITH_NIC, NIC_CLASS]))
    code = main(
        [
            "dry-run",
            "--claim",
            str(tmp_path / "claim.yaml"),
            "--slices",
            str(tmp_path / "slices.yaml"),
            "-o",
            "json",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    if nic is None:
        assert answer.get("unsatisfiable"), answer
        assert code == 1, report
        return
    assert code == 0, report
    chosen = {r["request"]: r["device"] for r in report["nodes"][0]["claims"][0]["allocation"]}
    assert chosen == {"gpu": "gpu-5", "nic": nic}
    assert {r["request"]: r["device"] for r in their_results(answer)[0]} == chosen
