"""Message literals of the protobuf wrappers, Timestamp and Duration
(`google.protobuf.Int64Value{value: 1}`).

cel-go builds the message (`Registry.NewValue`: each field value converted with `ConvertToNative`
to the field's Go type) and turns it straight back into a CEL value: a wrapper is its primitive
(the zero value when unset), a Timestamp or Duration the CEL value. The errors below are those
the conversions return (as probed on Kubernetes), reported as
`field type conversion error for <Type>.<field> value type: ...`.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Mapping
from typing import Any

from dradriver.cel import namedformat, network, times, urls
from dradriver.cel.errors import EvalError
from dradriver.cel.semver import Semver
from dradriver.cel.values import Optional, TypeValue, UInt, is_list
from dradriver.quantity import Quantity

_INT32 = (-(2**31), 2**31 - 1)
_UINT32_MAX = 2**32 - 1
_UINT8_MAX = 255

# ConvertToNative of the Kubernetes library values: `type conversion error from '<name>' to ...`.
_NAMED = (
    (times.Duration, "Duration"),
    (times.Timestamp, "Timestamp"),
    (Quantity, "Quantity"),
    (Semver, "Semver"),
    (network.IP, "IP"),
    (network.CIDR, "CIDR"),
    (urls.URL, "URL"),
    (namedformat.Format, "Format"),
)


class _ConversionError(Exception):
    """A field value that does not convert to the field's Go type."""


def _mismatch(value: Any, native: str) -> _ConversionError:
    """The error of converting `value` to the Go type `native` when its type does not fit."""
    if isinstance(value, bool):
        return _ConversionError(f"type conversion error from bool to '{native}'")
    if isinstance(value, UInt):
        return _ConversionError(f"unsupported type conversion from 'uint' to {native}")
    if isinstance(value, int):
        return _ConversionError(f"unsupported type conversion from 'int' to {native}")
    if isinstance(value, float):
        return _ConversionError(f"type conversion error from Double to '{native}'")
    if isinstance(value, bytes):
        return _ConversionError(f"type conversion error from Bytes to '{native}'")
    if isinstance(value, str):
        return _ConversionError(f"unsupported native conversion from string to '{native}'")
    if value is None:
        return _ConversionError(f"type conversion error from 'null_type' to '{native}'")
    if isinstance(value, TypeValue):
        return _ConversionError("type conversion not supported for 'type'")
    if isinstance(value, Mapping):
        return _ConversionError(f"type conversion error from map to '{native}'")
    if is_list(value):
        return _ConversionError(f"type conversion error from list to '{native}'")
    for cls, name in _NAMED:
        if isinstance(value, cls):
            return _ConversionError(f"type conversion error from '{name}' to '{native}'")
    raise TypeError(f"unexpected CEL value {value!r}")  # pragma: no cover - no other value kinds


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise _mismatch(value, "bool")


def _to_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if is_list(value):
        # A list converts element by element to []uint8.
        return bytes(_to_unsigned(element, _UINT8_MAX, "uint8") for element in value)
    raise _mismatch(value, "[]uint8")


def _to_double(value: Any) -> float:
    if isinstance(value, float):
        return value
    raise _mismatch(value, "float64")


def _to_float(value: Any) -> float:
    if isinstance(value, float):
        try:
            rounded: float = struct.unpack("f", struct.pack("f", value))[0]
        except OverflowError:
            return math.copysign(math.inf, value)  # Go's float32() overflows to infinity
        return rounded
    raise _mismatch(value, "float32")


def _to_int32(value: Any) -> int:
    number = _to_int64(value, "int32")
    if not _INT32[0] <= number <= _INT32[1]:
        raise _ConversionError("integer overflow")
    return number


def _to_int64(value: Any, native: str = "int64") -> int:
    if isinstance(value, int) and not isinstance(value, bool | UInt):
        return value
    raise _mismatch(value, native)


def _to_string(value: Any) -> str:
    if isinstance(value, str):
        return value
    # A Quantity converts too in Kubernetes, to its canonical form (`1k` for `1000`), which needs
    # the format it was parsed with; Quantity does not keep it, so it is reported as unconvertible.
    if isinstance(value, Semver | network.IP | network.CIDR | urls.URL):
        return str(value)
    raise _mismatch(value, "string")


