"""Runtime implementations of the CEL functions declared in `decls`, with their runtime costs.

Each implementation receives evaluated arguments (the receiver first for member calls) and
raises EvalError where cel-go returns an error value. Messages follow cel-go and the Kubernetes
libraries; costs follow cel-go's runtime cost tracker (interpreter/runtimecost.go) and the
Kubernetes CostEstimator.CallCost (apiserver pkg/cel/library/cost.go).
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import re2

from dradriver.offline.cel import formatting, namedformat, network, times, urls
from dradriver.offline.cel.cost import ATTRIBUTE_VALUES_PER_DEVICE
from dradriver.offline.cel.decls import SORTABLE, TIMESTAMP_GETTERS
from dradriver.offline.cel.errors import CostLimitError, EvalError, InternalError
from dradriver.offline.cel.semver import Semver, SemverError
from dradriver.offline.cel.values import (
    INT64_MAX,
    INT64_MIN,
    OPTIONAL_NONE,
    UINT64_MAX,
    ArgumentMismatchError,
    ComputedQuantity,
    Optional,
    TypeValue,
    UInt,
    check_int,
    check_uint,
    compare,
    equal,
    expect,
    is_list,
    map_find,
    no_such_overload,
    overload_signature,
    size_of,
    type_name,
    type_value_of,
)
from dradriver.quantity import Quantity, QuantityError

STRING_TRAVERSAL_COST_FACTOR = 0.1
# Values that amplify (a replace inserting around every character, a huge lists.range) are
# stopped before they are built: no selector within the cost limit needs one this large.
MAX_VALUE_SIZE = 10_000_000
REGEX_STRING_LENGTH_COST_FACTOR = 0.25

# -- regular expressions (RE2, like Go's regexp) -----------------------------------------------

_regex_cache: dict[str, Any] = {}
_regex_lock = threading.Lock()


def compile_regex(pattern: str) -> Any:
    """A compiled RE2 pattern, cached; EvalError with Go's wording when it does not compile."""
    cached = _regex_cache.get(pattern)
    if cached is not None:
        return cached
    options = re2.Options()
    options.log_errors = False  # google-re2 would print parse errors to stderr
    try:
        compiled = re2.compile(pattern, options=options)
    except re2.error as err:
        detail = err.args[0].decode() if err.args and isinstance(err.args[0], bytes) else str(err)
        raise EvalError(_go_regexp_error(detail, pattern)) from None
    with _regex_lock:
        if len(_regex_cache) > 1024:
            _regex_cache.clear()
        _regex_cache[pattern] = compiled
    return compiled


# RE2's error codes in Go's regexp/syntax words.
_GO_REGEXP_CODES = {
    "missing )": "missing closing )",
    "missing ]": "missing closing ]",
    "trailing \\": "trailing backslash at end of expression",
    "no argument for repetition operator": "missing argument to repetition operator",
    "invalid named capture group": "invalid named capture",
    "invalid perl operator": "invalid or unsupported Perl syntax",
    "bad repetition operator": "invalid nested repetition operator",
    "bad repetition count": "invalid repeat count",
    "invalid repetition size": "invalid repeat count",
}


def _go_regexp_error(detail: str, pattern: str) -> str:
    """`error parsing regexp: <code>: `<fragment>`` as Go's regexp.Compile reports it."""
    code, _, fragment = detail.partition(": ")
    go_code = _GO_REGEXP_CODES.get(code, code)
    if go_code == "missing closing )":
        fragment = pattern  # Go names the whole expression here
    return f"error parsing regexp: {go_code}: `{fragment}`"


def _find_all(compiled: Any, text: str, limit: int) -> list[str]:
    """Go's Regexp.FindAllString: empty matches right after a previous match are skipped."""
    out: list[str] = []
    if limit == 0:
        return out
    pos = 0
    prev_end = -1
    while pos <= len(text):
        match = compiled.search(text, pos)
        if match is None:
            break
        start, end = match.span()
        if start == end and start == prev_end:
            pos = start + 1
            continue
        out.append(match.group())
        prev_end = end
        pos = end if end > start else end + 1
        if 0 < limit <= len(out):
            break
    return out


# -- helpers -----------------------------------------------------------------------------------


def _str(value: Any, function: str, *others: Any) -> str:
    if type(value) is not str:
        raise no_such_overload(function, value, *others)
    return value


def _int(value: Any, function: str, *others: Any) -> int:
    if type(value) is not int:
        raise no_such_overload(function, value, *others)
    return value


def _list(value: Any, function: str, *others: Any) -> Sequence[Any]:
    if not is_list(value):
        raise no_such_overload(function, value, *others)
    return cast("Sequence[Any]", value)


def _go_trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _go_rem(a: int, b: int) -> int:
    return a - _go_trunc_div(a, b) * b


# -- arithmetic ---------------------------------------------------------------------------------


def add(a: Any, b: Any) -> Any:
    ta, tb = type(a), type(b)
    if ta is int and tb is int:
        return check_int(a + b)
    if ta is str and tb is str:
        return a + b
    if ta is float and tb is float:
        return a + b
    if ta is UInt and tb is UInt:
        return check_uint(a + b)
    if is_list(a) and is_list(b):
        return tuple(a) + tuple(b)
    if ta is bytes and tb is bytes:
        return a + b
    if ta is times.Duration:
        if tb is times.Duration:
            return times.add_durations(a, b)
        if tb is times.Timestamp:
            return times.add_duration(b, a)
    if ta is times.Timestamp and tb is times.Duration:
        return times.add_duration(a, b)
    raise no_such_overload("_+_", a, b)


def subtract(a: Any, b: Any) -> Any:
    ta, tb = type(a), type(b)
    if ta is int and tb is int:
        return check_int(a - b)
    if ta is float and tb is float:
        return a - b
    if ta is UInt and tb is UInt:
        return check_uint(a - b)
    if ta is times.Duration and tb is times.Duration:
        return times.subtract_durations(a, b)
    if ta is times.Timestamp:
        if tb is times.Duration:
            return times.add_duration(a, times.negate_duration(b))
        if tb is times.Timestamp:
            return times.subtract_timestamps(a, b)
    raise no_such_overload("_-_", a, b)


