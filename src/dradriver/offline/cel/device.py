"""Build the CEL `device` variable from a resource.k8s.io/v1 Device, as the scheduler does.

Follows dynamic-resource-allocation cel/compile.go (DeviceMatches, getAttributeValue,
parseQualifiedName): names without a domain go under the driver's domain, names with one are
split at the first `/`; version attributes become Semver values and capacities Quantities;
`attributes` and `capacity` answer unknown domains with an empty map. A device the scheduler
could not evaluate (a list-valued attribute while DRAListTypeAttributes is off, an unparsable
version) keeps its error, and every selector evaluated on it fails with that error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dradriver.offline.cel.semver import Semver, SemverError
from dradriver.offline.cel.values import INT64_MAX, INT64_MIN, DefaultingMap
from dradriver.quantity import Quantity, QuantityError

_SCALAR_KINDS = ("int", "bool", "string", "version")
_LIST_KINDS = ("ints", "bools", "strings", "versions")


class CELDevice:
    """A device converted once into its CEL value; reuse it across selectors."""

    __slots__ = ("driver", "error", "name", "value")

    def __init__(self, name: str, driver: str, value: dict[str, Any] | None, error: str | None) -> None:
        self.name = name
        self.driver = driver
        self.value = value
        self.error = error

    def __repr__(self) -> str:
        return f"CELDevice({self.name!r}, driver={self.driver!r}{', error' if self.error else ''})"


def split_qualified_name(name: str, default_domain: str) -> tuple[str, str]:
    """parseQualifiedName: `domain/id`, or the driver's domain for a bare id."""
    domain, slash, ident = name.partition("/")
    if not slash:
        return default_domain, name
    return domain, ident


_LIST_FIELDS = {"ints": int, "bools": bool, "strings": str, "versions": str}


def _list_value(name: str, attribute: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """getAttributeValue's list cases (checked before the single values)."""
    for field, kind in _LIST_FIELDS.items():
        values = attribute.get(field)
        if values is None:
            continue
        if not isinstance(values, list) or any(type(v) is not kind for v in values):
            raise ValueError(f"attribute {name}: {field} must be a list of {kind.__name__} values")
        if field == "versions":
            try:
                return tuple(Semver.parse(v) for v in values)
            except SemverError as err:
                raise ValueError(f"attribute {name}: parse semantic version: {err}") from None
        if field == "ints" and not all(INT64_MIN <= v <= INT64_MAX for v in values):
            raise ValueError(f"attribute {name}: ints must be 64-bit integers")
        return tuple(values)
    return None


def _attribute_value(name: str, attribute: Any, list_type_attributes: bool) -> Any:
    if not isinstance(attribute, Mapping):
        raise ValueError(f"attribute {name}: unsupported attribute value")
    if list_type_attributes:
        listed = _list_value(name, attribute)
        if listed is not None:
            return listed
    # Go checks the value fields in this order; the first one set wins.
    if "int" in attribute and attribute["int"] is not None:
        value = attribute["int"]
        if type(value) is not int or not INT64_MIN <= value <= INT64_MAX:
            raise ValueError(f"attribute {name}: int value {value!r} is not a 64-bit integer")
        return value
    if "bool" in attribute and attribute["bool"] is not None:
        value = attribute["bool"]
        if type(value) is not bool:
            raise ValueError(f"attribute {name}: bool value {value!r} is not a boolean")
        return value
    if "string" in attribute and attribute["string"] is not None:
        value = attribute["string"]
        if not isinstance(value, str):
            raise ValueError(f"attribute {name}: string value {value!r} is not a string")
        return value
    if "version" in attribute and attribute["version"] is not None:
        text = attribute["version"]
        try:
            return Semver.parse(str(text))
        except SemverError as err:
            raise ValueError(f"attribute {name}: parse semantic version: {err}") from None
    # List-valued attributes need DRAListTypeAttributes (alpha, off in 1.36).
    raise ValueError(f"attribute {name}: unsupported attribute value")


def _capacity_value(name: str, capacity: Any) -> Quantity:
    raw = capacity.get("value") if isinstance(capacity, Mapping) else None
    if raw is None:
        raise ValueError(f"capacity {name}: value is required")
    text = str(raw).strip() if not isinstance(raw, bool) else ""
    try:
        return Quantity.parse(text)
    except QuantityError as err:
        raise ValueError(f"capacity {name}: {err}") from None


def to_cel_device(device: Mapping[str, Any], driver: str, *, list_type_attributes: bool = False) -> CELDevice:
    """Convert a Device (v1 JSON form; a v1beta1 `basic:` wrapper is unwrapped) once.

    `list_type_attributes` is the DRAListTypeAttributes gate (alpha, off in 1.36): with it,
    `ints`/`bools`/`strings`/`versions` attributes are CEL lists; without it they make every
    selector fail on the device, as in the scheduler.
    """
    name = str(device.get("name", ""))
    basic = device.get("basic")
    body: Mapping[str, Any] = basic if isinstance(basic, Mapping) else device
    attributes: dict[str, dict[str, Any]] = {}
    capacity: dict[str, dict[str, Any]] = {}
    try:
        for qualified, attribute in (body.get("attributes") or {}).items():
            domain, ident = split_qualified_name(str(qualified), driver)
            attributes.setdefault(domain, {})[ident] = _attribute_value(
                str(qualified), attribute, list_type_attributes
            )
        for qualified, cap in (body.get("capacity") or {}).items():
            domain, ident = split_qualified_name(str(qualified), driver)
            capacity.setdefault(domain, {})[ident] = _capacity_value(str(qualified), cap)
    except ValueError as err:
        return CELDevice(name, driver, None, str(err))
    value = {
        "driver": driver,
        "attributes": DefaultingMap(attributes),
        "capacity": DefaultingMap(capacity),
        "allowMultipleAllocations": bool(body.get("allowMultipleAllocations") or False),
    }
    return CELDevice(name, driver, value, None)
