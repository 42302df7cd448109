"""GPU Feature Discovery node labels as CEL selectors on dradriver's attributes (pure).

GFD (NVIDIA/k8s-device-plugin, `internal/lm`) labels a node after its GPUs; a pod selecting on
`nvidia.com/gpu.product` really asks for a kind of GPU. With DRA the device is chosen, not the
node, so each label requirement becomes a CEL selector on the GPUs the pod's claim asks for:

| label | selector on |
|---|---|
| `nvidia.com/gpu.product` (spaces as `-`; MIG strategy single: `-MIG-<profile>`) | `productName`, `profile` |
| `nvidia.com/gpu.memory` (MiB) | the `memory` capacity of a full GPU |
| `nvidia.com/gpu.family` (from the compute capability) | `computeMajor`, `computeMinor` |
| `nvidia.com/gpu.compute.major`, `.minor` | `computeMajor`, `computeMinor` |
| `nvidia.com/cuda.driver-version.{major,minor,revision,full}` (and `cuda.driver.*`) | `driverVersion` |
| `nvidia.com/cuda.runtime-version.{major,minor,full}` (and `cuda.runtime.*`) | `cudaDriverVersion` |
| `nvidia.com/mig.capable` | `migCapable` (implied for MIG devices) |
| `nvidia.com/gpu.present` | nothing: implied by asking for a GPU |

Every other `nvidia.com/` label describes the node or the device plugin's set-up (count,
replicas, sharing strategy, MIG strategy, machine, clique, per-MIG-type counts) and has no
per-device equivalent: it is a problem, never dropped.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from dradriver.devicemodel.attributes import DeviceType
from dradriver.names import normalize_version

PREFIX = "nvidia.com/"

#: GFD's getArchFamily: compute capability -> family label value.
FAMILIES: dict[str, str] = {
    "tesla": "{major} == 1",
    "fermi": "{major} == 2",
    "kepler": "{major} == 3",
    "maxwell": "{major} == 5",
    "pascal": "{major} == 6",
    "volta": "{major} == 7 && {minor} < 5",
    "turing": "{major} == 7 && {minor} >= 5",
    "ampere": "{major} == 8 && {minor} < 9",
    "ada-lovelace": "{major} == 8 && {minor} >= 9",
    "hopper": "{major} == 9",
    "blackwell": "({major} == 10 || {major} == 12)",
    "rubin": "{major} == 13",
}
_INT_LABELS = {
    "gpu.compute.major": ("computeMajor", ""),
    "gpu.compute.minor": ("computeMinor", ""),
    "cuda.driver-version.major": ("driverVersion", ".major()"),
    "cuda.driver-version.minor": ("driverVersion", ".minor()"),
    "cuda.driver-version.revision": ("driverVersion", ".patch()"),
    "cuda.driver.major": ("driverVersion", ".major()"),
    "cuda.driver.minor": ("driverVersion", ".minor()"),
    "cuda.driver.rev": ("driverVersion", ".patch()"),
    "cuda.runtime-version.major": ("cudaDriverVersion", ".major()"),
    "cuda.runtime-version.minor": ("cudaDriverVersion", ".minor()"),
    "cuda.runtime.major": ("cudaDriverVersion", ".major()"),
    "cuda.runtime.minor": ("cudaDriverVersion", ".minor()"),
}
_VERSION_LABELS = {
    "cuda.driver-version.full": "driverVersion",
    "cuda.runtime-version.full": "cudaDriverVersion",
}


@dataclass(frozen=True)
class Requirement:
    """One node-label requirement (a nodeSelector entry is `In` with one value)."""

    key: str
    operator: str  # In | NotIn | Exists | DoesNotExist | Gt | Lt
    values: tuple[str, ...] = ()


@dataclass(frozen=True)
class Translated:
    """The CEL for one device type: an expression, or None when the requirement is implied."""

    expression: str | None
    note: str


def is_gfd(key: str) -> bool:
    return key.startswith(PREFIX)


def _string(value: str) -> str:
    return json.dumps(value)


def _values_test(subject: str, values: Sequence[str], operator: str) -> str:
    if len(values) == 1:
        test = f"{subject} == {values[0]}"
        return test if operator == "In" else f"{subject} != {values[0]}"
    listed = f"{subject} in [{', '.join(values)}]"
    return listed if operator == "In" else f"!({listed})"


def translate(req: Requirement, device_type: DeviceType, driver: str) -> Translated | str:
    """The selector for devices of `device_type`, or a problem saying why there is none."""
    attrs = f'device.attributes["{driver}"]'
    name = req.key.removeprefix(PREFIX)
    op, values = req.operator, req.values
    if name == "gpu.present":
        if op == "Exists" or (op == "In" and values == ("true",)):
            return Translated(None, "implied: the claim asks for a GPU")
        return "a pod asking for GPUs cannot avoid nodes with GPUs"
    if op == "DoesNotExist":
        return f"{req.key} DoesNotExist excludes every GPU node; no device selector can say that"
    if op == "Exists":
        return Translated(None, "every GPU has it")
    if op in ("Gt", "Lt"):
        return _compare(req, name, device_type, attrs, driver)
    if op not in ("In", "NotIn") or not values:
        return f"{req.key}: unsupported operator {op!r}"
    if name == "gpu.product":
        return _product(req, device_type, attrs)
    if name == "gpu.memory":
        return _memory(req, device_type, driver)
    if name == "gpu.family":
        return _family(req, attrs)
    if name in _INT_LABELS:
        if not all(v.isdigit() for v in values):
            return f"{req.key}: values must be integers"
        attribute, accessor = _INT_LABELS[name]
        return Translated(
            _values_test(f"{attrs}.{attribute}{accessor}", [str(int(v)) for v in values], op), ""
        )
    if name in _VERSION_LABELS:
        normalized = [normalize_version(v) for v in values]
        if any(n is None for n in normalized):
            return f"{req.key}: {values} is not a version"
        semvers = [f'semver("{n}")' for n in normalized]
        return Translated(_values_test(f"{attrs}.{_VERSION_LABELS[name]}", semvers, op), "")
    if name == "mig.capable":
        return _mig_capable(req, device_type, attrs)
    return (
        f"{req.key} describes the node or the device plugin's set-up, not a GPU: no device attribute "
        "corresponds to it"
    )


_MIG_MEMORY = "gpu.memory is the full GPU's memory; MIG devices publish their own (select on profile)"


def _compare(
    req: Requirement, name: str, device_type: DeviceType, attrs: str, driver: str
) -> Translated | str:
    """`Gt` and `Lt`: on the GPU's memory (MiB) or an integer attribute."""
    values = req.values
    if len(values) != 1 or not values[0].lstrip("-").isdigit():
        return f"{req.key} {req.operator} needs one integer value"
    relation = ">" if req.operator == "Gt" else "<"
    number = int(values[0])
    if name == "gpu.memory":
        if device_type == "mig":
            return _MIG_MEMORY
        quantity = f'quantity("{number}Mi")'
        return Translated(f'device.capacity["{driver}"].memory.compareTo({quantity}) {relation} 0', "")
    if name in _INT_LABELS:
        attribute, accessor = _INT_LABELS[name]
        return Translated(f"{attrs}.{attribute}{accessor} {relation} {number}", "")
    return f"{req.key} {req.operator}: no numeric device attribute corresponds to this label"


