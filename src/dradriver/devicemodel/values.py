"""Turning hardware facts into attribute and capacity values the API server accepts.

The value-representation rule (docs/claims.md, "What is published"):
- strings longer than 64 bytes are cut at the last UTF-8 character boundary within 64 bytes
  (a warning names the device and attribute); empty strings are left out;
- versions are normalised to strict semver ("570.124.06" -> "570.124.6", "9.0" -> "9.0.0");
  a version that cannot be normalised is left out with a warning, never published as-is;
- ints outside int64 are left out with a warning;
- quantities are written in Kubernetes' canonical form, so that what the API server stores
  reads back byte-for-byte equal.
"""

from __future__ import annotations

import functools
from typing import Any

from dradriver.names import ATTRIBUTE_VALUE_MAX_BYTES, normalize_version, semver_error

MAX_STRING_BYTES = ATTRIBUTE_VALUE_MAX_BYTES
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_BINARY_SUFFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_DECIMAL_SUFFIXES = {0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P", 18: "E"}


def truncate_utf8(value: str, limit: int = MAX_STRING_BYTES) -> str:
    """At most `limit` bytes of UTF-8, never splitting a character; unencodable code points become '?'."""
    encoded = value.encode("utf-8", "replace")
    if len(encoded) <= limit:
        return encoded.decode("utf-8")
    return encoded[:limit].decode("utf-8", "ignore")


@functools.lru_cache(maxsize=1024)
def binary_quantity(count: int) -> str:
    """Bytes as Kubernetes writes a BinarySI quantity: the largest exact 1024-power suffix ("81559Mi").

    Values that no power of 1024 divides are plain integers, which the API server reads as
    DecimalSI, so they take that canonical form; so do values beyond int64, which the API server
    would cap if they came with a binary suffix.
    """
    if 1024 <= abs(count) <= _INT64_MAX:
        exponent, mantissa = 0, count
        while mantissa % 1024 == 0 and exponent < len(_BINARY_SUFFIXES) - 1:
            mantissa //= 1024
            exponent += 1
        if exponent:
            return f"{mantissa}{_BINARY_SUFFIXES[exponent]}"
    return decimal_quantity(count)


@functools.lru_cache(maxsize=1024)
def decimal_quantity(count: int) -> str:
    """An integer as Kubernetes writes a DecimalSI quantity: trailing zeros in steps of 3 ("1k")."""
    if count == 0:
        return "0"
    exponent, mantissa = 0, count
    while mantissa % 1000 == 0 and exponent < 18:
        mantissa //= 1000
        exponent += 3
    return f"{mantissa}{_DECIMAL_SUFFIXES[exponent]}"


# The same driver versions are written on every device of a node: normalise each once.
_normalized_version = functools.lru_cache(maxsize=256)(normalize_version)


class AttributeWriter:
    """Collects one device's attributes as v1 JSON, applying the representation rule.

    Problems become `warnings` (one line each, naming the device and attribute) instead of
    exceptions: one odd value must not cost the node all its devices.
    """

    def __init__(self, device_name: str) -> None:
        self.device_name = device_name
        self.attributes: dict[str, dict[str, Any]] = {}
        self.warnings: list[str] = []

    def _warn(self, key: str, what: str) -> None:
        self.warnings.append(f"device {self.device_name}: attribute {key}: {what}")

    def string(self, key: str, value: str | None) -> None:
        if not value:
            return
        published = truncate_utf8(value)
        if published != value:
            self._warn(key, f"{value!r} does not fit in {MAX_STRING_BYTES} bytes, published as {published!r}")
        if published:
            self.attributes[key] = {"string": published}

    def version(self, key: str, raw: str) -> None:
        normalized = _normalized_version(raw)
        if normalized is None or semver_error(normalized) is not None:
            self._warn(key, f"{raw!r} is not a version that can be written as semver, left out")
            return
        self.attributes[key] = {"version": normalized}

    def integer(self, key: str, value: int | None) -> None:
        if value is None:
            return
        if not _INT64_MIN <= value <= _INT64_MAX:
            self._warn(key, f"{value} does not fit in int64, left out")
            return
        self.attributes[key] = {"int": value}

    def boolean(self, key: str, value: bool) -> None:
        self.attributes[key] = {"bool": value}
