"""A hypothesis strategy for allocation scenarios: what dradriver publishes, plus claims to place.

Slices come from the fake profiles through the real slice builder (full GPUs, MIG devices,
partitionable placements with shared counters), with taints added to some devices; classes are
the repository's DeviceClasses; claims use ExactCount and All, firstAvailable, matchAttribute and
distinctAttribute, adminAccess, tolerations and several claims at once; some devices are already
held by an allocated claim.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st

from tests.cel.selector_strategy import DRIVER, Draw

NODE = "node-a"
V1 = "resource.k8s.io/v1"
PROFILES = (
    ("dgx-h100", False),
    ("dgx-a100-mig", True),
    ("dgx-a100-mig", False),
    ("mixed", True),
    ("t4x4", False),
)
CLASSES = (
    "gpu.dradriver.dev",
    "mig.gpu.dradriver.dev",
    "hopper.gpu.dradriver.dev",
    "ampere.gpu.dradriver.dev",
)
SELECTORS = (
    f'device.attributes["{DRIVER}"].type == "gpu"',
    f'device.attributes["{DRIVER}"].type == "mig"',
    f'device.capacity["{DRIVER}"].memory.compareTo(quantity("20Gi")) >= 0',
    f'device.capacity["{DRIVER}"].memory.compareTo(quantity("40Gi")) < 0',
    f'device.attributes["{DRIVER}"].numaNode == 0',
    f'device.attributes["{DRIVER}"].numaNode >= 1',
    f'device.attributes["{DRIVER}"].profile == "1g.10gb"',
    f'device.attributes["{DRIVER}"].productName.contains("A100")',
    f'device.attributes["{DRIVER}"].cudaComputeCapability.isGreaterThan(semver("8.0.0"))',
    f'device.attributes["{DRIVER}"].minor % 2 == 0',
    '"numaNode" in device.attributes["gpu.dradriver.dev"]',
)
CONSTRAINT_ATTRIBUTES = (
    f"{DRIVER}/productName",
    f"{DRIVER}/numaNode",
    f"{DRIVER}/parentUUID",
    f"{DRIVER}/profile",
    "resource.kubernetes.io/pcieRoot",
    f"{DRIVER}/cudaComputeCapability",
)
TAINT_KEYS = ("gpu.dradriver.dev/unhealthy", "gpu.dradriver.dev/maintenance")


@functools.cache
def _profile_slices(profile: str, partitionable: bool) -> tuple[dict[str, Any], ...]:
    from dradriver.slices import build_node_slices

    slices = build_node_slices(profile, node_name=NODE, driver_name=DRIVER, partitionable=partitionable)
    for index, slice_ in enumerate(slices):
        # Named as the API server names generated objects; both allocators order slices by name.
        slice_["metadata"] = {"name": f"{NODE}-{profile}-{index:02d}"}
    return tuple(slices)


@functools.cache
def device_classes() -> tuple[dict[str, Any], ...]:
    directory = Path(__file__).resolve().parents[2] / "deviceclasses"
    out = []
    for path in sorted(directory.glob("*.yaml")):
        obj = yaml.safe_load(path.read_text())
        obj["spec"].pop("extendedResourceName", None)
        out.append(obj)
    return tuple(out)


def _selectors(draw: Draw) -> list[dict[str, Any]]:
    chosen = draw(st.lists(st.sampled_from(SELECTORS), max_size=2, unique=True))
    return [{"cel": {"expression": e}} for e in chosen]


def _tolerations(draw: Draw) -> list[dict[str, Any]]:
    if draw(st.integers(0, 3)) != 0:
        return []
    toleration: dict[str, Any] = {"key": draw(st.sampled_from(TAINT_KEYS))}
    if draw(st.booleans()):
        toleration["operator"] = "Exists"
    else:
        toleration["operator"] = "Equal"
        toleration["value"] = draw(st.sampled_from(["true", "false"]))
    if draw(st.booleans()):
        toleration["effect"] = draw(st.sampled_from(["NoSchedule", "NoExecute"]))
    return [toleration]


def _exact(draw: Draw) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": draw(st.sampled_from(CLASSES))}
    selectors = _selectors(draw)
    if selectors:
        body["selectors"] = selectors
    if draw(st.integers(0, 5)) == 0:
        body["allocationMode"] = "All"
    else:
        body["count"] = draw(st.integers(1, 3))
    if draw(st.integers(0, 6)) == 0:
        body["adminAccess"] = True
    tolerations = _tolerations(draw)
    if tolerations:
        body["tolerations"] = tolerations
    return body


@st.composite
def claims(draw: Draw, index: int) -> dict[str, Any]:
    requests: list[dict[str, Any]] = []
    names: list[str] = []
    for r in range(draw(st.integers(1, 3))):
        name = f"r{r}"
        names.append(name)
        if draw(st.integers(0, 3)) == 0:
            subs = [{"name": f"s{s}", **_exact(draw)} for s in range(draw(st.integers(2, 3)))]
            requests.append({"name": name, "firstAvailable": subs})
        else:
            requests.append({"name": name, "exactly": _exact(draw)})
    constraints = []
    for _ in range(draw(st.integers(0, 2))):
        kind = draw(st.sampled_from(["matchAttribute", "distinctAttribute"]))
        constraint: dict[str, Any] = {kind: draw(st.sampled_from(CONSTRAINT_ATTRIBUTES))}
        if draw(st.booleans()):
            constraint["requests"] = draw(st.lists(st.sampled_from(names), min_size=1, unique=True))
        constraints.append(constraint)
    devices: dict[str, Any] = {"requests": requests}
    if constraints:
        devices["constraints"] = constraints
    return {
        "apiVersion": V1,
        "kind": "ResourceClaim",
        "metadata": {"name": f"claim-{index}", "namespace": "default", "uid": f"uid-{index}"},
        "spec": {"devices": devices},
    }


@st.composite
def scenarios(draw: Draw) -> dict[str, Any]:
    """An allocate request for dra-oracle; our simulator reads the same objects."""
    chosen = draw(st.lists(st.sampled_from(PROFILES), min_size=1, max_size=2, unique=True))
    slices: list[dict[str, Any]] = []
    for profile, partitionable in chosen:
        for slice_ in _profile_slices(profile, partitionable):
            copied = copy.deepcopy(slice_)
            if len(chosen) > 1:
                copied["spec"]["pool"]["name"] = f"{NODE}-{profile}"
            slices.append(copied)
    devices = [(s, d) for s in slices for d in s["spec"].get("devices") or []]
    for _ in range(draw(st.integers(0, 3))):
        if not devices:
            break
        _, device = devices[draw(st.integers(0, len(devices) - 1))]
        device["taints"] = [
            {
                "key": draw(st.sampled_from(TAINT_KEYS)),
                "value": "true",
                "effect": draw(st.sampled_from(["NoSchedule", "NoExecute", "None"])),
                "timeAdded": "2026-01-01T00:00:00Z",
            }
        ]
    in_use = []
    for _ in range(draw(st.integers(0, 3))):
        if not devices:
            break
        slice_, device = devices[draw(st.integers(0, len(devices) - 1))]
        in_use.append((slice_["spec"]["pool"]["name"], device["name"]))
    allocated = []
    if in_use:
        allocated.append(
            {
                "apiVersion": V1,
                "kind": "ResourceClaim",
                "metadata": {"name": "held", "namespace": "default", "uid": "uid-held"},
                "spec": {
                    "devices": {"requests": [{"name": "held", "exactly": {"deviceClassName": CLASSES[0]}}]}
                },
                "status": {
                    "allocation": {
                        "devices": {
                            "results": [
                                {"request": "held", "driver": DRIVER, "pool": pool, "device": name}
                                for pool, name in sorted(set(in_use))
                            ]
                        }
                    }
                },
            }
        )
    return {
        "node": {"metadata": {"name": NODE}},
        "deviceClasses": list(device_classes()),
        "resourceSlices": slices,
        "claims": [draw(claims(i)) for i in range(draw(st.integers(1, 3)))],
        "allocatedClaims": allocated,
    }
