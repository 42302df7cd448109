"""Device-plugin ResourceQuotas rewritten for DRA (pure, no I/O).

The device plugin's `requests.nvidia.com/gpu` (or `limits.`, or the bare name) counted every GPU
a pod asked for; DRA counts the devices claims request per DeviceClass, under
`<class>.deviceclass.resource.k8s.io/devices`, and nothing else. So a GPU cap becomes a cap on
the class migrated workloads use (dradriver's GPU class) and 0 for every other class dradriver
ships that hands out full GPUs (each would be a way around it). `nvidia.com/mig-<profile>` caps
become a cap on the profile's class (deviceclasses/optional/) and, since migrated workloads ask
`mig.<driver>` with a profile selector, their sum on the MIG class.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dradriver.offline.quota import devices_name
from dradriver.quantity import Quantity, QuantityError

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
_PREFIXES = ("requests.", "limits.", "")


def _split(key: str) -> tuple[str, str] | None:
    """(prefix, resource) for a key naming the device plugin's resources, else None."""
    for prefix in _PREFIXES:
        name = key.removeprefix(prefix) if prefix else key
        if (prefix == "" or key.startswith(prefix)) and (
            name == GPU_RESOURCE or name.startswith(MIG_RESOURCE_PREFIX)
        ):
            return prefix, name
    return None


def resource_quota(  # noqa: PLR0917 - the quota, where its changes go, and what dradriver ships
    obj: dict[str, Any],
    out: Any,
    gpu_class: str,
    mig_class: str,
    other_gpu_classes: Sequence[str],
    mig_profile_classes: Mapping[str, str],
) -> None:
    """Rewrite `obj`'s spec.hard in place, recording each change (and problem) in `out`."""
    spec = obj.get("spec")
    hard = spec.get("hard") if isinstance(spec, dict) else None
    if not isinstance(hard, dict):
        return
    caps: dict[str, tuple[Quantity, str]] = {}
    for key in list(hard):
        split = _split(key)
        if split is None:
            continue
        _prefix, resource = split
        where = f"spec.hard[{key}]"
        try:
            value = Quantity.parse(str(hard[key]))
        except QuantityError as err:
            out.problem(where, f"{hard[key]!r}: {err}")
            continue
        before = caps.get(resource)
        if before is None or value.compare(before[0]) < 0:
            caps[resource] = (value, key)  # of requests. and limits., the stricter
        if key != f"requests.{GPU_RESOURCE}":
            out.change(where, hard.pop(key), None, "replaced by the DeviceClass entries")
    for resource, (value, key) in caps.items():
        if resource == GPU_RESOURCE:
            _gpu(hard, out, key, value, gpu_class, other_gpu_classes)
    mig = {r.removeprefix(MIG_RESOURCE_PREFIX): cap for r, cap in caps.items() if r != GPU_RESOURCE}
    if mig:
        _mig(hard, out, mig, mig_class, mig_profile_classes)


def _set(hard: dict[str, Any], out: Any, entry: str, value: str, reason: str) -> None:
    before = hard.get(entry)
    hard[entry] = value
    if before != value:
        out.change(f"spec.hard[{entry}]", before, value, reason)


def _gpu(  # noqa: PLR0917 - one quota entry and the classes it becomes
    hard: dict[str, Any], out: Any, key: str, value: Quantity, gpu_class: str, others: Sequence[str]
) -> None:
    text = value.canonical()
    _set(
        hard,
        out,
        devices_name(gpu_class),
        text,
        f"{key}: migrated workloads claim GPUs of {gpu_class}, and a quota counts claimed devices per "
        "DeviceClass",
    )
    kept = f"requests.{GPU_RESOURCE}"
    if kept in hard:
        out.change(
            f"spec.hard[{kept}]",
            hard[kept],
            hard[kept],
            "kept: it still counts pods asking nvidia.com/gpu (where a device plugin runs, or through "
            "extended-resource.yaml)",
        )
    for i, cls in enumerate(others):
        reason = (
            f"closed: {key} capped every GPU, but a quota counts each class by its name and leaves any "
            f"other class uncapped; give a class part of the {text} to let the namespace use it"
            if i == 0
            else "closed, as above"
        )
        _set(hard, out, devices_name(cls), "0", reason)


def _mig(
    hard: dict[str, Any],
    out: Any,
    profiles: Mapping[str, tuple[Quantity, str]],
    mig_class: str,
    profile_classes: Mapping[str, str],
) -> None:
    total = Quantity.parse("0")
    for profile, (value, key) in sorted(profiles.items()):
        total = total.add(value)
        cls = profile_classes.get(profile)
        if cls is None:
            continue  # counted in the MIG class's total only, as its reason says
        _set(
            hard,
            out,
            devices_name(cls),
            value.canonical(),
            f"{key}: the class of MIG devices of {profile} (deviceclasses/optional/mig-profiles.yaml)",
        )
    missing = sorted(p for p in profiles if p not in profile_classes)
    _set(
        hard,
        out,
        devices_name(mig_class),
        total.canonical(),
        f"migrated workloads claim MIG devices of {mig_class} with a profile selector, which a quota "
        "cannot see: the profiles' total caps them"
        + (f" ({', '.join(missing)}: no class of its own, counted here only)" if missing else ""),
    )
