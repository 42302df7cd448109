"""Kubernetes' ResourceSlice limits and the `Finding` every validation rule reports.

The numbers are upstream's (k8s.io/api/resource/v1 constants, 1.35/1.36 values) so that the
validators and the renderer agree on them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from dradriver.names import ATTRIBUTE_VALUE_MAX_BYTES

API_VERSION = "resource.k8s.io/v1"
KIND = "ResourceSlice"
MAX_DEVICES = 128
MAX_DEVICES_ADVANCED = 64
MAX_COUNTER_SETS = 8
MAX_COUNTERS = 32
MAX_CONSUMPTIONS_PER_DEVICE = 2
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_ATTRIBUTE_VALUES = 48
MAX_STRING_BYTES = ATTRIBUTE_VALUE_MAX_BYTES
MAX_KEY_LENGTH = 63 + 1 + 32
MAX_TAINTS = 16
MAX_BINDING_CONDITIONS = 4
MAX_VALID_VALUES = 10
POOL_NAME_MAX = 253

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem: where (`[0].spec.devices[3].name`) and what, in the API server's words."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def field_key(path: str, key: str) -> str:
    return f"{path}.{key}" if _IDENTIFIER.fullmatch(key) else f"{path}[{key}]"


def require_mapping(value: Any, path: str, what: str = "an object") -> Iterator[Finding]:
    if not isinstance(value, Mapping):
        yield Finding(path, f"must be {what}")


def unknown_keys(obj: Mapping[str, Any], allowed: set[str], path: str) -> Iterator[Finding]:
    for key in obj:
        if key not in allowed:
            yield Finding(field_key(path, str(key)), "unknown field (the API server drops or rejects it)")


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def checked(err: str | None, path: str) -> Iterator[Finding]:
    if err is not None:
        yield Finding(path, err)


def required_string(
    obj: Mapping[str, Any], key: str, path: str, error: Callable[[str], str | None]
) -> Iterator[Finding]:
    """`obj[key]` must be a non-empty string that `error` finds nothing wrong with."""
    value = obj.get(key)
    if not isinstance(value, str) or not value:
        yield Finding(f"{path}.{key}", "Required value")
    else:
        yield from checked(error(value), f"{path}.{key}")
