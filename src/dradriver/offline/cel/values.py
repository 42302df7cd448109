"""Runtime CEL values as plain Python objects, and the cel-go rules for equality and ordering.

Representation: bool, int (int64), `UInt` (uint64), float (double), str, bytes, None (null),
tuple (list), dict (map), `Quantity`, `Semver`, `TypeValue`. Building on native objects keeps
evaluation fast; the functions here add what Python would get wrong (bool is an int, 1 == 1.0
across types, Quantity vs string errors instead of being unequal).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any, TypeVar, cast

from dradriver.offline.cel import times
from dradriver.offline.cel.errors import EvalError
from dradriver.offline.cel.semver import Semver
from dradriver.quantity import Quantity

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1


class UInt(int):
    """A CEL uint. Arithmetic on it must re-wrap results; plain ints are CEL ints."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"{int(self)}u"


@dataclass(frozen=True, slots=True)
class TypeValue:
    """A CEL type used as a value: `type(1) == int`."""

    name: str

    def __repr__(self) -> str:
        return self.name


class OpaqueValue:
    """A value of a Kubernetes library's opaque type (`net.IP`, `net.CIDR`, `kubernetes.URL`):
    equal only to a value of the same type; any other right operand is "no such overload"."""

    __slots__ = ()
    cel_type_name = "opaque"


class Optional:
    """cel-go's types.Optional: `optional.of(v)` holds `value`; OPTIONAL_NONE holds nothing."""

    __slots__ = ("has_value", "value")

    def __init__(self, value: Any = None, *, has_value: bool = True) -> None:
        self.value = value
        self.has_value = has_value

    def __repr__(self) -> str:
        return f"optional.of({self.value!r})" if self.has_value else "optional.none()"


OPTIONAL_NONE = Optional(has_value=False)


class DefaultingMap(dict[str, Any]):
    """`device.attributes` / `device.capacity`: an unknown domain reads as an empty map.

    Kubernetes wraps these maps so that Find() always succeeds (dynamic-resource-allocation
    cel/compile.go, newStringInterfaceMapWithDefault); `in` still tests real membership and
    `has()` is therefore always true for them.
    """

    __slots__ = ()


class ComputedQuantity(Quantity):
    """The result of `add`/`sub`: a *pointer* to a Quantity in the Kubernetes library, which
    Quantity.Equal does not accept as the right operand (`q == a.sub(b)` is "no such overload")."""

    __slots__ = ()

    @classmethod
    def of(cls, value: Quantity) -> ComputedQuantity:
        out = cls.__new__(cls)
        for slot in Quantity.__slots__:
            object.__setattr__(out, slot, getattr(value, slot))
        return out


class EmptyMessage:
    """A `google.protobuf.Empty` message: a message value of its own type. One unpacked from an
    Any keeps the unknown fields it was decoded with, which proto.Equal compares."""

    __slots__ = ("unknown",)

    def __init__(self, unknown: tuple[Any, ...] = ()) -> None:
        self.unknown = unknown

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EmptyMessage) and self.unknown == other.unknown

    def __hash__(self) -> int:
        return hash(self.unknown)

    def __repr__(self) -> str:
        return "google.protobuf.Empty{}"


EMPTY_MAP: Mapping[str, Any] = {}

TYPE_NAMES: dict[type, str] = {
    bool: "bool",
    int: "int",
    UInt: "uint",
    float: "double",
    str: "string",
    bytes: "bytes",
    type(None): "null_type",
    tuple: "list",
    list: "list",
    dict: "map",
    DefaultingMap: "map",
    Quantity: "kubernetes.Quantity",
    ComputedQuantity: "kubernetes.Quantity",
    Semver: "kubernetes.Semver",
    TypeValue: "type",
    Optional: "optional_type",
    times.Timestamp: times.TIMESTAMP_TYPE,
    times.Duration: times.DURATION_TYPE,
    EmptyMessage: "google.protobuf.Empty",
}


