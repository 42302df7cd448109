"""Message literals of the protobuf well-known types (`google.protobuf.Int64Value{value: 1}`).

cel-go builds the message (`Registry.NewValue`: each field value converted with `ConvertToNative`
to the field's Go type) and turns it straight back into a CEL value: a wrapper is its primitive
(the zero value when unset), a Timestamp or Duration the CEL value, a Struct, ListValue or Value
the JSON value (a map, list, double, string, bool or null), an Empty a message value and an Any
the message it packs. The errors below are those the conversions return (as probed on
Kubernetes), reported as `field type conversion error for <Type>.<field> value type: ...`.
"""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from dradriver.offline.cel import namedformat, network, times, urls
from dradriver.offline.cel.errors import EvalError
from dradriver.offline.cel.semver import Semver
from dradriver.offline.cel.values import EmptyMessage, Optional, TypeValue, UInt, is_list, type_name
from dradriver.quantity import Quantity

T = TypeVar("T")

_INT32 = (-(2**31), 2**31 - 1)
_UINT32_MAX = 2**32 - 1
_UINT8_MAX = 255
# Integers a JSON number holds exactly; larger ones become strings (proto3 JSON).
_JSON_INT_MAX = 2**53 - 1

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
#: The name a conversion error gives each other kind of value (the named types quoted).
_KINDS: tuple[tuple[type[Any], str], ...] = (
    (bool, "bool"),
    (float, "Double"),
    (bytes, "Bytes"),
    (type(None), "'null_type'"),
    (Mapping, "map"),
    *((cls, f"'{name}'") for cls, name in _NAMED),
)


class _ConversionError(Exception):
    """A field value that does not convert to the field's Go type."""


class _FieldTypeError(Exception):
    """A repeated or map field given a value of another kind."""


def _mismatch(value: Any, native: str) -> _ConversionError:
    """The error of converting `value` to the Go type `native` when its type does not fit."""
    if isinstance(value, TypeValue):
        return _ConversionError("type conversion not supported for 'type'")
    if isinstance(value, str):
        return _ConversionError(f"unsupported native conversion from string to '{native}'")
    if isinstance(value, int) and not isinstance(value, bool):
        kind = "uint" if isinstance(value, UInt) else "int"
        return _ConversionError(f"unsupported type conversion from '{kind}' to {native}")
    if is_list(value):
        return _ConversionError(f"type conversion error from list to '{native}'")
    for cls, name in _KINDS:
        if isinstance(value, cls):
            return _ConversionError(f"type conversion error from {name} to '{native}'")
    raise TypeError(f"unexpected CEL value {value!r}")  # pragma: no cover - no other value kinds


def _only(native_type: type[T], native: str) -> Callable[[Any], T]:
    """The conversion to the Go type `native` that takes values of `native_type` alone."""

    def convert(value: Any) -> T:
        if isinstance(value, native_type):
            return value
        raise _mismatch(value, native)

    return convert


_to_bool = _only(bool, "bool")
_to_double = _only(float, "float64")


def _to_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if is_list(value):
        # A list converts element by element to []uint8.
        return bytes(_to_unsigned(element, _UINT8_MAX, "uint8") for element in value)
    raise _mismatch(value, "[]uint8")


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
    if isinstance(value, Quantity):
        return value.canonical()  # Quantity.String(): `1k` for `1000`
    if isinstance(value, Semver | network.IP | network.CIDR | urls.URL):
        return str(value)
    raise _mismatch(value, "string")


def _to_unsigned(value: Any, maximum: int, native: str) -> UInt:
    if isinstance(value, UInt):
        if value > maximum:
            raise _ConversionError("unsigned integer overflow")
        return value
    raise _mismatch(value, native)


def _unwrap(value: Any) -> Any:
    """An optional converts as the value it holds."""
    while isinstance(value, Optional):
        if not value.has_value:
            raise _ConversionError("optional.none() dereference")
        value = value.value
    return value