def _to_unsigned(value: Any, maximum: int, native: str) -> UInt:
    if isinstance(value, UInt):
        if value > maximum:
            raise _ConversionError("unsigned integer overflow")
        return value
    raise _mismatch(value, native)


def _timestamp(fields: dict[str, Any]) -> times.Timestamp:
    # timestamppb AsTime: time.Unix(seconds, nanos), the nanoseconds carried into the seconds.
    carry, nanos = divmod(fields.get("nanos", 0), times.NANOS)
    return times.Timestamp(_wrap_int64(fields.get("seconds", 0) + carry), nanos)


def _duration(fields: dict[str, Any]) -> times.Duration:
    # durationpb AsDuration: int64 arithmetic that saturates when it overflows.
    seconds, nanos = fields.get("seconds", 0), fields.get("nanos", 0)
    total = _wrap_int64(seconds * times.NANOS)
    overflow = total != seconds * times.NANOS
    total = _wrap_int64(total + nanos)
    overflow = (
        overflow or (seconds < 0 and nanos < 0 and total > 0) or (seconds > 0 and nanos > 0 and total < 0)
    )
    if overflow and seconds:
        return times.Duration(times.INT64_MIN if seconds < 0 else times.INT64_MAX)
    return times.Duration(total)


def _wrap_int64(value: int) -> int:
    return (value - times.INT64_MIN) % 2**64 + times.INT64_MIN


def _wrapper(
    zero: Any, convert: Callable[[Any], Any]
) -> tuple[dict[str, Callable[[Any], Any]], Callable[..., Any]]:
    return {"value": convert}, lambda fields: fields.get("value", zero)


_SECONDS_NANOS: dict[str, Callable[[Any], Any]] = {"seconds": _to_int64, "nanos": _to_int32}
# Each message type: its fields' conversions (in declaration order), and how the converted fields
# become a CEL value (a wrapper is its primitive, the zero value when unset).
_MESSAGES: dict[str, tuple[dict[str, Callable[[Any], Any]], Callable[[dict[str, Any]], Any]]] = {
    "google.protobuf.BoolValue": _wrapper(False, _to_bool),
    "google.protobuf.BytesValue": _wrapper(b"", _to_bytes),
    "google.protobuf.DoubleValue": _wrapper(0.0, _to_double),
    "google.protobuf.FloatValue": _wrapper(0.0, _to_float),
    "google.protobuf.Int32Value": _wrapper(0, _to_int32),
    "google.protobuf.Int64Value": _wrapper(0, _to_int64),
    "google.protobuf.StringValue": _wrapper("", _to_string),
    "google.protobuf.UInt32Value": _wrapper(UInt(0), lambda v: _to_unsigned(v, _UINT32_MAX, "uint32")),
    "google.protobuf.UInt64Value": _wrapper(UInt(0), lambda v: _to_unsigned(v, 2**64 - 1, "uint64")),
    times.TIMESTAMP_TYPE: (_SECONDS_NANOS, _timestamp),
    times.DURATION_TYPE: (_SECONDS_NANOS, _duration),
}


def new_message(type_name: str, fields: dict[str, Any]) -> Any:
    """The value of a message literal with these (already evaluated) fields."""
    if type_name not in _MESSAGES:
        # The checker lets `null_type{}` through; no message type is named so.
        raise EvalError(f"unknown type '{type_name}'")
    conversions, build = _MESSAGES[type_name]
    converted: dict[str, Any] = {}
    for name, convert in conversions.items():
        if name not in fields:
            continue
        value = fields[name]
        try:
            # An optional converts as the value it holds.
            while isinstance(value, Optional):
                if not value.has_value:
                    raise _ConversionError("optional.none() dereference")
                value = value.value
            converted[name] = convert(value)
        except _ConversionError as err:
            raise EvalError(f"field type conversion error for {type_name}.{name} value type: {err}") from None
    return build(converted)
