"""The Kubernetes named-format CEL library (k8s.io/apiserver pkg/cel/library/format.go, pkg/cel/format.go).

`format.named(name)` and `format.<name>()` give a `kubernetes.NamedFormat`; `<format>.validate(s)`
is `optional.none()` for a valid string, else the validator's messages, which users see, so they
are apimachinery's own words (dradriver.names) and Go's url/strfmt verdicts, ported here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dradriver import names
from dradriver.offline.cel import urls
from dradriver.offline.cel.values import OPTIONAL_NONE, OpaqueValue, Optional, expect, size_of

STRING_TRAVERSAL_COST_FACTOR = 0.1
REGEX_STRING_LENGTH_COST_FACTOR = 0.25
# apiserver cel.MaxNameFormatRegexSize: what the cost estimate assumes for any format.
MAX_NAME_FORMAT_REGEX_SIZE = 128
# apiserver cel.MaxFormatSize: the estimated size of a Format in `==`.
MAX_FORMAT_SIZE = 64


@dataclass(frozen=True, slots=True)
class Format(OpaqueValue):
    """apiserver cel.Format: equal to another Format of the same name."""

    cel_type_name = "kubernetes.NamedFormat"

    name: str
    validator: Callable[[str], list[str]] = field(compare=False)
    # The length of the regex (or an equivalent one) the runtime cost is charged for.
    max_regex_size: int = field(compare=False)

    def __repr__(self) -> str:
        return f"Format({self.name})"


def _prefix(check: Callable[[str], list[str]]) -> Callable[[str], list[str]]:
    # apimachinery NameIs...(s, prefix=true): a generateName prefix may end in "-".
    return lambda value: check(names.mask_trailing_dash(value))


def _uri(value: str) -> list[str]:
    error = urls.request_uri_error(value)
    return [] if error is None else [error]


_UUID = re.compile(r"[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}")
# govalidator's Base64 regex (standard alphabet, padded).
_BASE64 = re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{4})")
_FULL_DATE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})")
# strfmt DateTimePattern, matched against the lower-cased time part ("." is any character).
_TIME = re.compile(r"([0-9]{2}):([0-9]{2}):([0-9]{2})(.[0-9]+)?(z|([+-][0-9]{2}:[0-9]{2}))")
_DAYS_IN_MONTH = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def is_full_date(value: str) -> bool:
    """strfmt IsDate: Go's time.Parse("2006-01-02", value) succeeds."""
    match = _FULL_DATE.fullmatch(value)
    if match is None:
        return False
    year, month, day = (int(part) for part in match.groups())
    if not 1 <= month <= 12:
        return False
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    return 1 <= day <= _DAYS_IN_MONTH[month - 1] + (1 if month == 2 and leap else 0)


def _go_lower(value: str) -> str:
    # strings.ToLower maps rune by rune; Python's full mapping may grow a character ("İ").
    return "".join(ch.lower()[0] for ch in value)


def is_date_time(value: str) -> bool:
    """strfmt IsDateTime: only the first two "t"-separated parts are looked at, as upstream does."""
    if len(value.encode("utf-8", "surrogateescape")) < 4:
        return False
    parts = _go_lower(value).split("t")
    if len(parts) < 2 or not is_full_date(parts[0]):
        return False
    match = _TIME.fullmatch(parts[1])
    if match is None:
        return False
    return match[1] <= "23" and match[2] <= "59" and match[3] <= "59"


def _check(predicate: Callable[[str], bool], message: str) -> Callable[[str], list[str]]:
    return lambda value: [] if predicate(value) else [message]


# Name, validator and MaxRegexSize of each format, as ConstantFormats declares them. The sizes of
# the strfmt and govalidator regexes are those of the versions Kubernetes 1.36 vendors.
FORMATS: dict[str, Format] = {
    key: Format(name, validator, size)
    for key, name, validator, size in (
        ("dns1123Label", "DNS1123Label", names.dns1123_label_errors, 30),
        ("dns1123Subdomain", "DNS1123Subdomain", names.dns1123_subdomain_errors, 60),
        ("dns1035Label", "DNS1035Label", names.dns1035_label_errors, 30),
        ("qualifiedName", "QualifiedName", names.label_key_errors, 60),
        ("dns1123LabelPrefix", "DNS1123LabelPrefix", _prefix(names.dns1123_label_errors), 30),
        ("dns1123SubdomainPrefix", "DNS1123SubdomainPrefix", _prefix(names.dns1123_subdomain_errors), 60),
        ("dns1035LabelPrefix", "DNS1035LabelPrefix", _prefix(names.dns1035_label_errors), 30),
        ("labelValue", "LabelValue", names.label_value_errors, 40),
        ("uri", "URI", _uri, 1103),
        (
            "uuid",
            "uuid",
            _check(lambda s: _UUID.fullmatch(s) is not None, "does not match the UUID format"),
            70,
        ),
        ("byte", "byte", _check(lambda s: _BASE64.fullmatch(s) is not None, "invalid base64"), 84),
        ("date", "date", _check(is_full_date, "invalid date"), 71),
        ("datetime", "datetime", _check(is_date_time, "invalid datetime"), 71),
    )
}


def named(name: Any) -> Optional:
    found = FORMATS.get(expect(name, str))
    return OPTIONAL_NONE if found is None else Optional(found)


def constant(key: str) -> Callable[[], Format]:
    found = FORMATS[key]
    return lambda: found


def validate(fmt: Any, value: Any) -> Optional:
    errors = expect(fmt, Format).validator(expect(value, str))
    return Optional(tuple(errors)) if errors else OPTIONAL_NONE


def validate_cost(args: Sequence[Any]) -> int:
    """library CallCost "validate": a regex match of the format's regex size over the string."""
    fmt = args[0]
    if type(fmt) is not Format:
        return 1
    str_cost = math.ceil((1 + size_of(args[1])) * STRING_TRAVERSAL_COST_FACTOR)
    return str_cost * math.ceil(fmt.max_regex_size * REGEX_STRING_LENGTH_COST_FACTOR)
