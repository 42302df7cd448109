"""A hypothesis strategy for allocation scenarios: what dradriver publishes, plus claims to place.

Slices come from the fake profiles through the real slice builder (full GPUs, MIG devices,
partitionable placements with shared counters), with taints added to some devices; classes are
the repository's DeviceClasses; claims use ExactCount and All, firstAvailable, matchAttribute and
distinctAttribute, adminAccess, tolerations, consumable capacity requests and several claims at
once; some devices are shared (allowMultipleAllocations, with or without request policies), and
some are already held by an allocated claim, whole or as a share of their capacity.
"""

from __future__ import annotations

import copy
import functools
import uuid
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st

from tests.offline.cel.selector_strategy import DRIVER, Draw

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
    "resource.kubernetes.io/numaNode",
    f"{DRIVER}/cudaComputeCapability",
)
TAINT_KEYS = ("gpu.dradriver.dev/unhealthy", "gpu.dradriver.dev/maintenance")
MIB = 1024 * 1024
# Capacity requests: rounded up by policies, too large, unknown, or named with the driver's domain
# (which 1.36 does not match to a bare capacity name).
MEMORY_REQUESTS = ("512Mi", "1Gi", "1500Mi", "3Gi", "6Gi", "20Gi", "100Gi")
CAPACITY_REQUESTS = (
    ("multiprocessors", ("1", "10", "70")),
    ("copyEngines", ("1", "2")),
    ("bandwidth", ("1",)),
    (f"{DRIVER}/memory", ("1Gi",)),
)


@functools.cache
def profile_slices(profile: str, partitionable: bool) -> tuple[dict[str, Any], ...]:
    from dradriver.slices import build_node_slices

    slices = build_node_slices(profile, node_name=NODE, driver_name=DRIVER, partitionable=partitionable)
    for index, slice_ in enumerate(slices):
        # Named as the API server names generated objects; both allocators order slices by name.
        slice_["metadata"] = {"name": f"{NODE}-{profile}-{index:02d}"}
    return tuple(slices)


@functools.cache
def device_classes() -> tuple[dict[str, Any], ...]:
    directory = Path(__file__).resolve().parents[3] / "deviceclasses"
    out = []
    for path in sorted(directory.glob("*.yaml")):
        for obj in yaml.safe_load_all(path.read_text()):
            obj["spec"].pop("extendedResourceName", None)
            out.append(obj)
    return tuple(out)


def _quantity(text: str) -> int:
    units = {"Ki": 1024, "Mi": MIB, "Gi": 1024 * MIB}
    return int(text[:-2]) * units[text[-2:]] if text[-2:] in units else int(text)


def _policy(draw: Draw, value: int, unit: int) -> dict[str, Any] | None:
    """A valid request policy for a capacity of `value` (in units of `unit`)."""
    kind = draw(st.sampled_from(["none", "range", "range", "values"]))
    suffix = "Gi" if unit > 1 else ""
    if kind == "none" or value < 2 * unit:
        return None
    if kind == "range":
        bounds: dict[str, str] = {"min": f"1{suffix}"}
        policy: dict[str, Any] = {"default": f"{draw(st.integers(1, 2))}{suffix}", "validRange": bounds}
        if draw(st.booleans()):
            bounds["step"] = f"1{suffix}"
        top = value // unit
        if top >= 2 and draw(st.booleans()):
            bounds["max"] = f"{draw(st.integers(2, min(top, 8)))}{suffix}"
        return policy
    options = [o for o in (1, 2, 4, 8) if o * unit <= value]
    return {"default": f"1{suffix}", "validValues": [f"{o}{suffix}" for o in options]}


def _share(draw: Draw, device: dict[str, Any]) -> None:
    """Make a device shareable; its capacities may get request policies (one without a policy
    is consumed whole by every allocation that does not ask for less)."""
    device["allowMultipleAllocations"] = True
    for name, capacity in (device.get("capacity") or {}).items():
        unit = 1024 * MIB if name == "memory" else 1
        if draw(st.integers(0, 4)) and (policy := _policy(draw, _quantity(capacity["value"]), unit)):
            capacity["requestPolicy"] = policy


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
    if draw(st.integers(0, 2)) == 0:
        requests = {"memory": draw(st.sampled_from(MEMORY_REQUESTS))}
        if draw(st.integers(0, 2)) == 0:
            name, values = draw(st.sampled_from(CAPACITY_REQUESTS))
            requests[name] = draw(st.sampled_from(values))
        body["capacity"] = {"requests": requests}
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


def _held(pool: str, name: str, shared: bool, draw: Draw) -> dict[str, Any]:
    result: dict[str, Any] = {"request": "held", "driver": DRIVER, "pool": pool, "device": name}
    if shared:
        result["shareID"] = str(uuid.UUID(int=draw(st.integers(1, 2**64))))
        result["consumedCapacity"] = {"memory": draw(st.sampled_from(["1Gi", "2Gi", "10Gi"]))}
    return result


@st.composite
def scenarios(draw: Draw) -> dict[str, Any]:
    """An allocate request for dra-oracle; our simulator reads the same objects."""
    # Sharing every device multiplies the combinations the exhaustive search tries; one profile
    # and at most two claims keep such scenarios within the scheduler's time limit.
    sharing = draw(st.integers(0, 3)) == 0
    chosen = draw(st.lists(st.sampled_from(PROFILES), min_size=1, max_size=1 if sharing else 2, unique=True))
    slices: list[dict[str, Any]] = []
    for profile, partitionable in chosen:
        for slice_ in profile_slices(profile, partitionable):
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
    if sharing:
        for _, device in devices:
            _share(draw, device)
    for _ in range(draw(st.sampled_from([0, 1, 2, 4]))):
        if not devices:
            break
        # Mostly among the first devices, which the allocator tries first.
        _, device = devices[draw(st.integers(0, min(len(devices), 6) - 1))]
        _share(draw, device)
    in_use = []
    for _ in range(draw(st.integers(0, 3))):
        if not devices:
            break
        slice_, device = devices[draw(st.integers(0, len(devices) - 1))]
        shared = bool(device.get("allowMultipleAllocations"))
        in_use.append((slice_["spec"]["pool"]["name"], device["name"], shared))
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
                                _held(pool, name, bool(shared), draw)
                                for pool, name, shared in sorted(set(in_use))
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
        "claims": [draw(claims(i)) for i in range(draw(st.integers(1, 2 if sharing else 3)))],
        "allocatedClaims": allocated,
    }
