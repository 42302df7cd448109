"""What to write so that a node's pool of ResourceSlices equals the desired one: pure decisions.

The rules are those of the upstream `resourceslice` controller (k8s.io/dynamic-resource-allocation,
1.36), which the scheduler's view of a pool depends on:

- Existing slices are matched to desired ones by the hex index at the start of their name
  (`<index>-<driver>-<node>-<random>`), only among slices at the pool's highest generation.
  Unmatched, duplicate and older-generation slices, and slices of another pool, are obsolete.
- Generation: G is the highest existing generation (0 for none). If no slice must be created and
  at most one matched slice changes, G is kept (one in-place update is atomic for readers);
  otherwise every slice is written with G+1. A new pool therefore starts at generation 1.
- Order: delete obsolete slices (with UID and resourceVersion preconditions), then update, then
  create. Updates are full PUTs of the existing object.

Comparison is semantic, like apimachinery's: absent, null and empty values are equal, quantities
compare by value ("1Gi" == "1024Mi"), a taint's server-set timeAdded matches an unset one, and
list order matters. One addition to upstream: a slice whose Node owner reference is missing or
wrong counts as changed, so a foreign edit cannot orphan it from the Node's garbage collection.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from dradriver.quantity import parse_quantity

Json = dict[str, Any]

API_VERSION = "resource.k8s.io/v1"
INDEX_MIN_LENGTH = 5
#: Spec fields that carry a slice's content; everything else is identity or pool metadata.
CONTENT_FIELDS = ("devices", "sharedCounters", "perDeviceNodeSelection", "nodeSelector", "allNodes")
#: Taints whose timeAdded differ by at most this much are the same (the server rounds to seconds).
TAINT_TIME_TOLERANCE_S = 1.0


@dataclass(frozen=True)
class Write:
    """A slice to create or update: its place in the desired list, and what to send."""

    index: int
    body: Json


@dataclass(frozen=True)
class Delete:
    name: str
    uid: str
    resource_version: str


@dataclass(frozen=True)
class Plan:
    generation: int
    deletes: tuple[Delete, ...] = ()
    updates: tuple[Write, ...] = ()
    creates: tuple[Write, ...] = ()

    @property
    def writes(self) -> int:
        return len(self.deletes) + len(self.updates) + len(self.creates)

    @property
    def in_sync(self) -> bool:
        return self.writes == 0


# -- naming -------------------------------------------------------------------------------------


def index_length(num_slices: int) -> int:
    """Hex digits for the highest index of a pool with `num_slices` slices (at least 5)."""
    return max(INDEX_MIN_LENGTH, len(format(num_slices - 1, "x")))


def encode_index(index: int, length: int) -> str:
    return format(index, f"0{length}x")


def decode_index(name: str, length: int) -> int | None:
    """The index a slice name starts with, if it has exactly `length` hex digits then '-'."""
    if name.find("-") != length:
        return None
    try:
        return int(name[:length], 16)
    except ValueError:
        return None


def generate_name(index: int, length: int, driver: str, node: str) -> str:
    return f"{encode_index(index, length)}-{driver}-{node}-"


def node_owner(node: str, uid: str) -> Json:
    return {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid, "controller": True}


# -- semantic comparison --------------------------------------------------------------------------


def content(spec: Json) -> Json:
    """The content fields of a slice spec, unset ones left out."""
    return {k: spec[k] for k in CONTENT_FIELDS if spec.get(k) is not None}


def contents_equal(a: Json, b: Json) -> bool:
    """Semantic equality of two slices' content (see the module docstring)."""
    a_times: list[tuple[str, str]] = []
    b_times: list[tuple[str, str]] = []
    if _canonical(a, a_times) != _canonical(b, b_times):
        return False
    return all(_times_close(x, y) for x, y in _paired_times(a_times, b_times))


def fingerprint(value: Json) -> str:
    """A stable text form of a JSON value, for remembering what was desired."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


_QUANTITY_KEYS = frozenset({"value", "default", "min", "max", "step", "validValues"})


def _canonical(value: Any, taint_times: list[tuple[str, str]], path: tuple[str, ...] = ()) -> Any:
    """Drop null/empty values, turn quantities into Decimals and pull taint times out (recorded
    in `taint_times` by path, to be compared with tolerance)."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            sub_path = (*path, key)
            if key == "timeAdded" and len(path) >= 2 and path[-2] == "taints":
                if item:
                    taint_times.append(("/".join(path), str(item)))
                continue
            if _is_quantity_field(path, key):
                canon = _quantity(item)
            else:
                canon = _canonical(item, taint_times, sub_path)
            if canon not in (None, {}, []):
                out[key] = canon
        return out
    if isinstance(value, list):
        return [_canonical(item, taint_times, (*path, str(i))) for i, item in enumerate(value)]
    return value


def _is_quantity_field(path: tuple[str, ...], key: str) -> bool:
    """Quantities live in capacity entries (and their requestPolicy) and in counters."""
    if key not in _QUANTITY_KEYS:
        return False
    return any(part in ("capacity", "counters") for part in path)


def _quantity(value: Any) -> Any:
    if isinstance(value, list):
        return [_quantity(v) for v in value]
    if not isinstance(value, str):
        return value
    parsed = parse_quantity(value)
    return value if parsed is None else parsed