def multiply(a: Any, b: Any) -> Any:
    ta, tb = type(a), type(b)
    if ta is int and tb is int:
        return check_int(a * b)
    if ta is float and tb is float:
        return a * b
    if ta is UInt and tb is UInt:
        return check_uint(a * b)
    raise no_such_overload("_*_", a, b)


def _int_division(a: int, b: int, by_zero: str, operation: Callable[[int, int], int]) -> int:
    """int64 `/` and `%` (overflow.go): errors for a zero divisor and for MinInt64 by -1."""
    if b == 0:
        raise EvalError(by_zero)
    if a == INT64_MIN and b == -1:
        raise EvalError("integer overflow")
    return operation(a, b)


def divide(a: Any, b: Any) -> Any:
    ta, tb = type(a), type(b)
    if ta is int and tb is int:
        return _int_division(a, b, "division by zero", _go_trunc_div)
    if ta is float and tb is float:
        if b == 0.0:
            if a == 0.0 or math.isnan(a):
                return math.nan
            return math.copysign(math.inf, a) * math.copysign(1.0, b)
        return a / b
    if ta is UInt and tb is UInt:
        if b == 0:
            raise EvalError("division by zero")
        return UInt(a // b)
    raise no_such_overload("_/_", a, b)


def modulo(a: Any, b: Any) -> Any:
    ta, tb = type(a), type(b)
    if ta is int and tb is int:
        return _int_division(a, b, "modulus by zero", _go_rem)
    if ta is UInt and tb is UInt:
        if b == 0:
            raise EvalError("modulus by zero")
        return UInt(a % b)
    raise no_such_overload("_%_", a, b)


def negate(a: Any) -> Any:
    if type(a) is int:
        return check_int(-a)
    if type(a) is float:
        return -a
    if type(a) is times.Duration:
        return times.negate_duration(a)
    raise no_such_overload("-_", a)


def logical_not(a: Any) -> bool:
    if type(a) is not bool:
        raise EvalError("no such overload")
    return not a


def _relation(name: str, test: Callable[[int], bool]) -> Callable[[Any, Any], bool]:
    def relation(a: Any, b: Any) -> bool:
        return test(compare(a, b, name))

    return relation


less = _relation("_<_", lambda c: c < 0)
less_equals = _relation("_<=_", lambda c: c <= 0)
greater = _relation("_>_", lambda c: c > 0)
greater_equals = _relation("_>=_", lambda c: c >= 0)


def contains_in(element: Any, container: Any) -> bool:
    """`element in container` (inAggregate): list membership by CEL equality, map key lookup."""
    if is_list(container):
        for item in container:
            try:
                if equal(element, item):
                    return True
            except EvalError:
                continue
        return False
    if isinstance(container, Mapping):
        return map_find(container, element)[0]
    raise EvalError("no such overload")


# -- size and conversions -----------------------------------------------------------------------


def size(value: Any) -> int:
    if type(value) in (str, bytes) or is_list(value) or isinstance(value, Mapping):
        return len(value)
    raise no_such_overload("size", value)


def to_type(value: Any) -> TypeValue:
    return type_value_of(value)


def to_dyn(value: Any) -> Any:
    return value


_GO_BOOL = {"1": True, "t": True, "T": True, "TRUE": True, "true": True, "True": True}
_GO_BOOL.update({"0": False, "f": False, "F": False, "FALSE": False, "false": False, "False": False})


def to_bool(value: Any) -> bool:
    if type(value) is bool:
        return value
    if type(value) is str:
        if value in _GO_BOOL:
            return _GO_BOOL[value]
        raise EvalError("type conversion error from 'string' to 'bool'")
    raise no_such_overload("bool", value)


def to_bytes(value: Any) -> bytes:
    if type(value) is bytes:
        return value
    if type(value) is str:
        return value.encode("utf-8", errors="surrogateescape")
    raise no_such_overload("bytes", value)


_GO_INT = re.compile(r"[+-]?[0-9]+")
_GO_FLOAT = re.compile(
    r"[+-]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf|infinity|nan)", re.IGNORECASE
)


def to_double(value: Any) -> float:
    tv = type(value)
    if tv is float:
        return cast(float, value)
    if tv is int or tv is UInt:
        return float(value)
    if tv is str:
        if _GO_FLOAT.fullmatch(value):
            number = float(value)
            # strconv.ParseFloat reports out-of-range input as an error, not as infinity.
            if not math.isinf(number) or "inf" in value.lower():
                return number
        raise EvalError("type conversion error from 'string' to 'double'")
    raise no_such_overload("double", value)


def to_int(value: Any) -> int:
    tv = type(value)
    if tv is int:
        return cast(int, value)
    if tv is UInt:
        if value > INT64_MAX:
            raise EvalError("integer overflow")
        return int(value)
    if tv is float:
        if math.isinf(value) or math.isnan(value) or value <= -(2.0**63) or value >= 2.0**63:
            raise EvalError("integer overflow")
        return int(value)
    if tv is str:
        if _GO_INT.fullmatch(value):
            number = int(value)
            if INT64_MIN <= number <= INT64_MAX:
                return number
        raise EvalError("type conversion error from 'string' to 'int'")
    if tv is times.Timestamp:
        return cast(times.Timestamp, value).seconds
    if tv is times.Duration:
        return cast(times.Duration, value).nanos
    raise no_such_overload("int", value)


def to_uint(value: Any) -> UInt:
    tv = type(value)
    if tv is UInt:
        return cast(UInt, value)
    if tv is int:
        if value < 0:
            raise EvalError("unsigned integer overflow")
        return UInt(value)
    if tv is float:
        if math.isinf(value) or math.isnan(value) or value < 0 or value >= 2.0**64:
            raise EvalError("unsigned integer overflow")
        return UInt(int(value))
    if tv is str:
        if _GO_INT.fullmatch(value) and not value.startswith("-"):
            number = int(value)
            if number <= UINT64_MAX and not value.startswith("+"):
                return UInt(number)
        raise EvalError("type conversion error from 'string' to 'uint'")
    raise no_such_overload("uint", value)


# -- strings (standard and ext strings v2) ---------------------------------------------------------


def contains(s: Any, sub: Any) -> bool:
    return _str(sub, "contains", s) in _str(s, "contains", sub)


def starts_with(s: Any, prefix: Any) -> bool:
    return _str(s, "startsWith", prefix).startswith(_str(prefix, "startsWith", s))


def ends_with(s: Any, suffix: Any) -> bool:
    return _str(s, "endsWith", suffix).endswith(_str(suffix, "endsWith", s))


def matches(s: Any, pattern: Any) -> bool:
    text = _str(s, "matches", pattern)
    return compile_regex(_str(pattern, "matches", s)).search(text) is not None


def char_at(s: Any, index: Any) -> str:
    text = _str(s, "charAt", index)
    i = _int(index, "charAt", s)
    if i < 0 or i > len(text):
        raise EvalError(f"index out of range: {i}")
    return text[i] if i < len(text) else ""


def index_of(s: Any, sub: Any, *offset: Any) -> int:
    if is_list(s):
        # Kubernetes lists library: list.indexOf(value).
        for i, item in enumerate(s):
            if _equal_true(item, sub):
                return i
        return -1
    text = _str(s, "indexOf", sub, *offset)
    needle = _str(sub, "indexOf", s, *offset)
    start = _int(offset[0], "indexOf", s, sub) if offset else 0
    if not needle:
        return start
    if not _searchable_from(start, text):
        return -1
    return text.find(needle, start)


def last_index_of(s: Any, sub: Any, *offset: Any) -> int:
    if is_list(s):
        for i in range(len(s) - 1, -1, -1):
            if _equal_true(s[i], sub):
                return i
        return -1
    text = _str(s, "lastIndexOf", sub, *offset)
    needle = _str(sub, "lastIndexOf", s, *offset)
    if not offset:
        if not needle:
            return len(text)
        # ext/strings.go compares byte lengths here before searching.
        if len(text.encode()) < len(needle.encode()):
            return -1
        start = len(text) - 1
    else:
        start = _int(offset[0], "lastIndexOf", s, sub)
        if not needle:
            return start
    if not _searchable_from(start, text):
        return -1
    start = min(start, len(text) - len(needle))
    if start < 0:
        return -1
    return text.rfind(needle, 0, start + len(needle))


def _searchable_from(start: int, text: str) -> bool:
    """Whether a search may start at `start` (inside `text`); a negative start is an error."""
    if start < 0:
        raise EvalError(f"index out of range: {start}")
    return start < len(text)


def _equal_true(a: Any, b: Any) -> bool:
    try:
        return equal(a, b)
    except EvalError:
        return False


def lower_ascii(s: Any) -> str:
    text = _str(s, "lowerAscii")
    return "".join(ch.lower() if ch < "\x80" else ch for ch in text)


def upper_ascii(s: Any) -> str:
    text = _str(s, "upperAscii")
    return "".join(ch.upper() if ch < "\x80" else ch for ch in text)


def replace(s: Any, old: Any, new: Any, *count: Any) -> str:
    text = _str(s, "replace", old, new, *count)
    needle = _str(old, "replace", s, new, *count)
    repl = _str(new, "replace", s, old, *count)
    n = _int(count[0], "replace", s, old, new) if count else -1
    if n == 0:
        return text
    occurrences = text.count(needle) if needle else len(text) + 1
    if n > 0:
        occurrences = min(occurrences, n)
    if len(text) + occurrences * (len(repl) - len(needle)) > MAX_VALUE_SIZE:
        raise CostLimitError("operation cancelled: actual cost limit exceeded")
    if n < 0:
        return _go_replace_all(text, needle, repl)
    return _go_replace_n(text, needle, repl, n)


def _go_replace_all(text: str, old: str, new: str) -> str:
    if old:
        return text.replace(old, new)
    # strings.Replace with an empty old string inserts `new` around every rune.
    return new + new.join(text) + new if text else new


def _go_replace_n(text: str, old: str, new: str, n: int) -> str:
    if old:
        return text.replace(old, new, n)
    pieces = [new]
    for i, ch in enumerate(text):
        pieces.append(ch)
        if i + 1 < n:
            pieces.append(new)
    return "".join(pieces) if n > 0 else text


def split(s: Any, sep: Any, *count: Any) -> tuple[str, ...]:
    text = _str(s, "split", sep, *count)
    separator = _str(sep, "split", s, *count)
    n = _int(count[0], "split", s, sep) if count else -1
    if n == 0:
        return ()
    if not separator:
        # strings.Split with an empty separator splits after each UTF-8 sequence.
        runes = list(text)
        if n < 0 or n >= len(runes):
            return tuple(runes)
        return (*runes[: n - 1], "".join(runes[n - 1 :]))
    if n < 0:
        return tuple(text.split(separator))
    return tuple(text.split(separator, n - 1))


def substring(s: Any, start: Any, *end: Any) -> str:
    text = _str(s, "substring", start, *end)
    begin = _int(start, "substring", s, *end)
    if not end:
        if begin < 0 or begin > len(text):
            raise EvalError(f"index out of range: {begin}")
        return text[begin:]
    stop = _int(end[0], "substring", s, start)
    if begin > stop:
        raise EvalError(f"invalid substring range. start: {begin}, end: {stop}")
    if begin < 0 or begin > len(text):
        raise EvalError(f"index out of range: {begin}")
    if stop < 0 or stop > len(text):
        raise EvalError(f"index out of range: {stop}")
    return text[begin:stop]


# unicode.IsSpace: the Latin-1 spaces plus the Unicode White_Space property.
_GO_SPACE = (
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)


def trim(s: Any) -> str:
    return _str(s, "trim").strip(_GO_SPACE)


def join(items: Any, *sep: Any) -> str:
    elements = _list(items, "join", *sep)
    separator = _str(sep[0], "join", items) if sep else ""
    for element in elements:
        if type(element) is not str:
            raise EvalError(f"join: invalid input: {element}")
    return separator.join(elements)


def quote(s: Any) -> str:
    text = _str(s, "strings.quote")
    escapes = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}
    escapes.update({"\\": "\\\\", '"': '\\"'})
    return (
        '"' + "".join(escapes.get(ch, "\ufffd" if 0xD800 <= ord(ch) <= 0xDFFF else ch) for ch in text) + '"'
    )


