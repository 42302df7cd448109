"""Validation of one device (attributes, capacities, counters, taints, node selection)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from fractions import Fraction
from typing import Any

from dradriver.names import (
    INT64_MAX,
    INT64_MIN,
    dns_label_error,
    dns_subdomain_error,
    label_name_error,
    label_value_error,
    qualified_name_error,
    semver_error,
)
from dradriver.quantity import parse_quantity, quantity_error
from dradriver.slices.rules import (
    MAX_ATTRIBUTE_VALUES,
    MAX_ATTRIBUTES_AND_CAPACITIES,
    MAX_BINDING_CONDITIONS,
    MAX_CONSUMPTIONS_PER_DEVICE,
    MAX_COUNTERS,
    MAX_KEY_LENGTH,
    MAX_STRING_BYTES,
    MAX_TAINTS,
    MAX_VALID_VALUES,
    Finding,
    checked,
    field_key,
    is_int,
    require_mapping,
    required_string,
    unknown_keys,
)

_DEVICE_KEYS = {
    "name",
    "attributes",
    "capacity",
    "consumesCounters",
    "nodeName",
    "nodeSelector",
    "allNodes",
    "taints",
    "bindsToNode",
    "bindingConditions",
    "bindingFailureConditions",
    "allowMultipleAllocations",
    # 1.37's name of 1.36's alpha `nodeAllocatableResourceMappings`, which 1.37 servers do not know.
    "nodeAllocatableResources",
}
_SCALAR_ATTRIBUTE_TYPES = ("int", "bool", "string", "version")
LIST_ATTRIBUTE_TYPES = ("ints", "bools", "strings", "versions")
_SCALAR_KEYS = frozenset(_SCALAR_ATTRIBUTE_TYPES)
_TAINT_EFFECTS = ("NoSchedule", "NoExecute", "None")


def _string_value(value: Any, path: str) -> Iterator[Finding]:
    if not isinstance(value, str):
        yield Finding(path, "must be a string")
    elif len(value.encode("utf-8", "surrogatepass")) > MAX_STRING_BYTES:
        yield Finding(path, f"may not be more than {MAX_STRING_BYTES} bytes")


def _version_value(value: Any, path: str) -> Iterator[Finding]:
    if not isinstance(value, str):
        yield Finding(path, "must be a string")
    else:
        yield from checked(semver_error(value), path)


def _int_value(value: Any, path: str) -> Iterator[Finding]:
    if not is_int(value) or not INT64_MIN <= value <= INT64_MAX:
        yield Finding(path, "must be a 64-bit integer")


def bool_value(value: Any, path: str) -> Iterator[Finding]:
    if not isinstance(value, bool):
        yield Finding(path, "must be a boolean")


_VALUE_CHECKS: dict[str, Callable[[Any, str], Iterator[Finding]]] = {
    "int": _int_value,
    "bool": bool_value,
    "string": _string_value,
    "version": _version_value,
}


def _attribute(value: Any, path: str) -> Iterator[Finding]:
    if not isinstance(value, Mapping):
        yield Finding(path, "must be an object with exactly one of int, bool, string, version")
        return
    yield from unknown_keys(value, {*_SCALAR_ATTRIBUTE_TYPES, *LIST_ATTRIBUTE_TYPES}, path)
    present = [
        k for k in (*_SCALAR_ATTRIBUTE_TYPES, *LIST_ATTRIBUTE_TYPES) if k in value and value[k] is not None
    ]
    if len(present) != 1:
        yield Finding(path, "exactly one value must be specified")
    for kind in present:
        item_path = f"{path}.{kind}"
        if kind in _VALUE_CHECKS:
            yield from _VALUE_CHECKS[kind](value[kind], item_path)
            continue
        items = value[kind]
        if not isinstance(items, list) or not items:
            yield Finding(item_path, "must not be empty if specified")
            continue
        for index, item in enumerate(items):
            yield from _VALUE_CHECKS[kind[:-1]](item, f"{item_path}[{index}]")


# Names and versions repeat across thousands of devices: check each distinct one once.
_qualified_name_error = functools.lru_cache(maxsize=4096)(qualified_name_error)
_semver_error = functools.lru_cache(maxsize=4096)(semver_error)
_dns_label_error = functools.lru_cache(maxsize=4096)(dns_label_error)


def _plain_valid_attribute(value: Any) -> bool:
    """The common case, checked without building paths: one scalar value that is fine as it is."""
    if type(value) is not dict or len(value) != 1:
        return False
    ((kind, item),) = value.items()
    if kind == "string":
        return type(item) is str and len(item.encode("utf-8", "surrogatepass")) <= MAX_STRING_BYTES
    if kind == "int":
        return type(item) is int and INT64_MIN <= item <= INT64_MAX
    if kind == "bool":
        return type(item) is bool
    return kind == "version" and type(item) is str and _semver_error(item) is None


def _plain_valid_quantity(obj: Any) -> bool:
    """`{"value": "<quantity>"}` and nothing else, valid."""
    return (
        type(obj) is dict
        and len(obj) == 1
        and type(value := obj.get("value")) is str
        and quantity_error(value) is None
    )


def _attribute_value_count(attributes: Mapping[str, Any]) -> int:
    """Attribute values, list items counted one by one (the 1.36 limit)."""
    count = 0
    for value in attributes.values():
        items = 0
        if isinstance(value, Mapping) and not value.keys() <= _SCALAR_KEYS:
            items = sum(len(v) for k in LIST_ATTRIBUTE_TYPES if isinstance(v := value.get(k), list))
        count += items or 1
    return count


def _qualified_key(key: Any, path: str) -> Iterator[Finding]:
    if not isinstance(key, str):
        yield Finding(path, "keys must be strings")
        return
    if len(key) > MAX_KEY_LENGTH:
        yield Finding(field_key(path, key), f"must be no more than {MAX_KEY_LENGTH} characters")
    if (err := _qualified_name_error(key)) is not None:
        yield Finding(field_key(path, key), err)


def _quantity_field(obj: Any, path: str) -> Iterator[Finding]:
    """A `{value: <quantity>}` object (capacity, counter)."""
    if not isinstance(obj, Mapping):
        yield Finding(path, "must be an object with a value")
        return
    if "value" not in obj:
        yield Finding(f"{path}.value", "Required value")
    else:
        yield from checked(quantity_error(obj["value"]), f"{path}.value")


class _PolicyCheck:
    """Consumable-capacity request policy rules (only allowed with allowMultipleAllocations)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.findings: list[Finding] = []

    def fail(self, where: str, message: str) -> None:
        self.findings.append(Finding(f"{self.path}{where}", message))

    def quantity(self, value: Any, where: str) -> Fraction | None:
        if (err := quantity_error(value)) is not None:
            self.fail(where, err)
            return None
        return parse_quantity(value)

    def valid_values(self, values: Any, default: Fraction | None, maximum: Fraction | None) -> None:
        if not isinstance(values, list) or len(values) > MAX_VALID_VALUES:
            self.fail(".validValues", f"must be a list of at most {MAX_VALID_VALUES} quantities")
            return
        options = [
            o for i, v in enumerate(values) if (o := self.quantity(v, f".validValues[{i}]")) is not None
        ]
        if options != sorted(set(options)):
            self.fail(".validValues", "values must be sorted in ascending order and unique")
        if maximum is not None and any(o > maximum for o in options):
            self.fail(".validValues", "option is larger than capacity value")
        if default is not None and default not in options:
            self.fail(".validValues", "default value is not valid according to the requestPolicy")

    def valid_range(
        self, bounds: Mapping[str, Any], default: Fraction | None, maximum: Fraction | None
    ) -> None:
        low, high, step = (
            self.quantity(bounds[key], f".validRange.{key}") if key in bounds else None
            for key in ("min", "max", "step")
        )
        if "min" not in bounds:
            self.fail(".validRange.min", "required when validRange is defined")
        if low is None:
            return
        if maximum is not None and low > maximum:
            self.fail(".validRange.min", "min is larger than capacity value")
        if default is not None and default < low:
            self.fail(".default", "default is less than min")
        if high is not None:
            if low > high:
                self.fail(".validRange.max", "min is larger than max")
            if maximum is not None and high > maximum:
                self.fail(".validRange.max", "max is larger than capacity value")
            if default is not None and default > high:
                self.fail(".default", "default is more than max")
        if step is not None:
            if step <= 0:
                self.fail(".validRange.step", "must be greater than zero")
                return
            if maximum is not None and low + step > maximum:
                self.fail(".validRange.step", "one step is larger than capacity value")
            for name, value in (("default", default), ("max", high)):
                if value is not None and (value - low) % step != 0:
                    self.fail(".validRange.step", f"{name} is not a multiple of step from min")


