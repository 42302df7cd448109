"""Opaque device configuration of our driver: `GpuConfig` and `MigDeviceConfig`.

They arrive in DeviceClasses and ResourceClaims as `config[].opaque.parameters` for our driver and
reach us, class entries first, in the claim's `status.allocation.devices.config`. Decoding is
strict: an unknown field, a wrong type or a value out of range is an error naming the field, so a
typo fails the claim instead of silently doing nothing.

    apiVersion: gpu.dradriver.dev/v1alpha1
    kind: GpuConfig                     # or MigDeviceConfig
    sharing:
      strategy: TimeSlicing             # or MPS
      timeSlicing: {interval: Long}     # Default | Short | Medium | Long
      # mps: {defaultActiveThreadPercentage: 50, defaultPinnedDeviceMemoryLimit: 10Gi,
      #       perDevicePinnedMemoryLimit: {gpu-0: 20Gi}}
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from pydantic.alias_generators import to_camel

from dradriver.prepare.resourceclaim import AllocatedConfig
from dradriver.quantity import Quantity, QuantityError

API_VERSION = "gpu.dradriver.dev/v1alpha1"


def _check_quantity(value: str) -> str:
    try:
        quantity = Quantity.parse(value)
    except QuantityError as err:
        raise ValueError(str(err)) from None
    if quantity.sign() <= 0:
        raise ValueError("must be greater than zero")
    return value


QuantityString = Annotated[str, AfterValidator(_check_quantity)]


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
    per_device_pinned_memory_limit: dict[str, QuantityString] | None = None


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


def problems(parameters: Any, where: str = "parameters") -> list[tuple[str, str]]:
    """(field path, message) for everything wrong with one `opaque.parameters` object."""
    try:
        _adapter.validate_python(parameters)
    except ValidationError as err:
        found = []
        for e in err.errors(include_url=False):
            loc = e["loc"][1:] if e["loc"] and e["loc"][0] in {"GpuConfig", "MigDeviceConfig"} else e["loc"]
            if e["type"] == "union_tag_invalid":
                found.append(
                    (f"{where}.kind", f"must be GpuConfig or MigDeviceConfig, not {e['input'].get('kind')!r}")
                )
            elif e["type"] == "union_tag_not_found":
                found.append((f"{where}.kind", "required (GpuConfig or MigDeviceConfig)"))
            else:
                found.append((".".join([where, *(str(p) for p in loc)]), e["msg"]))
        return found
    return []


def parse(parameters: Any, where: str = "parameters") -> DeviceConfig:
    """Decode one `opaque.parameters` object; `where` prefixes field paths in errors."""
    found = problems(parameters, where)
    if found:
        raise ConfigError("; ".join(f"{path}: {message}" for path, message in found))
    return _adapter.validate_python(parameters)


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
