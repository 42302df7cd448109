"""Name and value formats that Kubernetes validates, restated as pure checks.

Each `*_error` function returns None when the value is valid, else a message in the API
server's own words, so that what we render never reaches the server only to be rejected.
"""

from __future__ import annotations

import re

DNS_LABEL_MAX = 63
DNS_SUBDOMAIN_MAX = 253
DRIVER_NAME_MAX = 63
C_IDENTIFIER_MAX = 32
#: Attribute string and version values are limited in bytes, not characters.
ATTRIBUTE_VALUE_MAX_BYTES = 64
#: Integer fields (counts, int attributes) are Go int64s.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

# apimachinery's formats and messages (util/validation, api/validate/content), shared by the
# checks below and by the CEL named-format library, which reports them verbatim.
DNS1123_LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character"
)
DNS1123_SUBDOMAIN_FMT = DNS1123_LABEL_FMT + "(\\." + DNS1123_LABEL_FMT + ")*"
DNS1123_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character"
)
DNS1035_LABEL_FMT = "[a-z]([-a-z0-9]*[a-z0-9])?"
DNS1035_LABEL_MSG = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', "
    "start with an alphabetic character, and end with an alphanumeric character"
)
LABEL_KEY_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
LABEL_KEY_MSG = (
    "must consist of alphanumeric characters, '-', '_' or '.', "
    "and must start and end with an alphanumeric character"
)
LABEL_VALUE_FMT = "(" + LABEL_KEY_FMT + ")?"
LABEL_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
    "and must start and end with an alphanumeric character"
)

_DNS_LABEL = re.compile(DNS1123_LABEL_FMT)
_DNS_SUBDOMAIN = re.compile(DNS1123_SUBDOMAIN_FMT)
_DNS1035_LABEL = re.compile(DNS1035_LABEL_FMT)
_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# semver.org 2.0.0, as the API server checks version attributes.
_SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?"
)
_LOOSE_VERSION = re.compile(r"v?(\d+)(?:\.(\d+))?(?:\.(\d+))?")


def int64_error(value: object) -> str | None:
    """An integer field: a JSON string or float is not one, nor is a number beyond int64."""
    if type(value) is not int:
        return (
            f"must be an integer, not {'a boolean' if isinstance(value, bool) else f'a {_json_type(value)}'}"
        )
    if not INT64_MIN <= value <= INT64_MAX:
        return "must fit in a 64-bit integer (int64)"
    return None


