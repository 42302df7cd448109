"""Devices -> the ResourceSlice objects of one node-local pool (pure).

Mirrors what the Go publishing helper (k8s.io/dynamic-resource-allocation/resourceslice, 1.36)
would create for a Node-owned pool: one pool named after the node, `generateName`
`<index>-<driver>-<node>-` with the slice index in lowercase hex (at least 5 digits; slice order
is allocation priority), `spec.pool.resourceSliceCount` on every slice. Devices are split at
128 per slice, 64 when any device uses counters or taints; counter sets go into slices of their
own (at most 8 per slice), as Kubernetes 1.35+ requires. Owner references are the publisher's job.
"""

from __future__ import annotations

from typing import Any

from dradriver.devicemodel import DeviceSet
from dradriver.names import DNS_SUBDOMAIN_MAX
from dradriver.slices.rules import API_VERSION, KIND, MAX_COUNTER_SETS, MAX_DEVICES, MAX_DEVICES_ADVANCED

#: Minimum width of the hex slice index in generateName (upstream resourceSliceIndexMinLength).
INDEX_MIN_WIDTH = 5


def _chunks(items: tuple[Any, ...], size: int) -> list[tuple[Any, ...]]:
    return [items[start : start + size] for start in range(0, len(items), size)]


def _uses_advanced_features(device: dict[str, Any]) -> bool:
    return bool(device.get("consumesCounters") or device.get("taints"))


def slice_name_prefix(index: int, slice_count: int, *, driver_name: str, node_name: str) -> str:
    """generateName of slice `index` of `slice_count`: `00000-gpu.dradriver.dev-node-1-`.

    Node names may be up to 253 characters, which would make the prefix longer than a name may
    be; the API server keeps only the first 58 characters of a prefix anyway, so it is cut to
    stay valid (only the leading index matters for matching slices).
    """
    width = max(INDEX_MIN_WIDTH, len(f"{max(slice_count - 1, 0):x}"))
    prefix = f"{index:0{width}x}-{driver_name}-{node_name}-"
    if len(prefix) > DNS_SUBDOMAIN_MAX:
        prefix = prefix[: DNS_SUBDOMAIN_MAX - 1].rstrip(".-") + "-"
    return prefix


def render_slices(
    device_set: DeviceSet, *, node_name: str, driver_name: str, generation: int = 1
) -> list[dict[str, Any]]:
    """The full ResourceSlice objects for the node's pool, in stable order.

    A node without devices still gets one empty slice: an empty pool tells the scheduler the
    driver runs here and has nothing, which differs from no pool at all.
    The device JSON is shared with `device_set`, not copied; treat the result as read-only
    below `metadata`.
    """
    if driver_name != device_set.driver_name:
        raise ValueError(
            f"devices were built for driver {device_set.driver_name!r}, not {driver_name!r}: "
            "bare attribute names belong to the driver's domain"
        )
    devices = tuple(device.json for device in device_set.devices)
    limit = MAX_DEVICES_ADVANCED if any(map(_uses_advanced_features, devices)) else MAX_DEVICES
    parts: list[dict[str, Any]] = [{"devices": list(chunk)} for chunk in _chunks(devices, limit)]
    parts += [{"sharedCounters": list(chunk)} for chunk in _chunks(device_set.counter_sets, MAX_COUNTER_SETS)]
    if not parts:
        parts = [{"devices": []}]
    pool = {"name": node_name, "generation": generation, "resourceSliceCount": len(parts)}
    return [
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {
                "generateName": slice_name_prefix(
                    index, len(parts), driver_name=driver_name, node_name=node_name
                )
            },
            "spec": {"driver": driver_name, "nodeName": node_name, "pool": dict(pool), **part},
        }
        for index, part in enumerate(parts)
    ]
