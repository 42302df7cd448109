"""Device taints for unhealthy devices, and the device set with them applied (pure).

One taint per unhealthy device, `<driver>/unhealthy=<reason>:<effect>`: the reason is the XID
number, `gpu-lost`, `temperature` or `ecc`. The scheduler allocates a tainted device only to a
claim that tolerates the taint; with `NoExecute` the pods already using it are evicted too.
The taint goes away when the device is healthy again. `timeAdded` is left to the API server,
which sets it when the taint first appears and keeps it while the taint stays.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from dradriver.devicemodel import DeviceSet
from dradriver.health.policy import Problem

Json = dict[str, Any]


def taint_key(driver_name: str) -> str:
    return f"{driver_name}/unhealthy"


def device_taint(driver_name: str, problem: Problem, effect: str) -> Json:
    return {"key": taint_key(driver_name), "value": problem.reason, "effect": effect}


def describe_taint(taint: Json) -> str:
    """`gpu.dradriver.dev/unhealthy=79:NoSchedule`, as kubectl writes taints."""
    return f"{taint['key']}={taint['value']}:{taint['effect']}"


def with_taints(device_set: DeviceSet, taints: Mapping[str, Json]) -> DeviceSet:
    """`device_set` with each named device carrying its taint; the input is not modified."""
    if not taints:
        return device_set
    devices = tuple(
        replace(d, json={**d.json, "taints": [taints[d.name]]}) if d.name in taints else d
        for d in device_set.devices
    )
    return replace(device_set, devices=devices)
