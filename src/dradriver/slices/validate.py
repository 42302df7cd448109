"""The API server's ResourceSlice validation (resource.k8s.io/v1, Kubernetes 1.35/1.36), restated.

Run on everything we render, before anything is published: a slice the API server would
reject, or a pool the scheduler would treat as invalid, is reported here with a path like
`[0].spec.devices[3].attributes.productName` and the API server's reason. Works on plain
JSON-like data (what `render_slices` returns, or YAML a user wrote), never raises on bad shapes.
Checks per slice follow `validateResourceSliceSpec` upstream; checks across slices follow
what the scheduler and the Go publishing helper require of a pool.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from dradriver.names import dns_subdomain_error, driver_name_error, fully_qualified_name_error
from dradriver.slices.device_rules import (
    LIST_ATTRIBUTE_TYPES,
    counter_lists,
    device_findings,
    node_selection,
)
from dradriver.slices.rules import (
    API_VERSION,
    KIND,
    MAX_COUNTER_SETS,
    MAX_DEVICES,
    MAX_DEVICES_ADVANCED,
    POOL_NAME_MAX,
    Finding,
    checked,
    field_key,
    is_int,
    required_string,
    unknown_keys,
)

__all__ = ["Finding", "validate_node_pool", "validate_slice", "validate_slices"]

_SLICE_KEYS = {"apiVersion", "kind", "metadata", "spec"}
_SPEC_KEYS = {
    "driver",
    "pool",
    "nodeName",
    "nodeSelector",
    "allNodes",
    "perDeviceNodeSelection",
    "devices",
    "sharedCounters",
    # 1.37 alpha (gates DRAPartitionableDevicesType, DRAOptionalNodeOperations).
    "partitionTypeAttribute",
    "skipNodeOperations",
}
#: What a slice may let the kubelet skip; NodePrepareResources only together with its undo.
_SKIP_ALL, _SKIP_PREPARE, _SKIP_UNPREPARE = "*", "NodePrepareResources", "NodeUnprepareResources"
_SKIP_OPERATIONS = (_SKIP_ALL, _SKIP_PREPARE, _SKIP_UNPREPARE)
_POOL_KEYS = {"name", "generation", "resourceSliceCount"}


def _pool(pool: Any, path: str) -> Iterator[Finding]:
    if not isinstance(pool, Mapping):
        yield Finding(path, "Required value")
        return
    yield from unknown_keys(pool, _POOL_KEYS, path)
    name = pool.get("name")
    if not isinstance(name, str) or not name:
        yield Finding(f"{path}.name", "Required value")
    else:
        if len(name) > POOL_NAME_MAX:
            yield Finding(f"{path}.name", f"must be no more than {POOL_NAME_MAX} characters")
        for part in name.split("/"):
            yield from checked(dns_subdomain_error(part), f"{path}.name")
    generation: Any = pool.get("generation", 0)
    if not is_int(generation) or generation < 0:
        yield Finding(f"{path}.generation", "must be greater than or equal to zero")
    count: Any = pool.get("resourceSliceCount")
    if not is_int(count) or count <= 0:
        yield Finding(f"{path}.resourceSliceCount", "must be greater than zero")


def _metadata(metadata: Any, path: str) -> Iterator[Finding]:
    if not isinstance(metadata, Mapping):
        yield Finding(path, "Required value")
        return
    name, generate_name = metadata.get("name"), metadata.get("generateName")
    if not name and not generate_name:
        yield Finding(f"{path}.name", "name or generateName is required")
    if name:
        yield from checked(dns_subdomain_error(str(name)), f"{path}.name")
    if generate_name:
        # As the API server does: a trailing dash is fine in a prefix.
        text = str(generate_name)
        yield from checked(
            dns_subdomain_error(text[:-1] + "a" if text.endswith("-") else text), f"{path}.generateName"
        )


def _devices_limit(devices: list[Any]) -> int:
    for device in devices:
        if not isinstance(device, Mapping):
            continue
        attributes = device.get("attributes")
        has_lists = isinstance(attributes, Mapping) and any(
            isinstance(v, Mapping) and any(k in v for k in LIST_ATTRIBUTE_TYPES) for v in attributes.values()
        )
        if device.get("taints") or device.get("consumesCounters") or has_lists:
            return MAX_DEVICES_ADVANCED
    return MAX_DEVICES


def validate_slice(obj: Any, path: str = "") -> list[Finding]:
    """Everything the API server would reject in one ResourceSlice object."""
    return list(_slice(obj, path))


def _slice(obj: Any, path: str) -> Iterator[Finding]:
    if not isinstance(obj, Mapping):
        yield Finding(path or ".", "must be a ResourceSlice object")
        return
    yield from unknown_keys(obj, _SLICE_KEYS, path)
    if obj.get("apiVersion") != API_VERSION:
        yield Finding(f"{path}.apiVersion", f"must be {API_VERSION}")
    if obj.get("kind") != KIND:
        yield Finding(f"{path}.kind", f"must be {KIND}")
    yield from _metadata(obj.get("metadata"), f"{path}.metadata")
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        yield Finding(f"{path}.spec", "Required value")
        return
    path = f"{path}.spec"
    yield from unknown_keys(spec, _SPEC_KEYS, path)
    yield from required_string(spec, "driver", path, driver_name_error)
    yield from _pool(spec.get("pool"), f"{path}.pool")
    yield from node_selection(spec, path, per_device=False)
    if spec.get("devices") is not None and spec.get("sharedCounters") is not None:
        yield Finding(path, "only one of `sharedCounters` or `devices` is allowed")
    devices = spec.get("devices")
    if devices is not None:
        if not isinstance(devices, list):
            yield Finding(f"{path}.devices", "must be a list")
        elif len(devices) > (limit := _devices_limit(devices)):
            why = "" if limit == MAX_DEVICES else " when devices use taints, counters or list attributes"
            yield Finding(
                f"{path}.devices", f"Too many: {len(devices)}: must have at most {limit} items{why}"
            )
        else:
            names: set[str] = set()
            for index, device in enumerate(devices):
                yield from device_findings(
                    device, f"{path}.devices[{index}]", spec.get("perDeviceNodeSelection") is True
                )
                name = device.get("name") if isinstance(device, Mapping) else None
                if isinstance(name, str) and name in names:
                    yield Finding(f"{path}.devices[{index}]", f"Duplicate value: device name {name!r}")
                names.add(str(name))
    yield from _counter_sets(spec.get("sharedCounters"), f"{path}.sharedCounters")
    if (partition_type := spec.get("partitionTypeAttribute")) is not None:
        where = f"{path}.partitionTypeAttribute"
        if not isinstance(partition_type, str):
            yield Finding(where, "must be a string")
        else:
            yield from checked(fully_qualified_name_error(partition_type), where)
    yield from _skip_operations(spec.get("skipNodeOperations"), f"{path}.skipNodeOperations")


def _skip_operations(value: Any, path: str) -> Iterator[Finding]:
    if value is None:
        return
    if not isinstance(value, list):
        yield Finding(path, "must be a list")
        return
    for index, item in enumerate(value):
        if item not in _SKIP_OPERATIONS:
            supported = ", ".join(f'"{s}"' for s in _SKIP_OPERATIONS)
            yield Finding(f"{path}[{index}]", f"Unsupported value: {item!r}: supported values: {supported}")
        elif item in value[:index]:
            yield Finding(f"{path}[{index}]", f"Duplicate value: {item!r}")
    if _SKIP_PREPARE in value and not any(v in (_SKIP_ALL, _SKIP_UNPREPARE) for v in value):
        yield Finding(path, f'"{_SKIP_PREPARE}" requires "{_SKIP_UNPREPARE}" (or "*")')


def _counter_sets(counter_sets: Any, path: str) -> Iterator[Finding]:
    yield from counter_lists(counter_sets, path, name_key="name", limit=MAX_COUNTER_SETS)


def _pool_checks(slices: Sequence[Any]) -> Iterator[Finding]:
    """What makes a pool incomplete or invalid for the scheduler, across its slices."""
    pools: dict[tuple[str, str], list[tuple[int, Mapping[str, Any]]]] = {}
    for index, obj in enumerate(slices):
        spec = obj.get("spec") if isinstance(obj, Mapping) else None
        if not isinstance(spec, Mapping):
            continue
        pool = spec.get("pool")
        if isinstance(pool, Mapping) and isinstance(pool.get("name"), str):
            pools.setdefault((str(spec.get("driver")), pool["name"]), []).append((index, spec))
    for (driver, pool_name), members in pools.items():
        generations = {spec["pool"].get("generation", 0) for _, spec in members}
        counts = {spec["pool"].get("resourceSliceCount") for _, spec in members}
        first = members[0][0]
        if len(generations) > 1:
            yield Finding(
                f"[{first}].spec.pool.generation",
                f"pool {pool_name!r} mixes generations {sorted(generations)}",
            )
        if len(counts) > 1:
            yield Finding(
                f"[{first}].spec.pool.resourceSliceCount",
                f"pool {pool_name!r} disagrees on resourceSliceCount",
            )
        elif counts and (count := counts.pop()) != len(members) and is_int(count):
            yield Finding(
                f"[{first}].spec.pool.resourceSliceCount",
                f"pool {pool_name!r} has {len(members)} slices but resourceSliceCount {count}; "
                "the scheduler treats it as incomplete",
            )
        yield from _pool_devices(driver, pool_name, members)


def _pool_devices(
    driver: str, pool_name: str, members: list[tuple[int, Mapping[str, Any]]]
) -> Iterator[Finding]:
    device_at: dict[str, str] = {}
    counter_sets, repeats = _shared_counter_sets(pool_name, members)
    yield from repeats
    for index, spec in members:
        devices = spec.get("devices")
        for position, device in enumerate(devices if isinstance(devices, list) else []):
            if not isinstance(device, Mapping):
                continue
            where = f"[{index}].spec.devices[{position}]"
            name = device.get("name")
            if isinstance(name, str):
                if name in device_at and not device_at[name].startswith(f"[{index}]."):
                    yield Finding(
                        where,
                        f"device name {name!r} repeats in pool {pool_name!r} (also {device_at[name]}); "
                        "the pool is invalid",
                    )
                device_at.setdefault(name, where)
            attributes = device.get("attributes")
            if isinstance(attributes, Mapping):
                for key in attributes:
                    bare = str(key).removeprefix(f"{driver}/")
                    if bare != key and bare in attributes:
                        yield Finding(
                            field_key(f"{where}.attributes", str(key)),
                            f"also published as {bare!r}; both are the same CEL key and which one wins "
                            "is undefined",
                        )
            yield from _consumptions_in_pool(device, where, pool_name, counter_sets)


def _shared_counter_sets(
    pool_name: str, members: list[tuple[int, Mapping[str, Any]]]
) -> tuple[dict[str, set[str]], list[Finding]]:
    """The pool's counter sets (name -> counter names), and a finding for each name that repeats."""
    counter_sets: dict[str, set[str]] = {}
    repeats: list[Finding] = []
    for index, spec in members:
        for position, counter_set in enumerate(spec.get("sharedCounters") or []):
            name = counter_set.get("name") if isinstance(counter_set, Mapping) else None
            if not isinstance(name, str):
                continue
            if name in counter_sets:
                repeats.append(
                    Finding(
                        f"[{index}].spec.sharedCounters[{position}]",
                        f"counter set {name!r} repeats in pool {pool_name!r}",
                    )
                )
            counters = counter_set.get("counters")
            counter_sets[name] = set(counters) if isinstance(counters, Mapping) else set()
    return counter_sets, repeats