def type_name(value: object) -> str:
    """The runtime type name cel-go prints in errors, e.g. `no such overload: f(int, string)`."""
    name = TYPE_NAMES.get(type(value))
    if name is not None:
        return name
    if isinstance(value, Mapping):
        return "map"
    if isinstance(value, OpaqueValue):
        return value.cel_type_name
    return type(value).__name__


def type_value_of(value: object) -> TypeValue:
    return TypeValue(type_name(value))


class ArgumentMismatchError(EvalError):
    """An argument of the wrong runtime type. How cel-go words it depends on how the function is
    bound (functions.RUNTIME applies the rule), so the message here is only a placeholder."""


_T = TypeVar("_T")


def expect(value: object, kind: type[_T]) -> _T:
    """A library function's argument of exactly this runtime type, else "no such overload"."""
    if type(value) is not kind:
        raise ArgumentMismatchError("no such overload")
    return value


def no_such_overload(function: str, *args: object) -> EvalError:
    del function, args
    return ArgumentMismatchError("no such overload")


def overload_signature(function: str, args: tuple[object, ...]) -> str:
    """decls.MaybeNoSuchOverload: the function and the runtime types of all its arguments."""
    return f"no such overload: {function}({', '.join(type_name(a) for a in args)})"


def is_list(value: object) -> bool:
    return type(value) is tuple or type(value) is list


def _numeric_equal(a: int | float, b: int | float) -> bool:
    if isinstance(a, float) and math.isnan(a):
        return False
    if isinstance(b, float) and math.isnan(b):
        return False
    if isinstance(a, float) or isinstance(b, float):
        # Exact comparison of an int64/uint64 with a double, as compareIntDouble does.
        return _compare_numbers(a, b) == 0
    return int(a) == int(b)


_NUMERIC = (int, UInt, float)
#: Key types Go compares by value; other keys (lists, maps, quantities) are pointers.
_VALUE_KEYS: tuple[type, ...] = (times.Timestamp, times.Duration, TypeValue, type(None))
#: Types equal only to a value of the very same type, compared by value.
_SAME_TYPE_ONLY = frozenset({str, bool, bytes, TypeValue, times.Timestamp, times.Duration})


def equal(a: object, b: object) -> bool:
    """`a == b` with cel-go's heterogeneous equality (types.Equal then left.Equal(right)).

    Raises EvalError where cel-go returns an error value: a Quantity or Semver on the left and
    anything but the same type on the right.
    """
    if a is None or b is None:
        return a is None and b is None
    ta = type(a)
    if ta in _SAME_TYPE_ONLY:
        return type(b) is ta and a == b
    if ta in _NUMERIC:
        if type(b) in _NUMERIC:
            return _numeric_equal(a, b)  # type: ignore[arg-type]
        return False
    if ta is tuple or ta is list:
        return _list_equal(a, b)  # type: ignore[arg-type]
    if isinstance(a, dict):
        return _map_equal(a, b)
    if isinstance(a, Quantity):
        if type(b) is not Quantity:
            raise EvalError("no such overload")
        return a.compare(b) == 0
    if isinstance(a, Semver):
        if not isinstance(b, Semver):
            raise EvalError("no such overload")
        return a.compare(b) == 0
    if ta is Optional:
        return _optional_equal(a, b)  # type: ignore[arg-type]
    if isinstance(a, OpaqueValue) and type(b) is not ta:
        raise EvalError("no such overload")
    return a == b


def _optional_equal(a: Optional, b: object) -> bool:
    # Optional.Equal: none equals none; otherwise both hold values and the values are equal.
    if type(b) is not Optional:
        return False
    if not a.has_value or not b.has_value:
        return a.has_value == b.has_value
    return equal(a.value, b.value)


def _element_equal_or_unknown(a: object, b: object) -> bool | None:
    try:
        return equal(a, b)
    except EvalError:
        return None


def _list_equal(a: tuple[Any, ...] | list[Any], b: object) -> bool:
    # baseList.Equal: only a definite "false" element decides; element errors are skipped.
    if not is_list(b):
        return False
    other: tuple[Any, ...] = b  # type: ignore[assignment]
    if len(a) != len(other):
        return False
    return all(_element_equal_or_unknown(x, y) is not False for x, y in zip(a, other, strict=True))