def _to_json(value: Any) -> Any:
    """ConvertToNative to *structpb.Value, read back as CEL: the proto3 JSON form of the value."""
    value = _unwrap(value)
    if value is None or isinstance(value, bool | float | str):
        return value
    if isinstance(value, int):
        return float(value) if -_JSON_INT_MAX <= value <= _JSON_INT_MAX else str(int(value))
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, times.Duration):
        return times.format_duration(value)
    if isinstance(value, times.Timestamp):
        return times.format_timestamp(value)
    if isinstance(value, EmptyMessage):
        return {}
    if is_list(value):
        return tuple(_to_json(element) for element in value)
    if isinstance(value, Mapping):
        return _json_object(value)
    raise _mismatch(value, "*structpb.Value")


def _json_object(value: Mapping[Any, Any]) -> dict[str, Any]:
    return {_to_string(_unwrap(key)): _to_json(element) for key, element in value.items()}


def _field_type_name(value: Any) -> str:
    if is_list(value):
        return "list(dyn)"
    if isinstance(value, Mapping):
        return "map(dyn, dyn)"
    return type_name(value)


def _to_struct_fields(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise _FieldTypeError(_field_type_name(value))
    return _json_object(value)


def _to_list_values(value: Any) -> tuple[Any, ...]:
    if not is_list(value):
        raise _FieldTypeError(_field_type_name(value))
    return tuple(_to_json(element) for element in value)


def _to_struct(value: Any) -> dict[str, Any]:
    if isinstance(value, Mapping):
        return _json_object(value)
    raise _mismatch(value, "*structpb.Struct")


def _to_list(value: Any) -> tuple[Any, ...]:
    if isinstance(value, Mapping):
        # A map converts by field name to the Go struct, whose one field is `Values`.
        for key in value:
            if key != "values":
                field = str(key)[:1].upper() + str(key)[1:]
                raise _ConversionError(
                    f"type conversion error, no such field '{field}' in type 'structpb.ListValue'"
                )
        return _json_list(value.get("values", ()), "[]*structpb.Value")
    return _json_list(value, "*structpb.ListValue")


def _json_list(value: Any, native: str) -> tuple[Any, ...]:
    if is_list(value):
        return tuple(_to_json(element) for element in value)
    raise _mismatch(value, native)


def _to_enum(value: Any) -> int:
    number = _to_int64(value, "protoreflect.EnumNumber")
    if not _INT32[0] <= number <= _INT32[1]:
        raise _ConversionError("integer overflow")
    return number


def _json_value(fields: dict[str, Any]) -> Any:
    # The oneof holds the field set last; cel-go sets a literal's fields in Go's random map order,
    # so a literal that sets several has no one value in Kubernetes (here: the last declared).
    kind = next(reversed(fields), None)
    return None if kind in (None, "null_value") else fields[kind]


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


# -- Any: the packed message, decoded from its protobuf bytes ----------------------------------------


class _MalformedError(Exception):
    """Bytes that proto.Unmarshal rejects."""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = 0
    for i in range(10):
        if pos + i >= len(data) or (i == 9 and data[pos + i] > 1):
            raise _MalformedError
        value |= (data[pos + i] & 0x7F) << (7 * i)
        if data[pos + i] < 0x80:
            return value, pos + i + 1
    raise _MalformedError  # pragma: no cover - the loop returns or raises at the tenth byte


def _wire(data: bytes) -> list[tuple[int, int, Any]]:
    """The fields of an encoded message in order: (number, wire type, raw value)."""
    out, end = _fields(data, 0, None)
    if end != len(data):
        raise _MalformedError  # an end of group outside a group
    return out


def _fields(data: bytes, pos: int, group: int | None) -> tuple[list[tuple[int, int, Any]], int]:
    """The fields from pos up to the end, or to the end of the group numbered `group`."""
    out: list[tuple[int, int, Any]] = []
    while pos < len(data):
        key, after = _varint(data, pos)
        number, wire = key >> 3, key & 7
        value: Any
        if number == 0 or number >= 2**29:
            raise _MalformedError
        if wire == 4:
            if number != group:
                raise _MalformedError
            return out, after
        pos = after
        if wire == 3:  # a group: an unknown field to these messages
            group_fields, pos = _fields(data, pos, number)
            value = tuple(group_fields)
        elif wire == 0:
            value, pos = _varint(data, pos)
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            if pos + size > len(data):
                raise _MalformedError
            value, pos = data[pos : pos + size], pos + size
        elif wire == 2:
            size, pos = _varint(data, pos)
            if pos + size > len(data):
                raise _MalformedError
            value, pos = data[pos : pos + size], pos + size
        else:
            raise _MalformedError
        out.append((number, wire, value))
    if group is not None:
        raise _MalformedError
    return out, pos


def _scalars(data: bytes, kinds: dict[int, str]) -> dict[int, Any]:
    """Each known scalar field's last value (a field with another wire type is an unknown one)."""
    wires = {"varint": 0, "int64": 0, "int32": 0, "uint32": 0, "bool": 0, "double": 1, "float": 5}
    out: dict[int, Any] = {}
    for number, wire, raw in _wire(data):
        kind = kinds.get(number)
        if kind is None or wires.get(kind, 2) != wire:
            continue
        out[number] = _scalar(kind, raw)
    return out


def _scalar(kind: str, raw: Any) -> Any:
    if kind in ("int64", "int32", "uint32"):
        bits = {"int64": 64, "int32": 32, "uint32": 32}[kind]
        value = raw % 2**bits
        return UInt(value) if kind == "uint32" else value - (value >= 2 ** (bits - 1)) * 2**bits
    if kind == "bool":
        return raw != 0
    if kind in ("double", "float"):
        return float(struct.unpack("<d" if kind == "double" else "<f", raw)[0])
    if kind == "string":
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _MalformedError from None
    return raw  # varint (uint64) and bytes as they are


def _unpack_wrapper(kind: str, zero: Any) -> Callable[[bytes], Any]:
    def unpack(data: bytes) -> Any:
        value = _scalars(data, {1: kind}).get(1, zero)
        return UInt(value) if kind == "varint" else value

    return unpack


def _unpack_seconds_nanos(build: Callable[[dict[str, Any]], Any]) -> Callable[[bytes], Any]:
    def unpack(data: bytes) -> Any:
        fields = _scalars(data, {1: "int64", 2: "int32"})
        return build({"seconds": fields.get(1, 0), "nanos": fields.get(2, 0)})

    return unpack


def _unpack_value(data: bytes) -> Any:
    kinds = {1: "int32", 2: "double", 3: "string", 4: "bool"}
    value: Any = None
    for number, wire, raw in _wire(data):
        if number in kinds and wire == (2 if number == 3 else 1 if number == 2 else 0):
            value = None if number == 1 else _scalar(kinds[number], raw)
        elif number in (5, 6) and wire == 2:
            value = _unpack_struct(raw) if number == 5 else _unpack_list(raw)
    return value


def _unpack_struct(data: bytes) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for number, wire, raw in _wire(data):
        if number == 1 and wire == 2:
            key, value = "", None
            for entry_number, entry_wire, entry_raw in _wire(raw):
                if entry_number == 1 and entry_wire == 2:
                    key = _scalar("string", entry_raw)
                elif entry_number == 2 and entry_wire == 2:
                    value = _unpack_value(entry_raw)
            out[key] = value
    return out


def _unpack_list(data: bytes) -> tuple[Any, ...]:
    return tuple(_unpack_value(raw) for number, wire, raw in _wire(data) if number == 1 and wire == 2)


def _unpack_empty(data: bytes) -> EmptyMessage:
    # proto.Equal compares unknown fields number by number, in order within a number.
    by_number: dict[int, list[tuple[int, Any]]] = {}
    for number, wire, raw in _wire(data):
        by_number.setdefault(number, []).append((wire, raw))
    return EmptyMessage(tuple(sorted((number, tuple(fields)) for number, fields in by_number.items())))


_UNPACK: dict[str, Callable[[bytes], Any]] = {
    "google.protobuf.BoolValue": _unpack_wrapper("bool", False),
    "google.protobuf.BytesValue": _unpack_wrapper("bytes", b""),
    "google.protobuf.DoubleValue": _unpack_wrapper("double", 0.0),
    "google.protobuf.FloatValue": _unpack_wrapper("float", 0.0),
    "google.protobuf.Int32Value": _unpack_wrapper("int32", 0),
    "google.protobuf.Int64Value": _unpack_wrapper("int64", 0),
    "google.protobuf.StringValue": _unpack_wrapper("string", ""),
    "google.protobuf.UInt32Value": _unpack_wrapper("uint32", UInt(0)),
    "google.protobuf.UInt64Value": _unpack_wrapper("varint", 0),
    times.TIMESTAMP_TYPE: _unpack_seconds_nanos(_timestamp),
    times.DURATION_TYPE: _unpack_seconds_nanos(_duration),
    "google.protobuf.Empty": _unpack_empty,
    "google.protobuf.Struct": _unpack_struct,
    "google.protobuf.ListValue": _unpack_list,
    "google.protobuf.Value": _unpack_value,
}


def _unpack(fields: dict[str, Any]) -> Any:
    """anypb.UnmarshalNew, the type resolved by the last segment of the URL; an Any that does not
    unpack stays a message that cel-go cannot turn into a CEL value."""
    type_url, data = fields.get("type_url", ""), fields.get("value", b"")
    unpack = _UNPACK.get(type_url.rpartition("/")[2]) if type_url else None
    if unpack is not None:
        try:
            return unpack(data)
        except _MalformedError:
            pass
    # The message in protobuf text format (compact, as its String() prints it).
    text = " ".join(
        f'{name}:"{_text_escape(value if isinstance(value, bytes) else value.encode())}"'
        for name, value in (("type_url", type_url), ("value", data))
        if value
    )
    raise _ConversionError(f"unsupported conversion to ref.Val: (*dynamicpb.Message){text}")


def _text_escape(data: bytes) -> str:
    """protobuf-go's text encoder appendString (bytes that are not UTF-8 in hex)."""
    out = []
    for char in data.decode("utf-8", errors="surrogateescape"):
        code = ord(char)
        if 0xDC80 <= code <= 0xDCFF:
            out.append(f"\\x{code - 0xDC00:02x}")
        elif char in '"\\':
            out.append("\\" + char)
        elif char in "\n\r\t":
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t"}[char])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif 0x80 <= code <= 0x9F:
            out.append(f"\\u{code:04x}")
        else:
            out.append(char)
    return "".join(out)


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
    "google.protobuf.Empty": ({}, lambda _fields: EmptyMessage()),
    "google.protobuf.Struct": ({"fields": _to_struct_fields}, lambda fields: fields.get("fields", {})),
    "google.protobuf.ListValue": ({"values": _to_list_values}, lambda fields: fields.get("values", ())),
    "google.protobuf.Value": (
        {
            "null_value": _to_enum,
            "number_value": _to_double,
            "string_value": _to_string,
            "bool_value": _to_bool,
            "struct_value": _to_struct,
            "list_value": _to_list,
        },
        _json_value,
    ),
    "google.protobuf.Any": ({"type_url": _to_string, "value": _to_bytes}, _unpack),
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
        try:
            converted[name] = convert(_unwrap(fields[name]))
        except _ConversionError as err:
            raise EvalError(f"field type conversion error for {type_name}.{name} value type: {err}") from None
        except _FieldTypeError as err:
            raise EvalError(f"unsupported field type for {type_name}.{name}: {err}") from None
    try:
        return build(converted)
    except _ConversionError as err:
        raise EvalError(str(err)) from None
