"""What the API server changed in a slice it stored: dropped, changed or added fields.

An API server with a feature gate off silently drops the fields that feature adds (counters,
taints, ...) instead of rejecting the object, and the scheduler then sees different devices
than we meant to publish. Comparing what was sent with what was stored turns that into a
finding that names the likely gate.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dradriver.slices.rules import Finding, field_key

#: Fields a disabled feature gate makes the API server drop (as upstream's DroppedFieldsError names them).
FIELD_GATES = {
    "sharedCounters": "DRAPartitionableDevices",
    "consumesCounters": "DRAPartitionableDevices",
    "perDeviceNodeSelection": "DRAPartitionableDevices",
    "taints": "DRADeviceTaints",
    "bindsToNode": "DRADeviceBindingConditions",
    "bindingConditions": "DRADeviceBindingConditions",
    "bindingFailureConditions": "DRADeviceBindingConditions",
    "allowMultipleAllocations": "DRAConsumableCapacity",
    "requestPolicy": "DRAConsumableCapacity",
    "ints": "DRAListTypeAttributes",
    "bools": "DRAListTypeAttributes",
    "strings": "DRAListTypeAttributes",
    "versions": "DRAListTypeAttributes",
    "nodeAllocatableResources": "DRANodeAllocatableResources",
    "partitionTypeAttribute": "DRAPartitionableDevicesType",
    "skipNodeOperations": "DRAOptionalNodeOperations",
}


def _empty(value: Any) -> bool:
    """Absent, null and empty collections are the same on the wire (Go's omitempty)."""
    return value is None or value in ([], {})


def _dropped(key: str, path: str) -> Finding:
    gate = FIELD_GATES.get(key)
    why = f"; is the {gate} feature gate off?" if gate else ""
    return Finding(path, f"dropped by the API server{why}")


def _compare(sent: Any, stored: Any, path: str, out: list[Finding]) -> None:
    if isinstance(sent, Mapping) and isinstance(stored, Mapping):
        for key in [*sent, *(k for k in stored if k not in sent)]:
            child = field_key(path, str(key))
            mine, theirs = sent.get(key), stored.get(key)
            if _empty(mine) and _empty(theirs):
                continue
            if _empty(theirs):
                out.append(_dropped(str(key), child))
            elif _empty(mine):
                out.append(Finding(child, f"added by the API server: {theirs!r}"))
            else:
                _compare(mine, theirs, child, out)
    elif isinstance(sent, list) and isinstance(stored, list) and len(sent) == len(stored):
        for index, (mine, theirs) in enumerate(zip(sent, stored, strict=True)):
            _compare(mine, theirs, f"{path}[{index}]", out)
    elif sent != stored:
        out.append(Finding(path, f"stored as {stored!r}, sent {sent!r}"))


def stored_differences(sent: Mapping[str, Any], stored: Mapping[str, Any]) -> list[Finding]:
    """Differences in `spec` between a slice as sent and as the API server returned it."""
    out: list[Finding] = []
    _compare(sent.get("spec"), stored.get("spec"), ".spec", out)
    return out


def dropped_gates(sent_spec: Mapping[str, Any], stored_spec: Mapping[str, Any]) -> list[str]:
    """The feature gates that explain fields the API server dropped from a slice spec, sorted."""
    found: list[Finding] = []
    _compare(sent_spec, stored_spec, ".spec", found)
    return sorted(
        {
            gate
            for finding in found
            if finding.message.startswith("dropped")
            for key, gate in FIELD_GATES.items()
            if finding.path.rsplit(".", 1)[-1].split("[", 1)[0] == key
        }
    )