def _memory(req: Requirement, device_type: DeviceType, driver: str) -> Translated | str:
    if device_type == "mig":
        return _MIG_MEMORY
    if not all(v.isdigit() for v in req.values):
        return f"{req.key}: values must be MiB counts"
    tests = [f'device.capacity["{driver}"].memory.compareTo(quantity("{v}Mi")) == 0' for v in req.values]
    joined = " || ".join(tests) if len(tests) > 1 else tests[0]
    return Translated(joined if req.operator == "In" else f"!({joined})", "")


def _family(req: Requirement, attrs: str) -> Translated | str:
    unknown = [v for v in req.values if v not in FAMILIES]
    if unknown:
        return f"{req.key}: unknown GPU family {unknown[0]!r} (GFD families: {', '.join(FAMILIES)})"
    tests = [
        FAMILIES[v].format(major=f"{attrs}.computeMajor", minor=f"{attrs}.computeMinor") for v in req.values
    ]
    joined = " || ".join(f"({t})" for t in tests) if len(tests) > 1 else tests[0]
    return Translated(joined if req.operator == "In" else f"!({joined})", "GFD derives the family from these")


def _mig_capable(req: Requirement, device_type: DeviceType, attrs: str) -> Translated | str:
    if req.values not in (("true",), ("false",)):
        return f"{req.key}: values must be true or false"
    wanted = (req.values[0] == "true") == (req.operator == "In")
    if device_type == "mig":
        if wanted:
            return Translated(None, "implied: MIG devices are on MIG-capable GPUs")
        return "asks for GPUs that are not MIG-capable but the request is for a MIG device"
    return Translated(f"{attrs}.migCapable == {'true' if wanted else 'false'}", "")


def _product(req: Requirement, device_type: DeviceType, attrs: str) -> Translated | str:
    """GFD's product label is the product name with spaces as `-` (characters outside
    [A-Za-z0-9-_. ] dropped), plus `-MIG-<profile>` under MIG strategy single, or `-SHARED`."""
    products: list[str] = []
    profiles: list[str] = []
    for value in req.values:
        if value.endswith("-SHARED"):
            return f"{req.key}={value} selects GPUs the device plugin time-slices: no equivalent"
        product, mig, profile = value.partition("-MIG-")
        products.append(product)
        profiles.append(profile if mig else "")
    if any(profiles) and device_type != "mig":
        named = ", ".join(p for p in profiles if p)
        return f"{req.key} names MIG profiles ({named}) but the request is for full GPUs"
    subject = f'{attrs}.productName.replace(" ", "-")'
    if not any(profiles):
        return Translated(
            _values_test(subject, [_string(p) for p in products], req.operator), "GFD writes spaces as '-'"
        )
    tests = [
        f"{subject} == {_string(p)}" + (f" && {attrs}.profile == {_string(m)}" if m else "")
        for p, m in zip(products, profiles, strict=True)
    ]
    joined = " || ".join(f"({t})" for t in tests) if len(tests) > 1 else tests[0]
    return Translated(joined if req.operator == "In" else f"!({joined})", "GFD writes spaces as '-'")