# -- regex library (Kubernetes) ---------------------------------------------------------------------


def _kube_regex(pattern: str) -> Any:
    try:
        return compile_regex(pattern)
    except EvalError as err:
        raise EvalError(f"Illegal regex: {err.message}") from None


def find(s: Any, pattern: Any) -> str:
    text = _str(s, "find", pattern)
    match = _kube_regex(_str(pattern, "find", s)).search(text)
    return match.group() if match is not None else ""


def find_all(s: Any, pattern: Any, *count: Any) -> tuple[str, ...]:
    text = _str(s, "findAll", pattern, *count)
    limit = _int(count[0], "findAll", s, pattern) if count else -1
    return tuple(_find_all(_kube_regex(_str(pattern, "findAll", s, *count)), text, limit))


# -- lists libraries -------------------------------------------------------------------------------


def _comparable_list(items: Sequence[Any], function: str) -> None:
    for item in items:
        if type(item) not in (int, UInt, float, bool, str, bytes, times.Timestamp, times.Duration):
            raise no_such_overload(function, item)


def _compare_or_none(a: Any, b: Any, function: str) -> int | None:
    # The lists library ignores comparison errors: they never equal the result it looks for.
    try:
        return compare(a, b, function)
    except EvalError:
        return None


def is_sorted(items: Any) -> bool:
    seq = _list(items, "isSorted")
    _comparable_list(seq, "isSorted")
    return all(_compare_or_none(seq[i], seq[i + 1], "isSorted") != 1 for i in range(len(seq) - 1))


