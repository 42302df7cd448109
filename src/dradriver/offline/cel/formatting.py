"""`<string>.format(<list>)` as cel-go's ext strings library (version 2, locale en_US) has it
(ext/formatting.go): the clauses, how each type prints, the runtime errors, and the checks the
format validator makes at compile time on a literal format string with a literal list.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from dradriver.offline.cel import network, times
from dradriver.offline.cel.errors import EvalError
from dradriver.offline.cel.values import (
    ArgumentMismatchError,
    UInt,
    go_format_float,
    go_quote,
    is_list,
    no_such_overload,
    type_name,
)

DEFAULT_PRECISION = 6

_STRING_KINDS = "strings, bools, bytes, ints, doubles, maps, lists, types, durations, and timestamps"


class FormatError(Exception):
    """A clause applied to a value it cannot format; `index` is the argument's, -1 at run time."""

    def __init__(self, message: str, index: int = -1) -> None:
        super().__init__(message)
        self.message = message
        self.index = index


def _clause_error(clause: str, kind: str, index: int) -> FormatError:
    return FormatError(clause_message(clause, kind), index)


def clause_message(clause: str, kind: str) -> str:
    messages = {
        "s": f"string clause can only be used on {_STRING_KINDS}, was given {kind}",
        "d": f"decimal clause can only be used on integers, was given {kind}",
        "f": f"fixed-point clause can only be used on doubles, was given {kind}",
        "e": f"scientific clause can only be used on doubles, was given {kind}",
        "b": f"only integers and bools can be formatted as binary, was given {kind}",
        "x": f"only integers, byte buffers, and strings can be formatted as hex, was given {kind}",
        "o": f"octal clause can only be used on integers, was given {kind}",
    }
    return messages[clause.lower()]


# -- formatting values (stringFormatter) ------------------------------------------------------------


def to_string(value: Any) -> str:
    """CEL's string() conversion, which the formatter also uses for scalars."""
    tv = type(value)
    if tv is str:
        return cast(str, value)
    if tv is bool:
        return "true" if value else "false"
    if tv is int or tv is UInt:
        return str(int(value))
    if tv is float:
        return go_format_float(value)
    if tv is bytes:
        try:
            return cast(bytes, value).decode("utf-8")
        except UnicodeDecodeError:
            raise EvalError("invalid UTF-8 in bytes, cannot convert to string") from None
    if tv is network.IP or tv is network.CIDR:
        return str(value)
    if tv is times.Timestamp:
        return times.format_timestamp(value)
    if tv is times.Duration:
        return times.format_duration(value)
    raise no_such_overload("string", value)


def _format_string(value: Any) -> str:
    """FormatString: lists and maps in CEL syntax, scalars as string() converts them."""
    if is_list(value):
        return _format_list(value)
    if isinstance(value, Mapping):
        return _format_map(value)
    if value is None:
        return "null"
    if type(value) in (int, UInt, float, bool, str, bytes, times.Timestamp, times.Duration):
        try:
            return to_string(value)
        except EvalError as err:
            raise FormatError(f"could not convert argument {go_quote(err.message)} to string") from None
    if type_name(value) == "type":
        return str(value)
    raise _clause_error("s", type_name(value), -1)


def _member(value: Any) -> str:
    """clauseForType + quoteForCEL: one element of a list or value of a map."""
    kind = type(value)
    if kind is int or kind is UInt:
        return str(int(value))
    if kind is float:
        text = f"{value:.{DEFAULT_PRECISION}f}" if math.isfinite(value) else go_format_float(value)
        return text if math.isfinite(value) else go_quote(text)
    if kind is str:
        return go_quote(value)
    if kind is bytes:
        return "b" + go_quote(_format_string(value))
    if kind is times.Timestamp:
        return f"timestamp({go_quote(to_string(value))})"
    if kind is times.Duration:
        return f"duration({go_quote(to_string(value))})"
    if value is None or kind is bool or type_name(value) == "type":
        return _format_string(value)
    if is_list(value):
        return _format_list(value)
    if isinstance(value, Mapping):
        return _format_map(value)
    raise EvalError(f"no formatting function for {type_name(value)}")


def _format_list(items: Sequence[Any]) -> str:
    return "[" + ", ".join(_member(item) for item in items) + "]"


def _format_map(mapping: Mapping[Any, Any]) -> str:
    pairs = []
    for key, value in mapping.items():
        if type(key) is str:
            key_text = go_quote(key)
        elif type(key) is bool:
            key_text = "true" if key else "false"
        elif type(key) in (int, UInt):
            key_text = str(int(key))
        else:
            raise EvalError(f"no formatting function for map key of type {type_name(key)}")
        pairs.append((key_text, _member(value)))
    pairs.sort(key=lambda pair: pair[0].encode())
    return "{" + ", ".join(f"{k}:{v}" for k, v in pairs) + "}"