def _json_type(value: object) -> str:
    return {
        str: "string",
        float: "number with a fraction",
        list: "list",
        dict: "object",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def _length_and_format_error(value: str, limit: int, pattern: re.Pattern[str], message: str) -> str | None:
    """The length first, then the format, as apimachinery checks a name."""
    if len(value) > limit:
        return f"must be no more than {limit} characters"
    if not pattern.fullmatch(value):
        return message
    return None


def dns_label_error(value: str) -> str | None:
    """RFC 1123 label: device names, request names, counter names."""
    return _length_and_format_error(value, DNS_LABEL_MAX, _DNS_LABEL, DNS1123_LABEL_MSG)


def dns_subdomain_error(value: str) -> str | None:
    """RFC 1123 subdomain: object names, namespaces' peers, pool name parts."""
    return _length_and_format_error(value, DNS_SUBDOMAIN_MAX, _DNS_SUBDOMAIN, DNS1123_SUBDOMAIN_MSG)


def driver_name_error(value: str) -> str | None:
    """A DRA driver name: a lowercase DNS subdomain of at most 63 characters.

    The API server lower-cases before checking, but the name is also the CEL attribute domain and
    must match allocation results exactly, so we insist on lowercase.
    """
    if not value:
        return "must not be empty"
    if len(value) > DRIVER_NAME_MAX:
        return f"must be no more than {DRIVER_NAME_MAX} characters"
    if value != value.lower():
        return "must be lowercase"
    return dns_subdomain_error(value)


def c_identifier_error(value: str) -> str | None:
    """The name part of an attribute or capacity name."""
    if not value:
        return "the name must not be empty"
    return _length_and_format_error(
        value,
        C_IDENTIFIER_MAX,
        _C_IDENTIFIER,
        "a valid C identifier must start with alphabetic character or '_', "
        "followed by a string of alphanumeric characters or '_'",
    )


def qualified_name_error(value: str) -> str | None:
    """An attribute or capacity key: `<C identifier>` or `<domain>/<C identifier>`."""
    domain, slash, name = value.rpartition("/")
    if slash:
        if "/" in domain:
            return "must not contain more than one slash"
        if not domain:
            return "the domain must not be empty"
        if (err := driver_name_error(domain)) is not None:
            return f"domain {domain!r}: {err}"
    return c_identifier_error(name)


def fully_qualified_name_error(value: str) -> str | None:
    """An attribute named with its domain, as claims' constraints and a slice's
    partitionTypeAttribute name them: `<domain>/<C identifier>`."""
    if "/" not in value:
        return "a fully qualified name must be a domain and a name separated by a slash"
    return qualified_name_error(value)


def semver_error(value: str) -> str | None:
    """A version attribute value: strict semver 2.0.0, at most 64 bytes."""
    if len(value.encode()) > ATTRIBUTE_VALUE_MAX_BYTES:
        return f"must be no more than {ATTRIBUTE_VALUE_MAX_BYTES} bytes"
    if not _SEMVER.fullmatch(value):
        return "must be a string compatible with semver.org spec 2.0.0"
    return None


def normalize_version(raw: str) -> str | None:
    """Turn what tools report ("8.6", "570.124.06", "v12.4") into strict semver, or None.

    Missing minor/patch parts become 0 and leading zeros are dropped; anything with more than
    three numeric parts or trailing text cannot be represented and gives None.
    """
    text = raw.strip()
    if _SEMVER.fullmatch(text):
        return text
    match = _LOOSE_VERSION.fullmatch(text)
    if match is None:
        return None
    return ".".join(str(int(part or "0")) for part in match.groups())


def uid_error(value: str) -> str | None:
    """A Kubernetes object UID as we accept it before it becomes part of a path or file name."""
    if not _UUID.fullmatch(value):
        return "must be a lowercase RFC 4122 UUID"
    return None


_LABEL_NAME = re.compile(LABEL_KEY_FMT)
LABEL_VALUE_MAX = 63


def label_name_error(value: str) -> str | None:
    """A label key (taint keys, binding conditions): `[prefix/]name`, prefix a DNS subdomain."""
    prefix, slash, name = value.rpartition("/")
    if slash:
        if not prefix:
            return "prefix part must be non-empty"
        if (err := dns_subdomain_error(prefix)) is not None:
            return f"prefix part {err}"
    if not name:
        return "name part must be non-empty"
    if len(name) > LABEL_VALUE_MAX:
        return f"name part must be no more than {LABEL_VALUE_MAX} characters"
    if not _LABEL_NAME.fullmatch(name):
        return f"name part {LABEL_KEY_MSG}"
    return None


def label_value_error(value: str) -> str | None:
    """A label value (taint values): empty, or a label name without prefix."""
    return _length_and_format_error(value, LABEL_VALUE_MAX, _LABEL_NAME, LABEL_VALUE_MSG) if value else None


# -- apimachinery's validators, every message of them (the CEL named-format library's results) ------


def _byte_len(value: str) -> int:
    # Go measures strings in bytes.
    return len(value.encode("utf-8", "surrogateescape"))


def regex_error(message: str, fmt: str, *examples: str) -> str:
    """validation.RegexError, with its double space before each further example."""
    if not examples:
        return f"{message} (regex used for validation is '{fmt}')"
    listed = " or ".join(f"'{example}', " for example in examples)
    return f"{message} (e.g. {listed}regex used for validation is '{fmt}')"


def dns1123_label_errors(value: str) -> list[str]:
    """validation.IsDNS1123Label."""
    errors = []
    if _byte_len(value) > DNS_LABEL_MAX:
        errors.append(f"must be no more than {DNS_LABEL_MAX} characters")
    if not _DNS_LABEL.fullmatch(value):
        if _DNS_SUBDOMAIN.fullmatch(value):
            errors.append("must not contain dots")
        else:
            errors.append(regex_error(DNS1123_LABEL_MSG, DNS1123_LABEL_FMT, "my-name", "123-abc"))
    return errors


def dns1123_subdomain_errors(value: str, *, unit: str = "characters") -> list[str]:
    """validation.IsDNS1123Subdomain; `unit` is "bytes" in the api/validate/content copy."""
    errors = []
    if _byte_len(value) > DNS_SUBDOMAIN_MAX:
        errors.append(f"must be no more than {DNS_SUBDOMAIN_MAX} {unit}")
    if not _DNS_SUBDOMAIN.fullmatch(value):
        errors.append(regex_error(DNS1123_SUBDOMAIN_MSG, DNS1123_SUBDOMAIN_FMT, "example.com"))
    return errors


def dns1035_label_errors(value: str) -> list[str]:
    """validation.IsDNS1035Label."""
    errors = []
    if _byte_len(value) > DNS_LABEL_MAX:
        errors.append(f"must be no more than {DNS_LABEL_MAX} characters")
    if not _DNS1035_LABEL.fullmatch(value):
        errors.append(regex_error(DNS1035_LABEL_MSG, DNS1035_LABEL_FMT, "my-name", "abc-123"))
    return errors


def mask_trailing_dash(name: str) -> str:
    """apimachinery's maskTrailingDash for generated-name prefixes: the last *two* bytes become
    "a" (upstream's arithmetic, kept because it decides what passes)."""
    raw = name.encode("utf-8", "surrogateescape")
    if len(raw) > 1 and raw.endswith(b"-"):
        return (raw[:-2] + b"a").decode("utf-8", "surrogateescape")
    return name


def label_key_errors(value: str) -> list[str]:
    """content.IsLabelKey (validation.IsQualifiedName)."""
    errors: list[str] = []
    parts = value.split("/")
    name_regex_error = regex_error(LABEL_KEY_MSG, LABEL_KEY_FMT, "MyName", "my.name", "123-abc")
    if len(parts) > 2:
        return [
            f"a valid label key {name_regex_error} with an optional DNS subdomain prefix and '/' "
            "(e.g. 'example.com/MyName')"
        ]
    name = parts[-1]
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix:
            errors.append("prefix part must be non-empty")
        else:
            errors += [f"prefix part {m}" for m in dns1123_subdomain_errors(prefix, unit="bytes")]
    if not name:
        errors.append("name part must be non-empty")
    elif _byte_len(name) > LABEL_VALUE_MAX:
        errors.append(f"name part must be no more than {LABEL_VALUE_MAX} bytes")
    if not _LABEL_NAME.fullmatch(name):
        errors.append(f"name part {name_regex_error}")
    return errors


def label_value_errors(value: str) -> list[str]:
    """content.IsLabelValue (validation.IsValidLabelValue)."""
    errors = []
    if _byte_len(value) > LABEL_VALUE_MAX:
        errors.append(f"must be no more than {LABEL_VALUE_MAX} bytes")
    if value and not _LABEL_NAME.fullmatch(value):
        errors.append(regex_error(LABEL_VALUE_MSG, LABEL_VALUE_FMT, "MyValue", "my_value", "12345"))
    return errors