def list_sum(items: Any, zero: Any = 0) -> Any:
    seq = _list(items, "sum")
    if not seq:
        return zero
    total = seq[0]
    if type(total) not in (int, UInt, float, times.Duration):
        raise no_such_overload("sum", items)
    for item in seq[1:]:
        total = add(total, item)
    return total


def _extreme(items: Any, name: str, prefer: int) -> Any:
    seq = _list(items, name)
    if not seq:
        raise EvalError(f"{name} called on empty list")
    _comparable_list(seq, name)
    result = seq[0]
    for item in seq[1:]:
        if _compare_or_none(result, item, name) == prefer:
            result = item
    return result


def list_max(items: Any) -> Any:
    return _extreme(items, "max", -1)


def list_min(items: Any) -> Any:
    return _extreme(items, "min", 1)


def list_slice(items: Any, start: Any, end: Any) -> tuple[Any, ...]:
    seq = _list(items, "slice", start, end)
    begin, stop = _int(start, "slice", items, end), _int(end, "slice", items, start)
    if begin < 0 or stop < 0:
        raise EvalError(f"cannot slice({begin}, {stop}), negative indexes not supported")
    if begin > stop:
        raise EvalError(f"cannot slice({begin}, {stop}), start index must be less than or equal to end index")
    if len(seq) < stop:
        raise EvalError(f"cannot slice({begin}, {stop}), list is length {len(seq)}")
    return tuple(seq[begin:stop])


def flatten(items: Any, *depth: Any) -> tuple[Any, ...]:
    seq = _list(items, "flatten", *depth)
    level = _int(depth[0], "flatten", items) if depth else 1
    if level < 0:
        raise EvalError("level must be non-negative")
    return tuple(_flatten(seq, level))


def _flatten(seq: Sequence[Any], depth: int) -> list[Any]:
    out: list[Any] = []
    for item in seq:
        if is_list(item) and depth > 0:
            out.extend(_flatten(item, depth - 1))
        else:
            out.append(item)
    return out


def _sort_keys(items: Sequence[Any], keys: Sequence[Any]) -> tuple[Any, ...]:
    if len(items) != len(keys):
        raise EvalError(
            "@sortByAssociatedKeys() expected a list of the same size as the associated keys list, "
            f"but got {len(items)} and {len(keys)} elements respectively"
        )
    if not items:
        return tuple(items)
    first_type = type(keys[0])
    if first_type not in (int, UInt, float, bool, str, bytes, times.Timestamp, times.Duration):
        raise EvalError("list elements must be comparable")
    if any(type(k) is not first_type for k in keys):
        raise EvalError("list elements must have the same type")
    if first_type is float and any(math.isnan(k) for k in keys):
        raise EvalError("NaN values cannot be ordered")
    ordered = [times.sort_key(k) for k in keys] if first_type in (times.Timestamp, times.Duration) else keys
    order = sorted(range(len(items)), key=lambda i: ordered[i])
    return tuple(items[i] for i in order)


def sort(items: Any) -> tuple[Any, ...]:
    seq = _list(items, "sort")
    return _sort_keys(seq, seq)


def sort_by_keys(items: Any, keys: Any) -> tuple[Any, ...]:
    return _sort_keys(
        _list(items, "@sortByAssociatedKeys", keys), _list(keys, "@sortByAssociatedKeys", items)
    )


def lists_range(n: Any) -> tuple[int, ...]:
    count = _int(n, "lists.range")
    if count > MAX_VALUE_SIZE:
        raise CostLimitError("operation cancelled: actual cost limit exceeded")
    return tuple(range(max(count, 0)))


def reverse(items: Any) -> tuple[Any, ...]:
    return tuple(reversed(_list(items, "reverse")))


def distinct(items: Any) -> tuple[Any, ...]:
    out: list[Any] = []
    for item in _list(items, "distinct"):
        if not any(_equal_true(item, seen) for seen in out):
            out.append(item)
    return tuple(out)