def _consumptions_in_pool(
    device: Mapping[str, Any], where: str, pool_name: str, counter_sets: dict[str, set[str]]
) -> Iterator[Finding]:
    """A device consumes only counters of its pool's counter sets."""
    consumptions = device.get("consumesCounters")
    for c_index, consumption in enumerate(consumptions if isinstance(consumptions, list) else []):
        if not isinstance(consumption, Mapping):
            continue
        set_name = consumption.get("counterSet")
        if set_name not in counter_sets:
            yield Finding(
                f"{where}.consumesCounters[{c_index}].counterSet",
                f"counter set {set_name!r} is not in pool {pool_name!r}",
            )
            continue
        counters = consumption.get("counters")
        for counter in counters if isinstance(counters, Mapping) else ():
            if counter not in counter_sets[str(set_name)]:
                yield Finding(
                    field_key(f"{where}.consumesCounters[{c_index}].counters", str(counter)),
                    f"counter {counter!r} is not in counter set {set_name!r}",
                )


def validate_slices(slices: Sequence[Mapping[str, Any]]) -> list[Finding]:
    """Every slice on its own, then each pool across its slices; empty when all is well."""
    findings = [finding for index, obj in enumerate(slices) for finding in _slice(obj, f"[{index}]")]
    findings += _pool_checks(slices)
    return findings


def validate_node_pool(slices: Sequence[Mapping[str, Any]], *, driver: str, node: str) -> list[Finding]:
    """`validate_slices`, plus what makes the slices one node's own pool of one driver: the
    rules everything `serve` publishes (and `dradriver slices` prints) must pass."""
    findings = validate_slices(slices)
    for index, obj in enumerate(slices):
        spec = obj.get("spec") if isinstance(obj, Mapping) else None
        if not isinstance(spec, Mapping):
            continue
        path = f"[{index}].spec"
        if spec.get("driver") != driver:
            findings.append(Finding(f"{path}.driver", f"must be this driver {driver!r}"))
        if spec.get("nodeName") != node:
            findings.append(Finding(f"{path}.nodeName", f"must be this node {node!r}"))
        pool = spec.get("pool")
        if isinstance(pool, Mapping) and pool.get("name") != node:
            findings.append(Finding(f"{path}.pool.name", f"must be the node name {node!r}"))
        for key in ("nodeSelector", "allNodes", "perDeviceNodeSelection"):
            if spec.get(key) is not None:
                findings.append(
                    Finding(f"{path}.{key}", "must not be set: node-local slices use spec.nodeName")
                )
    return findings