def _request_policy(policy: Any, capacity_value: Any, path: str) -> Iterator[Finding]:
    if not isinstance(policy, Mapping):
        yield Finding(path, "must be an object")
        return
    yield from unknown_keys(policy, {"default", "validValues", "validRange"}, path)
    check = _PolicyCheck(path)
    maximum = parse_quantity(capacity_value) if isinstance(capacity_value, str) else None
    default = check.quantity(policy["default"], ".default") if "default" in policy else None
    values, bounds = policy.get("validValues"), policy.get("validRange")
    if values and bounds:
        check.fail("", 'exactly one policy can be specified, cannot specify "validValues" and "validRange"')
    elif values or bounds:
        if "default" not in policy:
            check.fail(".default", "required when validValues or validRange is defined")
        if values:
            check.valid_values(values, default, maximum)
        elif isinstance(bounds, Mapping):
            check.valid_range(bounds, default, maximum)
        else:
            check.fail(".validRange", "must be an object")
    yield from check.findings


def counter_findings(counters: Any, path: str) -> Iterator[Finding]:
    if not isinstance(counters, Mapping) or not counters:
        yield Finding(path, "Required value: at least one counter")
        return
    if len(counters) > MAX_COUNTERS:
        yield Finding(path, f"must have at most {MAX_COUNTERS} counters")
        return
    for name, counter in counters.items():
        if (err := _dns_label_error(str(name))) is not None:
            yield Finding(field_key(path, str(name)), err)
        if not _plain_valid_quantity(counter):
            yield from _quantity_field(counter, field_key(path, str(name)))


