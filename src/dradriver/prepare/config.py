"""Opaque device configuration of our driver: `GpuConfig` and `MigDeviceConfig`.

They arrive in DeviceClasses and ResourceClaims as `config[].opaque.parameters` for our driver and
reach us, class entries first, in the claim's `status.allocation.devices.config`. Decoding is
strict: an unknown field, a wrong type or a value out of range is an error naming the field, so a
typo fails the claim instead of silently doing nothing. Anything a tenant writes is bounded
before it is used: quantities by `quantity.tenant_quantity`, names and map sizes here, nesting
where the claim is decoded. A config is checked once: its result, an error included, is kept by
the hash of its JSON for the kubelet's retries.

    apiVersion: gpu.dradriver.dev/v1alpha1
    kind: GpuConfig                     # or MigDeviceConfig
    sharing:
      strategy: TimeSlicing             # or MPS
      timeSlicing: {interval: Long}     # Default | Short | Medium | Long
      # mps: {defaultActiveThreadPercentage: 50, defaultPinnedDeviceMemoryLimit: 10Gi,
      #       perDevicePinnedMemoryLimit: {gpu-0: 20Gi}}
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from pydantic.alias_generators import to_camel

from dradriver.fieldpath import clip
from dradriver.prepare.resourceclaim import AllocatedConfig, Name, TenantQuantity
from dradriver.quantity import Quantity

API_VERSION = "gpu.dradriver.dev/v1alpha1"
#: Entries of a per-device map: more than the devices of any node.
MAX_DEVICE_ENTRIES = 1024
#: Problems reported of one config; the rest are counted.
MAX_PROBLEMS = 5
#: Configs whose result is kept (a few hundred bytes each).
CACHE_SIZE = 1024


def _positive(value: str) -> str:
    if Quantity.parse(value).sign() <= 0:
        raise ValueError("must be greater than zero")
    return value


QuantityString = Annotated[TenantQuantity, AfterValidator(_positive)]


def _few_entries(value: Any) -> Any:
    """Counted before any entry is checked (pydantic checks a map's length after its entries)."""
    if isinstance(value, dict) and len(value) > MAX_DEVICE_ENTRIES:
        raise ValueError(f"more than {MAX_DEVICE_ENTRIES} entries")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(
        strict=True, extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True
    )


#: Time-slice lengths NVML knows, from the default to the longest.
Interval = Literal["Default", "Short", "Medium", "Long"]


class TimeSlicing(_Strict):
    interval: Interval = "Default"


class Mps(_Strict):
    default_active_thread_percentage: Annotated[int, Field(ge=1, le=100)] | None = None
    default_pinned_device_memory_limit: QuantityString | None = None
    #: Keyed by our device name (gpu-0) or GPU UUID.
    per_device_pinned_memory_limit: Annotated[
        dict[Name, QuantityString] | None, BeforeValidator(_few_entries)
    ] = None


class Sharing(_Strict):
    strategy: Literal["TimeSlicing", "MPS"]
    time_slicing: TimeSlicing | None = None
    mps: Mps | None = None

    @model_validator(mode="after")
    def _settings_match_strategy(self) -> Self:
        if self.strategy == "TimeSlicing" and self.mps is not None:
            raise ValueError("mps settings given with strategy TimeSlicing")
        if self.strategy == "MPS" and self.time_slicing is not None:
            raise ValueError("timeSlicing settings given with strategy MPS")
        return self

    def describe(self) -> str:
        if self.strategy == "TimeSlicing":
            return f"TimeSlicing({(self.time_slicing or TimeSlicing()).interval})"
        return "MPS"


class GpuConfig(_Strict):
    api_version: Literal["gpu.dradriver.dev/v1alpha1"]
    kind: Literal["GpuConfig"]
    sharing: Sharing | None = None


class MigDeviceConfig(_Strict):
    api_version: Literal["gpu.dradriver.dev/v1alpha1"]
    kind: Literal["MigDeviceConfig"]
    sharing: Sharing | None = None

    @model_validator(mode="after")
    def _no_time_slicing(self) -> Self:
        if self.sharing is not None and self.sharing.strategy == "TimeSlicing":
            raise ValueError("MIG devices are isolated partitions: TimeSlicing cannot be applied; use MPS")
        return self


DeviceConfig = GpuConfig | MigDeviceConfig
_adapter: TypeAdapter[DeviceConfig] = TypeAdapter(
    Annotated[GpuConfig | MigDeviceConfig, Field(discriminator="kind")]
)


class ConfigError(ValueError):
    """A config that cannot be decoded; the message names the field path."""


#: A decoded config, or (field path below `parameters`, message) of what is wrong with it.
_Checked = DeviceConfig | tuple[tuple[str, str], ...]
_checked: OrderedDict[bytes, _Checked] = OrderedDict()
_checked_lock = threading.Lock()


def _check(parameters: Any) -> _Checked:
    """The result for these parameters, from the cache when they were checked before."""
    key = hashlib.sha256(json.dumps(parameters, sort_keys=True, default=repr).encode()).digest()
    with _checked_lock:
        if (known := _checked.get(key)) is not None:
            _checked.move_to_end(key)
            return known
    result = _validate(parameters)
    with _checked_lock:
        _checked[key] = result
        if len(_checked) > CACHE_SIZE:
            _checked.popitem(last=False)
    return result


def _validate(parameters: Any) -> _Checked:
    try:
        return _adapter.validate_python(parameters)
    except ValidationError as err:
        found = []
        for e in err.errors(include_url=False)[:MAX_PROBLEMS]:
            loc = e["loc"][1:] if e["loc"] and e["loc"][0] in {"GpuConfig", "MigDeviceConfig"} else e["loc"]
            if e["type"] == "union_tag_invalid":
                kind = clip(repr(e["input"].get("kind")))
                found.append((".kind", f"must be GpuConfig or MigDeviceConfig, not {kind}"))
            elif e["type"] == "union_tag_not_found":
                found.append((".kind", "required (GpuConfig or MigDeviceConfig)"))
            else:
                found.append(("".join(f".{clip(str(p))}" for p in loc), e["msg"]))
        if err.error_count() > MAX_PROBLEMS:
            found.append(("", f"and {err.error_count() - MAX_PROBLEMS} more problems"))
        return tuple(found)


def problems(parameters: Any, where: str = "parameters") -> list[tuple[str, str]]:
    """(field path, message) for what is wrong with one `opaque.parameters` object (the first
    MAX_PROBLEMS, then how many more)."""
    checked = _check(parameters)
    return [] if isinstance(checked, GpuConfig | MigDeviceConfig) else [(where + p, m) for p, m in checked]


def parse(parameters: Any, where: str = "parameters") -> DeviceConfig:
    """Decode one `opaque.parameters` object; `where` prefixes field paths in errors."""
    checked = _check(parameters)
    if isinstance(checked, GpuConfig | MigDeviceConfig):
        return checked
    raise ConfigError("; ".join(f"{where}{path}: {message}" for path, message in checked))


@dataclass(frozen=True)
class ScopedConfig:
    """A decoded config with the requests it applies to (empty: all) and where it came from."""

    config: DeviceConfig
    requests: tuple[str, ...]
    source: str

    def applies_to(self, request: str) -> bool:
        """A config naming `gpu` applies to results of `gpu/h100`; one naming `gpu/h100` only to those."""
        return not self.requests or request in self.requests or request.partition("/")[0] in self.requests


def our_configs(allocation_configs: Sequence[AllocatedConfig], driver_name: str) -> list[ScopedConfig]:
    """Decode our driver's entries of `status.allocation.devices.config`, in order (class first).

    Entries for other drivers are skipped. Raises ConfigError naming the entry and field.
    """
    decoded = []
    for i, entry in enumerate(allocation_configs):
        if entry.opaque is None or entry.opaque.driver != driver_name:
            continue
        where = f"status.allocation.devices.config[{i}].opaque.parameters"
        decoded.append(
            ScopedConfig(
                config=parse(entry.opaque.parameters, where),
                requests=entry.requests,
                source=entry.source,
            )
        )
    return decoded


def effective(configs: Sequence[ScopedConfig], request: str, kind: type[DeviceConfig]) -> DeviceConfig | None:
    """The config of `kind` that governs a result of `request`: the last matching one wins,
    so claim configs override class configs."""
    chosen: DeviceConfig | None = None
    for scoped in configs:
        if isinstance(scoped.config, kind) and scoped.applies_to(request):
            chosen = scoped.config
    return chosen