def _float_arg(value: Any, clause: str) -> float:
    if type(value) is str and value in ("NaN", "Infinity", "-Infinity"):
        return {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}[value]
    if type(value) is not float:
        raise _clause_error(clause, type_name(value), -1)
    return float(value)


def _grouped(text: str) -> str:
    """golang.org/x/text/message for en_US: thousands separated by commas."""
    sign = "-" if text.startswith("-") else ""
    whole, dot, fraction = text.lstrip("-").partition(".")
    groups: list[str] = []
    while len(whole) > 3:
        groups.insert(0, whole[-3:])
        whole = whole[:-3]
    groups.insert(0, whole)
    return sign + ",".join(groups) + dot + fraction


def _special(value: float) -> str | None:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "∞" if value > 0 else "-∞"
    return None


def _fixed(value: Any, precision: int) -> str:
    number = _float_arg(value, "f")
    special = _special(number)
    if special is not None:
        return special
    return _grouped(f"{number:.{precision}f}")


_SUPERSCRIPT = str.maketrans("0123456789+-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻")


def _scientific(value: Any, precision: int) -> str:
    number = _float_arg(value, "e")
    special = _special(number)
    if special is not None:
        return special
    mantissa, _, exponent = f"{number:.{precision}e}".partition("e")
    sign = "⁻" if exponent.startswith("-") else ""
    return f"{mantissa}\u202f\u00d7\u202f10{sign}{exponent.lstrip('+-').translate(_SUPERSCRIPT)}"


def _go_int_format(value: Any, base: str) -> str:
    number = int(value)
    text = format(abs(number), base)
    return ("-" if number < 0 else "") + text


def format_value(clause: str, value: Any, precision: int | None) -> str:
    kind = type(value)
    if clause == "s":
        return _format_string(value)
    if clause == "d":
        if kind in (int, UInt):
            return str(int(value))
    elif clause == "f":
        return _fixed(value, DEFAULT_PRECISION if precision is None else precision)
    elif clause == "e":
        return _scientific(value, DEFAULT_PRECISION if precision is None else precision)
    elif clause == "b":
        if kind is bool:
            return "1" if value else "0"
        if kind in (int, UInt):
            return _go_int_format(value, "b")
    elif clause in "xX":
        if kind is str or kind is bytes:
            raw: bytes = value.encode() if kind is str else value
            return raw.hex().upper() if clause == "X" else raw.hex()
        if kind in (int, UInt):
            return _go_int_format(value, clause)
    elif clause == "o" and kind in (int, UInt):
        return _go_int_format(value, "o")
    raise _clause_error(clause, type_name(value), -1)


# -- the format string ----------------------------------------------------------------------------


@dataclass
class Clause:
    letter: str
    precision: int | None
    index: int


def _parse_clause(text: str, index: int) -> tuple[int, Clause]:
    """parseFormattingClause after the '%': an optional `.N` precision and the clause letter."""
    i = 0
    precision: int | None = None
    if text and text[0] == ".":
        i = 1
        while True:
            if i >= len(text):
                raise FormatError(
                    "could not parse formatting clause: error while parsing precision: "
                    "could not find end of precision specifier"
                )
            if not text[i].isascii() or not text[i].isdigit():
                break
            i += 1
        digits = text[1:i]
        if not digits:
            raise FormatError(
                "could not parse formatting clause: error while parsing precision: error while converting "
                'precision to integer: strconv.Atoi: parsing "": invalid syntax'
            )
        precision = int(digits)
    letter = text[i]
    if letter not in "sdfebxXo":
        raise FormatError(f'could not parse formatting clause: unrecognized formatting clause "{letter}"')
    return i + 1, Clause(letter, precision, index)


def run(fmt: str, arg_count: int, format_clause: Callable[[Clause], str], *, checking: bool) -> str:
    """parseFormatString: `format_clause` formats (or, checking, verifies) one clause."""
    out: list[str] = []
    i = 0
    index = 0
    while i < len(fmt):
        if fmt[i] != "%":
            out.append(fmt[i])
            i += 1
            continue
        if i + 1 < len(fmt) and fmt[i + 1] == "%":
            out.append("%")
            i += 2
            continue
        if not checking and index >= arg_count:
            raise FormatError(f"index {index} out of range")
        if i + 1 >= len(fmt):
            raise FormatError("unexpected end of string")
        if index >= arg_count:
            raise FormatError(f"index {index} out of range")
        read, clause = _parse_clause(fmt[i + 1 :], index)
        try:
            out.append(format_clause(clause))
        except FormatError as err:
            raise FormatError(f"error during formatting: {err.message}", err.index) from None
        i += 1 + read
        index += 1
    return "".join(out)


def string_format(fmt: Any, args: Any) -> str:
    """The runtime `format` binding: errors become evaluation errors with their message."""
    if type(fmt) is not str or not is_list(args):
        raise ArgumentMismatchError("no such overload")
    try:
        return run(
            fmt, len(args), lambda c: format_value(c.letter, args[c.index], c.precision), checking=False
        )
    except FormatError as err:
        raise EvalError(err.message) from None