def _object_list(
    items: Any,
    path: str,
    *,
    limit: int,
    too_many: str,
    keys: set[str],
    each: Callable[[Mapping[str, Any], str], Iterator[Finding]],
) -> Iterator[Finding]:
    """A list of at most `limit` objects with the given keys, each checked by `each` after its own
    shape; `too_many` is the finding of a longer list, `{count}` in it standing for its length."""
    if not isinstance(items, list):
        yield Finding(path, "must be a list")
        return
    if len(items) > limit:
        yield Finding(path, too_many.format(count=len(items)))
        return
    for index, item in enumerate(items):
        where = f"{path}[{index}]"
        if not isinstance(item, Mapping):
            yield Finding(where, "must be an object")
            continue
        yield from unknown_keys(item, keys, where)
        yield from each(item, where)


def _taints(taints: Any, path: str) -> Iterator[Finding]:
    yield from _object_list(
        taints,
        path,
        limit=MAX_TAINTS,
        too_many=f"must have at most {MAX_TAINTS} items",
        keys={"key", "value", "effect", "timeAdded"},
        each=_taint,
    )


def _taint(taint: Mapping[str, Any], where: str) -> Iterator[Finding]:
    yield from checked(label_name_error(str(taint.get("key", ""))), f"{where}.key")
    yield from checked(label_value_error(str(taint.get("value", ""))), f"{where}.value")
    if taint.get("effect") not in _TAINT_EFFECTS:
        yield Finding(f"{where}.effect", f"Unsupported value: supported values: {', '.join(_TAINT_EFFECTS)}")


def _binding_conditions(device: Mapping[str, Any], path: str) -> Iterator[Finding]:
    lists: dict[str, list[Any]] = {}
    for key in ("bindingConditions", "bindingFailureConditions"):
        value = device.get(key) or []
        if not isinstance(value, list):
            yield Finding(f"{path}.{key}", "must be a list")
            value = []
        if len(value) > MAX_BINDING_CONDITIONS:
            yield Finding(f"{path}.{key}", f"must have at most {MAX_BINDING_CONDITIONS} items")
        seen: set[str] = set()
        for index, condition in enumerate(value):
            yield from checked(label_name_error(str(condition)), f"{path}.{key}[{index}]")
            if condition in seen:
                yield Finding(f"{path}.{key}[{index}]", f"Duplicate value: {condition!r}")
            seen.add(str(condition))
        lists[key] = value
    conditions, failures = lists["bindingConditions"], lists["bindingFailureConditions"]
    for index, condition in enumerate(failures):
        if condition in conditions:
            yield Finding(
                f"{path}.bindingFailureConditions[{index}]", "must not overlap with bindingConditions"
            )
    if bool(conditions) != bool(failures):
        yield Finding(path, "bindingConditions and bindingFailureConditions must be set together")


def device_findings(device: Any, path: str, per_device_node_selection: bool) -> Iterator[Finding]:
    if not isinstance(device, Mapping):
        yield Finding(path, "must be an object")
        return
    yield from unknown_keys(device, _DEVICE_KEYS, path)
    yield from required_string(device, "name", path, dns_label_error)
    attributes, capacity = device.get("attributes") or {}, device.get("capacity") or {}
    yield from require_mapping(attributes, f"{path}.attributes")
    yield from require_mapping(capacity, f"{path}.capacity")
    if not isinstance(attributes, Mapping) or not isinstance(capacity, Mapping):
        return
    if len(attributes) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
        yield Finding(
            path,
            f"the total number of attributes and capacities must not exceed {MAX_ATTRIBUTES_AND_CAPACITIES} "
            f"(has {len(attributes) + len(capacity)})",
        )
    if (values := _attribute_value_count(attributes)) > MAX_ATTRIBUTE_VALUES:
        yield Finding(
            path,
            f"the total number of attribute values must not exceed {MAX_ATTRIBUTE_VALUES} (has {values})",
        )
    for key, value in attributes.items():
        yield from _qualified_key(key, f"{path}.attributes")
        if not _plain_valid_attribute(value):
            yield from _attribute(value, field_key(f"{path}.attributes", str(key)))
    yield from _capacities(capacity, path, multi=device.get("allowMultipleAllocations") is True)
    for flag in ("allowMultipleAllocations", "bindsToNode"):
        if flag in device:
            yield from bool_value(device[flag], f"{path}.{flag}")
    yield from _consumptions(device.get("consumesCounters"), f"{path}.consumesCounters")
    if "taints" in device:
        yield from _taints(device["taints"], f"{path}.taints")
    yield from _binding_conditions(device, path)
    yield from node_selection(device, path, per_device=True, allowed=per_device_node_selection)