def map_insert(target: Any, key: Any, *value: Any) -> dict[Any, Any]:
    if not isinstance(target, Mapping):
        raise no_such_overload("cel.@mapInsert", target, key, *value)
    out = dict(target)
    entries = [(key, value[0])] if value else list(_map_items(key))
    for k, v in entries:
        if k in out:
            raise EvalError(f"insert failed: key {k} already exists")
        out[k] = v
    return out


def _map_items(value: Any) -> list[tuple[Any, Any]]:
    if not isinstance(value, Mapping):
        raise no_such_overload("cel.@mapInsert", value)
    return list(value.items())


# -- sets (ext/sets.go) -------------------------------------------------------------------------------


def sets_contains(items: Any, sub: Any) -> bool:
    outer = _list(items, "sets.contains", sub)
    return all(contains_in(element, outer) for element in _list(sub, "sets.contains", items))


def sets_equivalent(a: Any, b: Any) -> bool:
    return sets_contains(a, b) and sets_contains(b, a)


def sets_intersects(a: Any, b: Any) -> bool:
    other = _list(b, "sets.intersects", a)
    return any(contains_in(element, other) for element in _list(a, "sets.intersects", b))


# -- quantity library ---------------------------------------------------------------------------------


def quantity(s: Any) -> Quantity:
    try:
        return Quantity.parse(_str(s, "quantity"))
    except QuantityError as err:
        raise EvalError(str(err)) from None


def is_quantity(s: Any) -> bool:
    try:
        Quantity.parse(_str(s, "isQuantity"))
    except QuantityError:
        return False
    return True


def _quantity(value: Any, function: str, *others: Any) -> Quantity:
    if not isinstance(value, Quantity):
        raise no_such_overload(function, value, *others)
    return value


def sign(q: Any) -> int:
    return _quantity(q, "sign").sign()


def as_approximate_float(q: Any) -> float:
    return _quantity(q, "asApproximateFloat").as_approximate_float()


def as_integer(q: Any) -> int:
    value = _quantity(q, "asInteger").as_int64()
    if value is None:
        raise EvalError("cannot convert value to integer")
    return value


def is_integer(q: Any) -> bool:
    return _quantity(q, "isInteger").as_int64() is not None


def quantity_add(q: Any, other: Any) -> Quantity:
    base = _quantity(q, "add", other)
    if type(other) is int:
        return ComputedQuantity.of(base.add(Quantity.from_int(other)))
    return ComputedQuantity.of(base.add(_quantity(other, "add", q)))


def quantity_sub(q: Any, other: Any) -> Quantity:
    base = _quantity(q, "sub", other)
    if type(other) is int:
        return ComputedQuantity.of(base.sub(Quantity.from_int(other)))
    return ComputedQuantity.of(base.sub(_quantity(other, "sub", q)))


def _ordered(a: Any, b: Any, function: str) -> int:
    ta, tb = type(a), type(b)
    if isinstance(a, Quantity) and isinstance(b, Quantity):
        return a.compare(b)
    if ta is Semver and tb is Semver:
        return cast(int, a.compare(b))
    raise no_such_overload(function, a, b)


def compare_to(a: Any, b: Any) -> int:
    return _ordered(a, b, "compareTo")


def is_greater_than(a: Any, b: Any) -> bool:
    return _ordered(a, b, "isGreaterThan") == 1


def is_less_than(a: Any, b: Any) -> bool:
    return _ordered(a, b, "isLessThan") == -1


# -- semver library -------------------------------------------------------------------------------------


def semver(s: Any, *normalize: Any) -> Semver:
    text = _str(s, "semver", *normalize)
    flag = normalize[0] if normalize else False
    if type(flag) is not bool:
        raise no_such_overload("semver", s, *normalize)
    try:
        return Semver.parse(text, normalize=flag)
    except SemverError as err:
        raise EvalError(str(err)) from None


def is_semver(s: Any, *normalize: Any) -> bool:
    try:
        semver(s, *normalize)
    except EvalError as err:
        if err.message.startswith("no such overload"):
            raise
        return False
    return True


def _semver(value: Any, function: str) -> Semver:
    if type(value) is not Semver:
        raise no_such_overload(function, value)
    return value


def _go_int64(value: int) -> int:
    # types.Int(v.Major) converts a uint64 to int64 the way Go does: modulo 2**64.
    return (value + 2**63) % 2**64 - 2**63


def semver_major(v: Any) -> int:
    return _go_int64(_semver(v, "major").major)


def semver_minor(v: Any) -> int:
    return _go_int64(_semver(v, "minor").minor)


def semver_patch(v: Any) -> int:
    return _go_int64(_semver(v, "patch").patch)


# -- timestamps and durations (standard library) ------------------------------------------------------


def to_timestamp(value: Any) -> times.Timestamp:
    if type(value) is times.Timestamp:
        return value
    if type(value) is str:
        return times.parse_timestamp(value)
    if type(value) is int:
        return times.timestamp_from_int(value)
    raise no_such_overload("timestamp", value)


def to_duration(value: Any) -> times.Duration:
    if type(value) is times.Duration:
        return value
    if type(value) is str:
        return times.parse_duration(value)
    if type(value) is int:
        # Declared (int64_to_duration), but Int.ConvertToType has no duration case.
        raise EvalError(f"type conversion error from 'int' to '{times.DURATION_TYPE}'")
    raise no_such_overload("duration", value)


def _getter(part: str) -> Callable[..., int]:
    def get(value: Any, *tz: Any) -> int:
        if type(value) is times.Timestamp:
            if tz and type(tz[0]) is not str:
                raise no_such_overload(part, value, *tz)
            return times.timestamp_part(value, part, *tz)
        if type(value) is times.Duration and not tz and part in times.DURATION_PARTS:
            return times.duration_part(value, part)
        raise no_such_overload(part, value, *tz)

    return get


# -- DRA ------------------------------------------------------------------------------------------------


