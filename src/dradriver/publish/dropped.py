"""Which feature gates are probably off, judging by the fields the API server dropped from a slice.

An apiserver with a DRA gate off accepts a slice but silently strips the gated fields. Comparing
what we wrote with what was stored tells which gate to name in the report (the same guesses as
upstream's DroppedFieldsError). The controller then adopts the stored form, so it does not
update the slice again and again.
"""

from __future__ import annotations

from typing import Any

Json = dict[str, Any]


def dropped_features(desired: Json, stored: Json) -> list[str]:
    """Gate names that explain the differences between a desired and a stored slice spec."""
    pairs = list(zip(desired.get("devices") or [], stored.get("devices") or [], strict=False))
    gates = []
    if any(len(_list(d, "taints")) > len(_list(s, "taints")) for d, s in pairs):
        gates.append("DRADeviceTaints")
    if (
        (desired.get("perDeviceNodeSelection") and not stored.get("perDeviceNodeSelection"))
        or len(_list(desired, "sharedCounters")) > len(_list(stored, "sharedCounters"))
        or any(len(_list(d, "consumesCounters")) != len(_list(s, "consumesCounters")) for d, s in pairs)
    ):
        gates.append("DRAPartitionableDevices")
    if any(
        len(_list(d, "bindingConditions")) != len(_list(s, "bindingConditions"))
        or len(_list(d, "bindingFailureConditions")) != len(_list(s, "bindingFailureConditions"))
        for d, s in pairs
    ):
        gates.append("DRADeviceBindingConditions")
    if any(
        d.get("allowMultipleAllocations") is not None and s.get("allowMultipleAllocations") is None
        for d, s in pairs
    ):
        gates.append("DRAConsumableCapacity")
    return gates


def dropped_message(slice_index: int, gates: list[str]) -> str:
    names = " ".join(gates) if gates else "unknown"
    return (
        f"ResourceSlice #{slice_index}: the API server dropped some fields, probably because these "
        f"feature gates are disabled: {names}; publishing what it stores instead"
    )


def _list(obj: Json, key: str) -> list[Any]:
    value = obj.get(key)
    return value if isinstance(value, list) else []