def _map_equal(a: dict[Any, Any], b: object) -> bool:
    # baseMap.Equal: every key of a must be found in b with a value not definitely unequal.
    if not isinstance(b, dict):
        return False
    if len(a) != len(b):
        return False
    for key, value in a.items():
        found, other_value = map_find(b, key)
        if not found:
            return False
        if _element_equal_or_unknown(value, other_value) is False:
            return False
    return True


def map_find(mapping: Mapping[Any, Any], key: object) -> tuple[bool, Any]:
    """Look a key up the way cel-go's maps do (refValMapAccessor.Find): the key itself first, then
    a double as the int or uint it equals, an int as a uint and a uint as an int."""
    tk = type(key)
    if tk is str:
        if key in mapping:
            return True, mapping[key]
        return False, None
    if tk is bool or tk in _VALUE_KEYS:
        return _find_same_type(mapping, key)
    if tk in _NUMERIC:
        found = _find_same_type(mapping, key)
        return found if found[0] else _find_other_number(mapping, key)
    return False, None


def _find_same_type(mapping: Mapping[Any, Any], key: object) -> tuple[bool, Any]:
    tk = type(key)
    for candidate, value in mapping.items():
        if type(candidate) is tk and candidate == key:
            return True, value
    return False, None


def _find_other_number(mapping: Mapping[Any, Any], key: object) -> tuple[bool, Any]:
    """A double as the int or uint it equals, an int as a uint and a uint as an int."""
    tk = type(key)
    if tk is float:
        if not float(key).is_integer():  # type: ignore[arg-type]
            return False, None
        others: tuple[type, ...] = (int, UInt)
    else:
        others = (UInt,) if tk is int else (int,)
    number = int(key)  # type: ignore[call-overload]
    for other in others:
        for candidate, value in mapping.items():
            if type(candidate) is other and int(cast("int", candidate)) == number:
                return True, value
    return False, None


class KeyedMap(Mapping[Any, Any]):
    """A map literal whose keys are of several runtime types (`{dyn(1.0): 1, dyn(1): 2}`): cel-go
    keeps them in a Go map, where keys of different types never collide (1, 1u, 1.0 and true are
    four keys) and values that Go compares by pointer are distinct keys."""

    __slots__ = ("_entries",)

    def __init__(self, pairs: Iterable[tuple[Any, Any]]) -> None:
        self._entries: dict[Any, tuple[Any, Any]] = {}
        for key, value in pairs:
            self._entries[_slot(key)] = (key, value)

    def __getitem__(self, key: Any) -> Any:
        return self._entries[_slot(key)][1]

    def __iter__(self) -> Iterator[Any]:
        return (key for key, _ in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)


def _slot(key: Any) -> Any:
    tk = type(key)
    if tk is str:
        return key
    if tk is float and math.isnan(key):
        return (tk, id(key))
    if tk in _NUMERIC or tk is bool or tk in _VALUE_KEYS:
        return (tk, key)
    return (tk, id(key))


def build_map(pairs: list[tuple[Any, Any]]) -> Mapping[Any, Any]:
    """A map literal's value: a dict while its keys are of one plain type, else a KeyedMap."""
    kinds = {type(key) for key, _ in pairs}
    if len(kinds) <= 1 and kinds <= {str, int, UInt, bool}:
        return dict(pairs)
    return KeyedMap(pairs)


def _compare_numbers(a: int | float, b: int | float) -> int:
    if isinstance(a, float) or isinstance(b, float):
        if (isinstance(a, float) and math.isnan(a)) or (isinstance(b, float) and math.isnan(b)):
            raise EvalError("NaN values cannot be ordered")
        if isinstance(a, float) and isinstance(b, float):
            return (a > b) - (a < b)
        # One side is an int64 or uint64: compare exactly, like compareIntDouble.
        if isinstance(a, float):
            if math.isinf(a):
                return 1 if a > 0 else -1
            fa = _exact(a)
            return (fa > int(b)) - (fa < int(b))
        if math.isinf(b):
            return -1 if b > 0 else 1
        fb = _exact(b)
        return (int(a) > fb) - (int(a) < fb)
    return (a > b) - (a < b)