def _equal_or_false(a: Any, b: Any) -> bool:
    try:
        return equal(a, b)
    except EvalError:
        return False


def includes(target: Any, value: Any) -> bool:
    """includesFunc: list membership (at most 48 values), or equality for a single value."""
    if is_list(target):
        for i, item in enumerate(target):
            if i >= ATTRIBUTE_VALUES_PER_DEVICE:
                limit = ATTRIBUTE_VALUES_PER_DEVICE
                raise EvalError(f"'includes' function cannot be applied to lists longer than {limit} values")
            if _equal_or_false(item, value):
                return True
        return False
    return _equal_or_false(target, value)


# -- optional types (cel-go cel/library.go optionalLib) ----------------------------------------------


def optional_of(value: Any) -> Optional:
    return Optional(value)


def _is_zero(value: Any) -> bool:
    """traits.Zeroer: null, false, 0, empty strings, bytes, lists and maps."""
    if value is None:
        return True
    if type(value) in (bool, int, UInt, float):
        return not value
    if isinstance(value, str | bytes | tuple | list | Mapping):
        return not value
    if type(value) is times.Duration:
        return value.nanos == 0
    if type(value) is times.Timestamp:
        return value.key() == (0, 0)  # Go's zero time, 0001-01-01T00:00:00Z
    return False


def optional_of_non_zero_value(value: Any) -> Optional:
    return OPTIONAL_NONE if _is_zero(value) else Optional(value)


def optional_none() -> Optional:
    return OPTIONAL_NONE


def optional_value(value: Any) -> Any:
    optional = expect(value, Optional)
    if not optional.has_value:
        raise EvalError("optional.none() dereference")
    return optional.value


def optional_has_value(value: Any) -> bool:
    return expect(value, Optional).has_value


def list_first(items: Any) -> Optional:
    return Optional(_list(items, "first")[0]) if _list(items, "first") else OPTIONAL_NONE


def list_last(items: Any) -> Optional:
    return Optional(_list(items, "last")[-1]) if _list(items, "last") else OPTIONAL_NONE


def optional_unwrap(items: Any) -> tuple[Any, ...]:
    out = []
    for item in _list(items, "optional.unwrap"):
        if type(item) is not Optional:
            raise ArgumentMismatchError("no such overload")
        if item.has_value:
            out.append(item.value)
    return tuple(out)


# -- costs (runtimecost.go costCall, ext trackers, Kubernetes CallCost) -----------------------------
#
# Every cost is computed from the arguments alone, before the call: the budget is checked before
# work whose size the cost describes (a quadratic distinct, a huge lists.range) is done.

CALL_COST = 1  # ext callCost
LIST_CREATE_COST = 10  # common.ListCreateBaseCost

CostFn = Callable[[Sequence[Any]], int]


def _traversal(value: Any) -> int:
    """apiserver traversalCost: strings by byte length (truncated, not rounded up), lists
    element by element, others 1."""
    if isinstance(value, str):
        return int(len(value.encode()) * STRING_TRAVERSAL_COST_FACTOR)
    if isinstance(value, bytes):
        return int(len(value) * STRING_TRAVERSAL_COST_FACTOR)
    if is_list(value):
        return sum(_traversal(item) for item in value)
    if isinstance(value, Mapping):
        return sum(_traversal(k) + _traversal(v) for k, v in value.items())
    return 1


def _first_string(args: Sequence[Any]) -> int:
    return math.ceil(size_of(args[0]) * STRING_TRAVERSAL_COST_FACTOR)


def _first_string_twice(args: Sequence[Any]) -> int:
    return math.ceil(size_of(args[0]) * 2 * STRING_TRAVERSAL_COST_FACTOR)


def _both_strings(args: Sequence[Any]) -> int:
    return math.ceil((size_of(args[0]) + size_of(args[1])) * STRING_TRAVERSAL_COST_FACTOR)


def _shorter_string(args: Sequence[Any]) -> int:
    return math.ceil(min(size_of(args[0]), size_of(args[1])) * STRING_TRAVERSAL_COST_FACTOR)


def _regex(args: Sequence[Any]) -> int:
    str_cost = math.ceil((1 + size_of(args[0])) * STRING_TRAVERSAL_COST_FACTOR)
    return str_cost * math.ceil(size_of(args[1]) * REGEX_STRING_LENGTH_COST_FACTOR)


def _contains(args: Sequence[Any]) -> int:
    return _first_string(args) * math.ceil(size_of(args[1]) * STRING_TRAVERSAL_COST_FACTOR)


def _receiver_traversal(args: Sequence[Any]) -> int:
    return _traversal(args[0])


def _join(args: Sequence[Any]) -> int:
    items = args[0] if is_list(args[0]) else ()
    separator = size_of(args[1]) if len(args) > 1 else 0
    joined = sum(size_of(i) for i in items) + separator * max(len(items) - 1, 0)
    return math.ceil(joined * 2 * STRING_TRAVERSAL_COST_FACTOR)


def _allocating(size: int, factor: float = 1.0) -> int:
    """ext lists trackAllocatingListCall."""
    return int(size * factor) + CALL_COST + LIST_CREATE_COST


def _int_arg(args: Sequence[Any], index: int, default: int = 0) -> int:
    return args[index] if len(args) > index and type(args[index]) is int else default


class _ErrorArgument:
    """An argument that evaluated to an error, as the cost tracker sees it: not a Sizer, so of
    size 1 (actualSize), and not a list or an int to the trackers that assert one."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<error>"


ERROR_ARGUMENT = _ErrorArgument()
#: What a Go panic says when a cost tracker asserts a list (traits.Lister) on an error value.
_NOT_A_LISTER = "internal error: interface conversion: *types.Err is not traits.Lister: missing method Add"
_NOT_AN_INT = "internal error: interface conversion: ref.Val is *types.Err, not types.Int"


def _lister(value: Any) -> Any:
    """ext lists' cost trackers assert args[i].(traits.Lister): on an error that panics."""
    if value is ERROR_ARGUMENT:
        raise InternalError(_NOT_A_LISTER)
    return value


