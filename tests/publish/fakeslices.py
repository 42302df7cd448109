"""Desired ResourceSlices built by hand, standing in for the renderer in publishing tests."""

from __future__ import annotations

from typing import Any

Json = dict[str, Any]

MAX_DEVICES = 128
MAX_DEVICES_ADVANCED = 64


def fake_devices(
    count: int, *, taint: bool = False, counters: bool = False, memory: str = "80Gi"
) -> list[Json]:
    devices = []
    for i in range(count):
        device: Json = {
            "name": f"gpu-{i}",
            "attributes": {"index": {"int": i}, "productName": {"string": "NVIDIA H100 80GB HBM3"}},
            "capacity": {"memory": {"value": memory}},
        }
        if taint:
            device["taints"] = [
                {"key": "gpu.dradriver.dev/unhealthy", "value": "xid-79", "effect": "NoSchedule"}
            ]
        if counters:
            device["consumesCounters"] = [
                {"counterSet": "gpu-counters", "counters": {"memory": {"value": memory}}}
            ]
        devices.append(device)
    return devices


def desired_slices(devices: list[Json], *, driver: str, node: str, counters: bool = False) -> list[Json]:
    """Slices of at most 128 devices (64 when any has taints or counters), in the shape the
    renderer produces; with `counters`, a leading slice carries the shared counter set."""
    advanced = any(d.get("taints") or d.get("consumesCounters") for d in devices)
    size = MAX_DEVICES_ADVANCED if advanced else MAX_DEVICES
    chunks: list[Json] = [{"devices": devices[i : i + size]} for i in range(0, len(devices), size)] or [
        {"devices": []}
    ]
    if counters:
        total = f"{80 * len(devices)}Gi"
        chunks.insert(
            0, {"sharedCounters": [{"name": "gpu-counters", "counters": {"memory": {"value": total}}}]}
        )
    width = max(5, len(format(len(chunks) - 1, "x")))
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"generateName": f"{i:0{width}x}-{driver}-{node}-"},
            "spec": {
                "driver": driver,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": len(chunks)},
                **chunk,
            },
        }
        for i, chunk in enumerate(chunks)
    ]