def _exact(value: float) -> Fraction:
    return Fraction(value)


def compare(a: object, b: object, function: str) -> int:
    """Ordering for <, <=, >, >= (cel-go Comparer.Compare): -1, 0 or 1."""
    ta, tb = type(a), type(b)
    if ta in _NUMERIC and tb in _NUMERIC:
        return _compare_numbers(a, b)  # type: ignore[arg-type]
    if ta is tb and ta in (str, bytes, bool):
        left: Any = a
        return int((left > b) - (left < b))
    if ta is tb and ta in (times.Timestamp, times.Duration):
        return times.compare(a, b)  # type: ignore[arg-type]
    raise no_such_overload(function, a, b)


# The Go types (%T) of cel-go's and Kubernetes' values, which a failed iteration names.
_GO_TYPES = {
    "string": "types.String",
    "int": "types.Int",
    "uint": "types.Uint",
    "double": "types.Double",
    "bool": "types.Bool",
    "bytes": "types.Bytes",
    "null_type": "types.Null",
    "type": "*types.Type",
    "optional_type": "*types.Optional",
    times.TIMESTAMP_TYPE: "types.Timestamp",
    times.DURATION_TYPE: "types.Duration",
    "kubernetes.Quantity": "cel.Quantity",
    "kubernetes.Semver": "cel.Semver",
    "net.IP": "cel.IP",
    "net.CIDR": "cel.CIDR",
    "kubernetes.URL": "cel.URL",
    "kubernetes.NamedFormat": "cel.Format",
}


def iterate(value: object) -> Iterator[Any]:
    """Iteration order of a comprehension range: list elements or map keys."""
    if is_list(value):
        return iter(value)  # type: ignore[call-overload,no-any-return]
    if isinstance(value, Mapping):
        return iter(value)
    raise EvalError(f"got '{_GO_TYPES.get(type_name(value), type_name(value))}', expected iterable type")


def check_int(value: int) -> int:
    if value < INT64_MIN or value > INT64_MAX:
        raise EvalError("integer overflow")
    return value


def check_uint(value: int) -> UInt:
    if value < 0 or value > UINT64_MAX:
        raise EvalError("unsigned integer overflow")
    return UInt(value)


def size_of(value: object) -> int:
    """cel-go actualSize: a Sizer's size, an optional's value's size, else 1."""
    if isinstance(value, str | bytes | tuple | list | Mapping):
        return len(value)
    if type(value) is Optional and value.has_value:
        return size_of(value.value)
    return 1


def format_value(value: object) -> str:
    """A short CEL-like rendering used in error messages (`no such key: x`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if type(value) is float:
        return go_format_float(value)
    return str(value)


def go_format_float(value: float) -> str:
    """Go's strconv.FormatFloat(v, 'g', -1, 64), which `%g` and string(double) use."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    # repr gives the shortest round-tripping digits, as Go's shortest formatting does.
    _, digit_tuple, exponent = Decimal(repr(abs(value))).normalize().as_tuple()
    digits = "".join(map(str, digit_tuple))
    sign = "-" if value < 0 else ""
    point = len(digits) + int(exponent)
    exp10 = point - 1
    if exp10 < -4 or exp10 >= 6:
        body = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{body}e{'+' if exp10 >= 0 else '-'}{abs(exp10):02d}"
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return f"{sign}{digits}{'0' * (point - len(digits))}"
    return f"{sign}{digits[:point]}.{digits[point:]}"


_GO_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}


def go_quote(text: str) -> str:
    """strconv.Quote: printable characters as they are, the rest escaped."""
    out = ['"']
    for ch in text:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x80:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) <= 0xFFFF:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    out.append('"')
    return "".join(out)