def _flatten_cost(args: Sequence[Any]) -> int:
    if len(args) > 1 and args[1] is ERROR_ARGUMENT:
        raise InternalError(_NOT_AN_INT)
    return _allocating(size_of(args[0]), _int_arg(args, 1, 1))


def _self_compare(items: Any) -> int:
    """ext lists trackListSelfCompare: worst-case n**2 comparisons."""
    n = size_of(items) if is_list(items) else 0
    factor = 2.0 + (STRING_TRAVERSAL_COST_FACTOR if n and type(items[0]) in (str, bytes) else 0)
    return _allocating(n * n, factor)


def _sets(factor: int) -> CostFn:
    return lambda args: CALL_COST + size_of(args[0]) * size_of(args[1]) * factor


_IMPLEMENTATIONS: dict[str, tuple[Callable[..., Any], CostFn | None]] = {
    "_+_": (add, _both_strings),
    "_-_": (subtract, None),
    "_*_": (multiply, None),
    "_/_": (divide, None),
    "_%_": (modulo, None),
    "-_": (negate, None),
    "!_": (logical_not, None),
    "_<_": (less, _shorter_string),
    "_<=_": (less_equals, _shorter_string),
    "_>_": (greater, _shorter_string),
    "_>=_": (greater_equals, _shorter_string),
    "@in": (contains_in, lambda args: size_of(args[1]) if is_list(args[1]) else 1),
    "size": (size, None),
    "type": (to_type, None),
    "dyn": (to_dyn, None),
    "bool": (to_bool, None),
    "bytes": (to_bytes, _first_string),
    "double": (to_double, None),
    "int": (to_int, None),
    "uint": (to_uint, None),
    "string": (formatting.to_string, None),
    "contains": (contains, _contains),
    "startsWith": (starts_with, _first_string),
    "endsWith": (ends_with, _first_string),
    "matches": (matches, _regex),
    "charAt": (char_at, None),
    "indexOf": (index_of, _receiver_traversal),
    "lastIndexOf": (last_index_of, _receiver_traversal),
    "lowerAscii": (lower_ascii, _first_string),
    "upperAscii": (upper_ascii, _first_string),
    "replace": (replace, _first_string_twice),
    "split": (split, _first_string_twice),
    "substring": (substring, _first_string),
    "trim": (trim, _first_string),
    "join": (join, _join),
    "strings.quote": (quote, _first_string),
    "find": (find, _regex),
    "findAll": (find_all, _regex),
    "isSorted": (is_sorted, _receiver_traversal),
    "sum": (list_sum, _receiver_traversal),
    "max": (list_max, _receiver_traversal),
    "min": (list_min, _receiver_traversal),
    "slice": (list_slice, lambda args: _allocating(max(_int_arg(args, 2) - _int_arg(args, 1), 0))),
    "flatten": (flatten, _flatten_cost),
    "sort": (sort, lambda args: _self_compare(_lister(args[0]))),
    "@sortByAssociatedKeys": (sort_by_keys, lambda args: _self_compare(_lister(args[1]))),
    "lists.range": (lists_range, lambda args: _allocating(max(_int_arg(args, 0), 0))),
    "reverse": (reverse, lambda args: _allocating(size_of(args[0]))),
    "distinct": (distinct, lambda args: _self_compare(_lister(args[0]))),
    "cel.@mapInsert": (map_insert, None),
    "sets.contains": (sets_contains, _sets(1)),
    "sets.equivalent": (sets_equivalent, _sets(2)),
    "sets.intersects": (sets_intersects, _sets(1)),
    "quantity": (quantity, _first_string),
    "isQuantity": (is_quantity, _first_string),
    "sign": (sign, None),
    "asApproximateFloat": (as_approximate_float, None),
    "asInteger": (as_integer, None),
    "isInteger": (is_integer, None),
    "add": (quantity_add, None),
    "sub": (quantity_sub, None),
    "compareTo": (compare_to, None),
    "isGreaterThan": (is_greater_than, None),
    "isLessThan": (is_less_than, None),
    "semver": (semver, _first_string),
    "isSemver": (is_semver, _first_string),
    "major": (semver_major, None),
    "minor": (semver_minor, None),
    "patch": (semver_patch, None),
    "ip": (network.ip, network.ip_cost),
    "isIP": (network.is_ip, _first_string),
    "ip.isCanonical": (network.ip_is_canonical, _first_string_twice),
    "family": (network.family, None),
    "isUnspecified": (network.is_unspecified, None),
    "isLoopback": (network.is_loopback, None),
    "isLinkLocalMulticast": (network.is_link_local_multicast, None),
    "isLinkLocalUnicast": (network.is_link_local_unicast, None),
    "isGlobalUnicast": (network.is_global_unicast, None),
    "cidr": (network.cidr, _first_string),
    "isCIDR": (network.is_cidr, _first_string),
    "containsIP": (network.contains_ip, lambda args: network.contains_cost(args, of_cidr=False)),
    "containsCIDR": (network.contains_cidr, lambda args: network.contains_cost(args, of_cidr=True)),
    "prefixLength": (network.prefix_length, None),
    "masked": (network.masked, None),
    "format": (formatting.string_format, _first_string),
    "includes": (includes, None),
    "timestamp": (to_timestamp, None),
    "duration": (to_duration, None),
    **{name: (_getter(part), None) for name, part in TIMESTAMP_GETTERS.items()},
    "url": (urls.url, _first_string),
    "isURL": (urls.is_url, None),
    "getScheme": (urls.get_scheme, None),
    "getHost": (urls.get_host, None),
    "getHostname": (urls.get_hostname, None),
    "getPort": (urls.get_port, None),
    "getEscapedPath": (urls.get_escaped_path, None),
    "getQuery": (urls.get_query, None),
    "format.named": (namedformat.named, None),
    "validate": (namedformat.validate, namedformat.validate_cost),
    **{f"format.{key}": (namedformat.constant(key), None) for key in namedformat.FORMATS},
    "optional.of": (optional_of, None),
    "optional.ofNonZeroValue": (optional_of_non_zero_value, None),
    "optional.none": (optional_none, None),
    "value": (optional_value, None),
    "hasValue": (optional_has_value, None),
    "first": (list_first, None),
    "last": (list_last, None),
    "optional.unwrap": (optional_unwrap, None),
    "unwrapOpt": (optional_unwrap, None),
}