def _paired_times(a: list[tuple[str, str]], b: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Taint times set on both sides, by taint; a time set on one side only matches anything."""
    b_by_path = dict(b)
    return [(t, b_by_path[p]) for p, t in a if p in b_by_path]


def _times_close(a: str, b: str) -> bool:
    try:
        delta = _parse_time(a) - _parse_time(b)
    except ValueError:
        return a == b
    return abs(delta.total_seconds()) <= TAINT_TIME_TOLERANCE_S


def _parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _with_taint_times(desired_devices: list[Json], current_devices: list[Json]) -> list[Json]:
    """Desired devices, where a taint without timeAdded keeps the time of the same taint (key,
    value, effect) on the same device already stored: re-publishing must not reset it."""
    current = {d.get("name"): d for d in current_devices}
    out = []
    for device in desired_devices:
        old = current.get(device.get("name"))
        taints = device.get("taints") or []
        if old is None or not taints or all(t.get("timeAdded") for t in taints):
            out.append(device)
            continue
        device_copy = copy.deepcopy(device)
        for taint in device_copy["taints"]:
            if taint.get("timeAdded"):
                continue
            same = next((t for t in old.get("taints") or [] if _taint_key(t) == _taint_key(taint)), None)
            if same is not None and same.get("timeAdded"):
                taint["timeAdded"] = same["timeAdded"]
        out.append(device_copy)
    return out


def _taint_key(taint: Json) -> tuple[Any, Any, Any]:
    return taint.get("key"), taint.get("value"), taint.get("effect")


# -- the plan -------------------------------------------------------------------------------------


def plan_pool(
    existing: Sequence[Json], desired: Sequence[Json], *, driver: str, node: str, node_uid: str
) -> Plan:
    """The writes that turn `existing` (our driver's slices on this node, as stored) into
    `desired` (slice objects in priority order; their pool generation and metadata are ignored),
    which the caller has validated (`slices.render_node_slices` does).
    """
    owner = node_owner(node, node_uid)
    ours = [s for s in existing if _spec(s).get("pool", {}).get("name") == node]
    obsolete: list[Json] = [s for s in existing if _spec(s).get("pool", {}).get("name") != node]

    generation = max((_generation(s) for s in ours), default=0)
    length = index_length(len(desired))
    matched: dict[int, Json] = {}
    for slice_ in sorted(ours, key=_name):
        index = decode_index(_name(slice_), length)
        if _generation(slice_) < generation or index is None or index >= len(desired) or index in matched:
            obsolete.append(slice_)
        else:
            matched[index] = slice_

    count = len(desired)
    changed = {
        i
        for i, current in matched.items()
        if not _pool_equal(_spec(current).get("pool"), node, generation, count)
        or not contents_equal(content(_spec(current)), content(_spec(desired[i])))
        or not _owned_by(current, owner)
    }
    new = count - len(matched)
    bumped = not (new == 0 and len(changed) <= 1)
    if bumped:
        generation += 1
    pool = {"name": node, "generation": generation, "resourceSliceCount": count}

    updates = []
    for i in sorted(matched):
        if i not in changed and not bumped:
            continue
        # Items of a list come without apiVersion and kind, and a PUT needs them.
        body = {**copy.deepcopy(matched[i]), "apiVersion": API_VERSION, "kind": "ResourceSlice"}
        spec = body.setdefault("spec", {})
        desired_content = content(_spec(desired[i]))
        for field in CONTENT_FIELDS:
            spec.pop(field, None)
        spec.update(copy.deepcopy(desired_content))
        if "devices" in spec:
            spec["devices"] = _with_taint_times(spec["devices"], _spec(matched[i]).get("devices") or [])
        spec["pool"] = dict(pool)
        body["metadata"]["ownerReferences"] = _with_owner(
            body["metadata"].get("ownerReferences") or [], owner
        )
        updates.append(Write(i, body))

    creates = []
    for i in range(count):
        if i in matched:
            continue
        spec = {
            "driver": driver,
            "nodeName": node,
            "pool": dict(pool),
            **copy.deepcopy(content(_spec(desired[i]))),
        }
        body = {
            "apiVersion": API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {
                "generateName": generate_name(i, length, driver, node),
                "ownerReferences": [dict(owner)],
            },
            "spec": spec,
        }
        creates.append(Write(i, body))

    deletes = tuple(
        Delete(_name(s), str(s["metadata"].get("uid", "")), str(s["metadata"].get("resourceVersion", "")))
        for s in sorted(obsolete, key=_name)
    )
    return Plan(generation, deletes, tuple(updates), tuple(creates))


def _spec(slice_: Json) -> Json:
    spec: Json = slice_.get("spec") or {}
    return spec


def _name(slice_: Json) -> str:
    return str(slice_.get("metadata", {}).get("name", ""))


def _generation(slice_: Json) -> int:
    return int(_spec(slice_).get("pool", {}).get("generation") or 0)


def _pool_equal(pool: Json | None, node: str, generation: int, count: int) -> bool:
    pool = pool or {}
    return (
        pool.get("name") == node
        and int(pool.get("generation") or 0) == generation
        and int(pool.get("resourceSliceCount") or 0) == count
    )


def _owned_by(slice_: Json, owner: Json) -> bool:
    refs = slice_.get("metadata", {}).get("ownerReferences") or []
    return any(all(ref.get(k) == v for k, v in owner.items()) for ref in refs)


def _with_owner(refs: list[Json], owner: Json) -> list[Json]:
    """Our Node reference (as controller) plus any foreign non-Node references."""
    others = [r for r in refs if not (r.get("kind") == "Node" and r.get("apiVersion") == "v1")]
    return [dict(owner), *(r for r in others if not r.get("controller"))]