def _capacities(capacity: Mapping[Any, Any], path: str, *, multi: bool) -> Iterator[Finding]:
    """A device's capacities; a request policy only where the device allows multiple allocations."""
    for key, value in capacity.items():
        yield from _qualified_key(key, f"{path}.capacity")
        if _plain_valid_quantity(value):
            continue
        where = field_key(f"{path}.capacity", str(key))
        yield from _quantity_field(value, where)
        if isinstance(value, Mapping):
            yield from unknown_keys(value, {"value", "requestPolicy"}, where)
            if "requestPolicy" in value:
                if multi:
                    yield from _request_policy(
                        value["requestPolicy"], value.get("value"), f"{where}.requestPolicy"
                    )
                else:
                    yield Finding(
                        f"{where}.requestPolicy", "Forbidden: allowMultipleAllocations must be true"
                    )


def _consumptions(consumptions: Any, path: str) -> Iterator[Finding]:
    yield from counter_lists(consumptions, path, name_key="counterSet", limit=MAX_CONSUMPTIONS_PER_DEVICE)


def counter_lists(items: Any, path: str, *, name_key: str, limit: int) -> Iterator[Finding]:
    """A list of named counter maps: a slice's `sharedCounters` (named by `name`) or a device's
    `consumesCounters` (named by `counterSet`); names are DNS labels and unique in the list."""
    if items is None:
        return
    names: set[str] = set()

    def counter_set(item: Mapping[str, Any], where: str) -> Iterator[Finding]:
        name = item.get(name_key)
        if not isinstance(name, str) or not name:
            yield Finding(f"{where}.{name_key}", "Required value")
        else:
            yield from checked(dns_label_error(name), f"{where}.{name_key}")
            if name in names:
                yield Finding(where, f"Duplicate value: counter set {name!r}")
            names.add(name)
        yield from counter_findings(item.get("counters"), f"{where}.counters")

    yield from _object_list(
        items,
        path,
        limit=limit,
        too_many=f"Too many: {{count}}: must have at most {limit} items",
        keys={name_key, "counters"},
        each=counter_set,
    )


def node_selection(
    obj: Mapping[str, Any], path: str, *, per_device: bool, allowed: bool = True
) -> Iterator[Finding]:
    """Exactly one node selection field: per slice, or per device under perDeviceNodeSelection."""
    fields = ("nodeName", "nodeSelector", "allNodes") + (() if per_device else ("perDeviceNodeSelection",))
    set_fields = []
    for key in fields:
        if key not in obj or obj[key] is None:
            continue
        value = obj[key]
        if key == "nodeName":
            if not isinstance(value, str) or not value:
                yield Finding(f"{path}.nodeName", "must be either unset or set to a non-empty string")
                continue
            yield from checked(dns_subdomain_error(value), f"{path}.nodeName")
        elif key == "nodeSelector":
            terms = value.get("nodeSelectorTerms") if isinstance(value, Mapping) else None
            if not isinstance(terms, list) or len(terms) != 1:
                yield Finding(
                    f"{path}.nodeSelector.nodeSelectorTerms", "must have exactly one node selector term"
                )
        elif value is not True:
            yield Finding(f"{path}.{key}", "must be either unset or set to true")
            continue
        set_fields.append(f"`{key}`")
    if per_device:
        if not allowed and set_fields:
            yield Finding(
                path,
                "`nodeName`, `nodeSelector` and `allNodes` can only be set if `perDeviceNodeSelection` "
                "is set to true in the ResourceSlice spec",
            )
        elif allowed and len(set_fields) != 1:
            yield Finding(
                path,
                "exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required when "
                "`perDeviceNodeSelection` is set to true in the ResourceSlice spec",
            )
    elif len(set_fields) != 1:
        more = ", but multiple fields are set" if set_fields else ""
        yield Finding(
            path,
            "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required"
            + more,
        )