# How a call with arguments of the wrong runtime type fails, per cel-go binding style:
# operators bound once for the whole function with an operand trait (common/stdlib/standard.go
# SingletonBinaryBinding) say "no such overload: _+_" when the first operand lacks the trait and
# leave the rest to the operand's own method ("no such overload"); other standard functions
# (type guards disabled) say "no such overload"; library functions, guarded, name the function
# and every argument's type.
_COMPARERS = {"int", "uint", "double", "string", "bytes", "bool"} | {
    "google.protobuf.Duration",
    "google.protobuf.Timestamp",
}
_TRAITS = {
    "_+_": {
        "int",
        "uint",
        "double",
        "string",
        "bytes",
        "list",
        "google.protobuf.Duration",
        "google.protobuf.Timestamp",
    },
    "_-_": {"int", "uint", "double", "google.protobuf.Duration", "google.protobuf.Timestamp"},
    "_*_": {"int", "uint", "double"},
    "_/_": {"int", "uint", "double"},
    "_%_": {"int", "uint"},
    "-_": {"int", "double", "bool", "google.protobuf.Duration"},
    "size": {"string", "bytes", "list", "map"},
    "matches": {"string"},
    **dict.fromkeys(("_<_", "_<=_", "_>_", "_>=_"), _COMPARERS),
}
_PLAIN = frozenset({"!_", "@in", "contains", "startsWith", "endsWith"})


def bound(name: str, impl: Callable[..., Any], *, plain: bool = False) -> Callable[..., Any]:
    """`impl` with cel-go's wording for arguments of the wrong type; `plain` for a call that
    cel-go's planner replaced (`matches` with a constant pattern: "no such overload")."""
    traits = _TRAITS.get(name)
    plain = plain or name in _PLAIN

    def call(*args: Any) -> Any:
        try:
            return impl(*args)
        except ArgumentMismatchError:
            if plain:
                raise EvalError("no such overload") from None
            if traits is not None:
                if args and type_name(args[0]) in traits:
                    raise EvalError("no such overload") from None
                raise EvalError(f"no such overload: {name}") from None
            raise EvalError(overload_signature(name, args)) from None

    return call


RUNTIME: dict[str, tuple[Callable[..., Any], CostFn | None]] = {
    name: (bound(name, impl), cost) for name, (impl, cost) in _IMPLEMENTATIONS.items()
}

# cel-go's CostTracker prices these by the overload the checker resolved (runtimecost.go
# costCall): with a single known overload its size-based cost, otherwise (dyn operands, several
# candidate overloads) one unit.
_STRING_PAIR = _both_strings
OVERLOAD_COSTS: dict[str, CostFn] = {
    "add_string": _STRING_PAIR,
    "add_bytes": _STRING_PAIR,
    **dict.fromkeys(
        [
            f"{op}_{kind}"
            for op in ("less", "less_equals", "greater", "greater_equals")
            for kind in ("string", "bytes")
        ],
        _shorter_string,
    ),
    "in_list": lambda args: size_of(args[1]),
    "string_to_bytes": _first_string,
    "bytes_to_string": _first_string,
    "starts_with_string": _first_string,
    "ends_with_string": _first_string,
    "contains_string": _contains,
    "matches_string": _regex,
}
# ext lists registers these trackers per overload id: a call on dyn elements has none.
for _kind, _ in SORTABLE:
    OVERLOAD_COSTS[f"list_{_kind}_sort"] = cast("CostFn", _IMPLEMENTATIONS["sort"][1])
    OVERLOAD_COSTS[f"list_{_kind}_sortByAssociatedKeys"] = cast(
        "CostFn", _IMPLEMENTATIONS["@sortByAssociatedKeys"][1]
    )
# Kubernetes' CallCost adds the parse of a string argument for the `_string` overload id only.
OVERLOAD_COSTS["cidr_contains_ip_string"] = lambda args: network.contains_cost(args, of_cidr=False)
OVERLOAD_COSTS["cidr_contains_ip_ip"] = lambda args: network.contains_cost(args, of_cidr=False, parse=False)
OVERLOAD_COSTS["cidr_contains_cidr_string"] = lambda args: network.contains_cost(args, of_cidr=True)
OVERLOAD_COSTS["cidr_contains_cidr"] = lambda args: network.contains_cost(args, of_cidr=True, parse=False)
OVERLOAD_PRICED = frozenset(
    {"_+_", "_<_", "_<=_", "_>_", "_>=_", "@in", "bytes", "string", "startsWith", "endsWith"}
)
OVERLOAD_PRICED |= {"contains", "matches", "sort", "@sortByAssociatedKeys", "containsIP", "containsCIDR"}
#: The cost of a call in OVERLOAD_PRICED whose overload the checker left open (no overload id).
UNRESOLVED_COSTS: dict[str, CostFn] = {
    "containsIP": lambda args: network.contains_cost(args, of_cidr=False, parse=False),
    "containsCIDR": lambda args: network.contains_cost(args, of_cidr=True, parse=False),
}
#: The cost of a call whose result is an error, for the functions priced by their result's size
#: (Kubernetes' join, ext lists' slice and lists.range): an error is of size 1.
ERROR_RESULT_COSTS: dict[str, int] = {
    "join": math.ceil(2 * STRING_TRAVERSAL_COST_FACTOR),
    "slice": _allocating(1),
    "lists.range": _allocating(1),
}

# Functions whose cost depends on their arguments; evaluation checks the budget before running them.
SIZED = frozenset(name for name, (_, cost) in RUNTIME.items() if cost is not None) | OVERLOAD_PRICED
