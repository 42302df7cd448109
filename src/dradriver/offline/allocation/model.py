"""Normalized DRA objects for the allocation simulator, read from their JSON/YAML form.

Accepts resource.k8s.io v1 shapes, v1beta2 (same request shape as v1) and v1beta1 (requests
flat instead of under `exactly`, slice devices wrapped in `basic:`). Everything is converted to
the v1 meaning once, with defaults applied as the API server applies them (ExactCount, count 1).
Malformed input raises `InputError` naming the object and the field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dradriver.names import int64_error
from dradriver.quantity import quantity_error

RESOURCE_GROUP = "resource.k8s.io"
API_VERSIONS = ("v1", "v1beta2", "v1beta1")
EXACT_COUNT = "ExactCount"
ALL = "All"


class InputError(ValueError):
    """A DRA object that cannot be simulated; the message names the object and field."""


def object_ref(obj: Mapping[str, Any]) -> str:
    kind = obj.get("kind", "object")
    meta = obj.get("metadata") or {}
    name = meta.get("name") or meta.get("generateName") or "<unnamed>"
    namespace = meta.get("namespace")
    return f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InputError(f"{where}: must be an object, not {type(value).__name__}")
    return value


def _list(value: Any, where: str) -> Sequence[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InputError(f"{where}: must be a list, not {type(value).__name__}")
    return value


def _str(value: Any, where: str, *, required: bool = True) -> str:
    if value is None or value == "":
        if required:
            raise InputError(f"{where}: required")
        return ""
    if not isinstance(value, str):
        raise InputError(f"{where}: must be a string")
    return value


def _int(value: Any, where: str) -> int:
    if (problem := int64_error(value)) is not None:
        raise InputError(f"{where}: {problem}")
    assert isinstance(value, int)
    return value


def api_version_of(obj: Mapping[str, Any]) -> str:
    """The resource.k8s.io version of an object, or raise InputError."""
    api_version = str(obj.get("apiVersion", ""))
    group, _, version = api_version.partition("/")
    if group != RESOURCE_GROUP or version not in API_VERSIONS:
        raise InputError(
            f"{object_ref(obj)}: apiVersion {api_version!r} is not one of "
            + ", ".join(f"{RESOURCE_GROUP}/{v}" for v in API_VERSIONS)
        )
    return version


# -- device classes -----------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceClass:
    name: str
    selectors: tuple[str, ...]
    config: tuple[Mapping[str, Any], ...] = ()


def _selectors(raw: Any, where: str) -> tuple[str, ...]:
    out: list[str] = []
    for i, selector in enumerate(_list(raw, where)):
        sel_where = f"{where}[{i}]"
        cel = _mapping(_mapping(selector, sel_where).get("cel"), f"{sel_where}.cel")
        if not cel:
            raise InputError(f"{sel_where}.cel: required (the only selector type)")
        out.append(_str(cel.get("expression"), f"{sel_where}.cel.expression"))
    return tuple(out)


def parse_device_class(obj: Mapping[str, Any]) -> DeviceClass:
    api_version_of(obj)
    ref = object_ref(obj)
    name = _str(_mapping(obj.get("metadata"), f"{ref}: metadata").get("name"), f"{ref}: metadata.name")
    spec = _mapping(obj.get("spec"), f"{ref}: spec")
    config = tuple(
        _mapping(c, f"{ref}: spec.config[{i}]")
        for i, c in enumerate(_list(spec.get("config"), f"{ref}: spec.config"))
    )
    return DeviceClass(name, _selectors(spec.get("selectors"), f"{ref}: spec.selectors"), config)


# -- claims ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Toleration:
    key: str
    operator: str
    value: str
    effect: str

    def tolerates(self, taint: Mapping[str, Any]) -> bool:
        """resourceclaim.ToleratesTaint."""
        if self.effect and self.effect != taint.get("effect", ""):
            return False
        if self.key and self.key != taint.get("key", ""):
            return False
        if self.operator == "Exists":
            return True
        return self.value == str(taint.get("value", ""))


@dataclass(frozen=True)
class DeviceRequest:
    """One `exactly` request or one `firstAvailable` subrequest."""

    name: str
    device_class: str
    selectors: tuple[str, ...]
    mode: str = EXACT_COUNT
    count: int = 1
    admin_access: bool = False
    tolerations: tuple[Toleration, ...] = ()
    # capacity.requests (DRAConsumableCapacity): capacity name -> quantity text.
    capacity: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Request:
    """A claim request: exactly one of `exactly` or `first_available` is set."""

    name: str
    exactly: DeviceRequest | None
    first_available: tuple[DeviceRequest, ...] = ()


@dataclass(frozen=True)
class MatchAttribute:
    """A claim constraint: `matchAttribute` (one value across the devices of `requests`) or,
    with `distinct`, `distinctAttribute` (no two of them share a value)."""

    attribute: str
    requests: tuple[str, ...]
    distinct: bool = False


@dataclass(frozen=True)
class AllocatedDevice:
    request: str
    driver: str
    pool: str
    device: str
    admin_access: bool = False
    # For a device allowing multiple allocations: this allocation's share and what it consumes.
    share_id: str | None = None
    consumed_capacity: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Claim:
    kind: str
    name: str
    namespace: str
    requests: tuple[Request, ...]
    constraints: tuple[MatchAttribute, ...] = ()
    config: tuple[Mapping[str, Any], ...] = ()
    # Devices from status.allocation: the claim is already allocated and holds them.
    allocated: tuple[AllocatedDevice, ...] | None = None

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


def _tolerations(raw: Any, where: str) -> tuple[Toleration, ...]:
    out: list[Toleration] = []
    for i, item in enumerate(_list(raw, where)):
        tol = _mapping(item, f"{where}[{i}]")
        operator = str(tol.get("operator") or "Equal")
        if operator not in ("Equal", "Exists"):
            raise InputError(f"{where}[{i}].operator: must be Equal or Exists, not {operator!r}")
        out.append(
            Toleration(
                str(tol.get("key") or ""), operator, str(tol.get("value") or ""), str(tol.get("effect") or "")
            )
        )
    return tuple(out)


def _device_request(raw: Mapping[str, Any], name: str, where: str) -> DeviceRequest:
    mode = str(raw.get("allocationMode") or EXACT_COUNT)
    if mode not in (EXACT_COUNT, ALL):
        raise InputError(f"{where}.allocationMode: must be ExactCount or All, not {mode!r}")
    count_raw = raw.get("count")
    if mode == ALL:
        if count_raw not in (None, 0):
            raise InputError(f"{where}.count: must not be set when allocationMode is All")
        count = 0
    else:
        count = 1 if count_raw is None else count_raw
        if (problem := int64_error(count)) is not None:
            raise InputError(f"{where}.count: {problem}")
        if count < 1:
            raise InputError(f"{where}.count: must be greater than zero, not {count}")
    admin = raw.get("adminAccess")
    if admin is not None and not isinstance(admin, bool):
        raise InputError(f"{where}.adminAccess: must be a boolean")
    capacity = _mapping(raw.get("capacity"), f"{where}.capacity")
    return DeviceRequest(
        name=name,
        device_class=_str(raw.get("deviceClassName"), f"{where}.deviceClassName"),
        selectors=_selectors(raw.get("selectors"), f"{where}.selectors"),
        mode=mode,
        count=count,
        admin_access=bool(admin),
        tolerations=_tolerations(raw.get("tolerations"), f"{where}.tolerations"),
        capacity=_quantities(capacity.get("requests"), f"{where}.capacity.requests"),
    )


def _quantities(raw: Any, where: str) -> tuple[tuple[str, str], ...]:
    out = []
    for name, value in _mapping(raw, where).items():
        if (problem := quantity_error(value)) is not None:
            raise InputError(f"{where}.{name}: {problem}")
        out.append((str(name), str(value)))
    return tuple(out)


def _request(raw: Mapping[str, Any], version: str, where: str) -> Request:
    name = _str(raw.get("name"), f"{where}.name")
    first = _list(raw.get("firstAvailable"), f"{where}.firstAvailable")
    exactly_raw = raw.get("exactly")
    if version == "v1beta1":
        # v1beta1 flattens the ExactDeviceRequest fields into the request itself.
        flat = {k: v for k, v in raw.items() if k not in ("name", "firstAvailable")}
        if exactly_raw is not None:
            raise InputError(f"{where}.exactly: not a v1beta1 field (use v1 or v1beta2 for `exactly`)")
        exactly_raw = flat if flat.get("deviceClassName") else None
    if first and exactly_raw:
        raise InputError(f"{where}: exactly one of `exactly` or `firstAvailable` is required, not both")
    if first:
        subs = []
        for i, sub in enumerate(first):
            sub_where = f"{where}.firstAvailable[{i}]"
            sub_map = _mapping(sub, sub_where)
            # DeviceSubRequest has no adminAccess: the API server drops the field.
            sub_map = {k: v for k, v in sub_map.items() if k != "adminAccess"}
            subs.append(_device_request(sub_map, _str(sub_map.get("name"), f"{sub_where}.name"), sub_where))
        return Request(name, None, tuple(subs))
    if not exactly_raw:
        field_name = "deviceClassName" if version == "v1beta1" else "exactly"
        raise InputError(f"{where}: `{field_name}` or `firstAvailable` is required")
    exact_where = where if version == "v1beta1" else f"{where}.exactly"
    return Request(name, _device_request(_mapping(exactly_raw, exact_where), name, exact_where))


def _allocated(status: Mapping[str, Any], where: str) -> tuple[AllocatedDevice, ...] | None:
    allocation = status.get("allocation")
    if not allocation:
        return None
    devices = _mapping(
        _mapping(allocation, f"{where}.allocation").get("devices"), f"{where}.allocation.devices"
    )
    out = []
    for i, item in enumerate(_list(devices.get("results"), f"{where}.allocation.devices.results")):
        at = f"{where}.allocation.devices.results[{i}]"
        result = _mapping(item, at)
        share_id = result.get("shareID")
        out.append(
            AllocatedDevice(
                str(result.get("request", "")),
                str(result.get("driver", "")),
                str(result.get("pool", "")),
                str(result.get("device", "")),
                bool(result.get("adminAccess") or False),
                share_id=None if share_id is None else _str(share_id, f"{at}.shareID"),
                consumed_capacity=_quantities(result.get("consumedCapacity"), f"{at}.consumedCapacity"),
            )
        )
    return tuple(out)


def parse_claim(obj: Mapping[str, Any]) -> Claim:
    """A ResourceClaim or ResourceClaimTemplate (whose spec.spec is a claim spec)."""
    version = api_version_of(obj)
    ref = object_ref(obj)
    kind = obj.get("kind")
    meta = _mapping(obj.get("metadata"), f"{ref}: metadata")
    name = _str(meta.get("name") or meta.get("generateName"), f"{ref}: metadata.name")
    spec = _mapping(obj.get("spec"), f"{ref}: spec")
    spec_path = "spec"
    if kind == "ResourceClaimTemplate":
        spec = _mapping(spec.get("spec"), f"{ref}: spec.spec")
        spec_path = "spec.spec"
    elif kind != "ResourceClaim":
        raise InputError(f"{ref}: kind must be ResourceClaim or ResourceClaimTemplate")
    devices = _mapping(spec.get("devices"), f"{ref}: {spec_path}.devices")
    where = f"{ref}: {spec_path}.devices"
    requests = tuple(
        _request(_mapping(r, f"{where}.requests[{i}]"), version, f"{where}.requests[{i}]")
        for i, r in enumerate(_list(devices.get("requests"), f"{where}.requests"))
    )
    constraints = []
    for i, c in enumerate(_list(devices.get("constraints"), f"{where}.constraints")):
        constraint = _mapping(c, f"{where}.constraints[{i}]")
        field_name = "matchAttribute" if constraint.get("matchAttribute") else "distinctAttribute"
        attribute = constraint.get(field_name)
        if not attribute:
            raise InputError(f"{where}.constraints[{i}]: matchAttribute or distinctAttribute is required")
        requests_of = tuple(
            str(r) for r in _list(constraint.get("requests"), f"{where}.constraints[{i}].requests")
        )
        constraints.append(
            MatchAttribute(
                _str(attribute, f"{where}.constraints[{i}].{field_name}"),
                requests_of,
                distinct=field_name == "distinctAttribute",
            )
        )
    config = tuple(
        _mapping(c, f"{where}.config[{i}]")
        for i, c in enumerate(_list(devices.get("config"), f"{where}.config"))
    )
    status = _mapping(obj.get("status"), f"{ref}: status") if kind == "ResourceClaim" else {}
    return Claim(
        kind=str(kind),
        name=name,
        namespace=str(meta.get("namespace") or ""),
        requests=requests,
        constraints=tuple(constraints),
        config=config,
        allocated=_allocated(status, f"{ref}: status"),
    )


# -- resource slices -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Device:
    """A device in v1 form (`basic:` unwrapped), with where it comes from."""

    driver: str
    pool: str
    name: str
    body: Mapping[str, Any]
    # driver/pool/name: read millions of times in a search, so a plain attribute.
    id: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "id", f"{self.driver}/{self.pool}/{self.name}")


@dataclass(frozen=True)
class Slice:
    name: str
    driver: str
    pool: str
    generation: int
    slice_count: int
    node_name: str
    all_nodes: bool
    node_selector: Mapping[str, Any] | None
    devices: tuple[Device, ...]
    shared_counters: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


def parse_slice(obj: Mapping[str, Any]) -> Slice:
    version = api_version_of(obj)
    ref = object_ref(obj)
    meta = _mapping(obj.get("metadata"), f"{ref}: metadata")
    name = str(meta.get("name") or meta.get("generateName") or "")
    spec = _mapping(obj.get("spec"), f"{ref}: spec")
    driver = _str(spec.get("driver"), f"{ref}: spec.driver")
    pool = _mapping(spec.get("pool"), f"{ref}: spec.pool")
    pool_name = _str(pool.get("name"), f"{ref}: spec.pool.name")
    devices = []
    for i, raw in enumerate(_list(spec.get("devices"), f"{ref}: spec.devices")):
        device = _mapping(raw, f"{ref}: spec.devices[{i}]")
        dev_name = _str(device.get("name"), f"{ref}: spec.devices[{i}].name")
        body = device
        if version == "v1beta1" or isinstance(device.get("basic"), Mapping):
            body = {"name": dev_name, **_mapping(device.get("basic"), f"{ref}: spec.devices[{i}].basic")}
        devices.append(Device(driver, pool_name, dev_name, body))
    counters: dict[str, Mapping[str, Any]] = {}
    for i, raw in enumerate(_list(spec.get("sharedCounters"), f"{ref}: spec.sharedCounters")):
        counter_set = _mapping(raw, f"{ref}: spec.sharedCounters[{i}]")
        set_name = _str(counter_set.get("name"), f"{ref}: spec.sharedCounters[{i}].name")
        counters[set_name] = _mapping(
            counter_set.get("counters"), f"{ref}: spec.sharedCounters[{i}].counters"
        )
    return Slice(
        name=name,
        driver=driver,
        pool=pool_name,
        generation=_int(pool.get("generation") or 0, f"{ref}: spec.pool.generation"),
        slice_count=_int(pool.get("resourceSliceCount") or 1, f"{ref}: spec.pool.resourceSliceCount"),
        node_name=_str(spec.get("nodeName"), f"{ref}: spec.nodeName", required=False),
        all_nodes=bool(spec.get("allNodes") or False),
        node_selector=spec.get("nodeSelector"),
        devices=tuple(devices),
        shared_counters=counters,
    )
