"""The fake GPU profile file format (`--fake-gpus FILE`), as pydantic models.

A profile describes one node: driver versions and groups of identical GPUs. Every field is
documented in docs/tools.md ("Fake GPU profiles"); the built-in profiles in `profiles/` are
examples. Loading turns any problem into a `DiscoveryError` naming the file and the field.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from dradriver.backend.fake.profiles import MIG_TABLES_FILE
from dradriver.discovery.errors import DiscoveryError
from dradriver.fieldpath import field_path
from dradriver.files import FileInputError, load_document, parse_text

_BDF = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_COMPUTE_CAPABILITY = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)")
_NESTED_FIELD = re.compile(r"[a-zA-Z_][\w.\[\]]*: ")
_PROFILES_PACKAGE = "dradriver.backend.fake.profiles"

#: Sane upper bounds, so that a typo (`count: 100000000`) is an error, not gigabytes of fake GPUs.
MAX_GPUS = 1024
_MAX_INT = 2**31 - 1
_MAX_LIST = 64
NonNegative = Annotated[int, Field(ge=0, le=_MAX_INT)]
Positive = Annotated[int, Field(gt=0, le=_MAX_INT)]
Text = Annotated[str, Field(min_length=1, max_length=256)]
#: MIG slice counts and positions: a GPU has at most 8 memory slices today.
MigSlots = Annotated[int, Field(ge=0, le=_MAX_LIST)]
Major = Annotated[int, Field(gt=0, le=4095)]


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class MigProfileSpec(_Model):
    """One GPU instance profile, as `nvidia-smi mig -lgip` shows it."""

    name: Annotated[str, Field(pattern=r"^[1-9]\d*g\.[1-9]\d*gb(\+[a-z]+)*$")]
    id: NonNegative
    slice_count: Annotated[MigSlots, Field(gt=0)]
    instance_count: Annotated[MigSlots, Field(gt=0)]
    memory_mib: Positive = Field(alias="memoryMiB")
    multiprocessors: Positive
    copy_engines: NonNegative = 0
    decoders: NonNegative = 0
    encoders: NonNegative = 0
    jpeg_engines: NonNegative = 0
    ofa_engines: NonNegative = 0
    placement_size: Annotated[MigSlots, Field(gt=0)]
    placement_starts: Annotated[tuple[MigSlots, ...], Field(min_length=1, max_length=_MAX_LIST)]


class MigDeviceSpec(_Model):
    """A MIG device that exists on the GPU: a GPU instance with one compute instance spanning it."""

    profile: Text
    start: MigSlots
    gi: NonNegative | None = Field(default=None, description="GPU instance id; default: position + 1")


class MigSpec(_Model):
    """MIG support of a GPU group: its profile table, MIG mode and the MIG devices it has.

    The table is either a built-in one by name (`table`) or written out (`profiles`).
    """

    table: Text | None = None
    profiles: Annotated[tuple[MigProfileSpec, ...], Field(min_length=1, max_length=_MAX_LIST)] | None = None
    enabled: bool = False
    devices: Annotated[tuple[MigDeviceSpec, ...], Field(max_length=_MAX_LIST)] = ()

    @field_validator("table")
    @classmethod
    def _known_table(cls, value: str | None) -> str | None:
        if value is not None and value not in builtin_mig_tables():
            raise ValueError(
                f"unknown MIG profile table {value!r} (built-in: {', '.join(sorted(builtin_mig_tables()))})"
            )
        return value

    @model_validator(mode="after")
    def _devices_fit(self) -> MigSpec:
        if (self.table is None) == (self.profiles is None):
            raise ValueError("exactly one of table (a built-in MIG profile table) or profiles is required")
        if self.devices and not self.enabled:
            raise ValueError("MIG devices are listed but MIG is not enabled (set enabled: true)")
        table = {p.name: p for p in self.profile_table()}
        used: dict[int, str] = {}
        gis: set[int] = set()
        for position, device in enumerate(self.devices):
            where = f"devices[{position}]"
            spec = table.get(device.profile)
            if spec is None:
                raise ValueError(f"{where}.profile: {device.profile!r} is not in the MIG profile table")
            if device.start not in spec.placement_starts:
                raise ValueError(
                    f"{where}.start: {device.start} is not a placement of {spec.name} "
                    f"(allowed: {', '.join(map(str, spec.placement_starts))})"
                )
            for memory_slice in range(device.start, device.start + spec.placement_size):
                if memory_slice in used:
                    raise ValueError(
                        f"{where}: memory slice {memory_slice} is already used by {used[memory_slice]}"
                    )
                used[memory_slice] = f"devices[{position}]"
            gi = device.gi if device.gi is not None else position + 1
            if gi in gis:
                raise ValueError(f"{where}.gi: GPU instance id {gi} is used twice")
            gis.add(gi)
        return self

    def profile_table(self) -> tuple[MigProfileSpec, ...]:
        if self.profiles is not None:
            return self.profiles
        return builtin_mig_tables()[self.table] if self.table is not None else ()


class GpuGroup(_Model):
    """`count` identical GPUs with consecutive minors; per-GPU facts come as lists of `count` items."""

    product_name: Text
    count: Annotated[int, Field(gt=0, le=MAX_GPUS)] = 1
    first_minor: Annotated[int, Field(ge=0, le=2**20 - MAX_GPUS)] | None = None
    brand: Text = "Nvidia"
    architecture: Text
    compute_capability: Text
    memory_mib: Positive = Field(alias="memoryMiB")
    uuids: Annotated[tuple[Text, ...], Field(max_length=MAX_GPUS)] | None = None
    pci_bus_ids: Annotated[tuple[Text, ...], Field(max_length=MAX_GPUS)] | None = None
    pcie_roots: Annotated[tuple[Text, ...], Field(max_length=MAX_GPUS)] | None = None
    numa_nodes: Annotated[tuple[NonNegative, ...], Field(max_length=MAX_GPUS)] | None = None
    module_ids: Annotated[tuple[Positive, ...], Field(max_length=MAX_GPUS)] | None = None
    addressing_mode: Literal["HMM", "ATS", "None"] | None = None
    mig: MigSpec | None = None

    @field_validator("compute_capability")
    @classmethod
    def _capability(cls, value: str) -> str:
        if not _COMPUTE_CAPABILITY.fullmatch(value):
            raise ValueError(f"must be MAJOR.MINOR like 9.0, got {value!r}")
        return value

    @field_validator("pci_bus_ids")
    @classmethod
    def _bdf(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for item in value or ():
            if not _BDF.fullmatch(item):
                raise ValueError(f"{item!r} is not a lowercase PCI address like 0000:18:00.0")
        return value

    @model_validator(mode="after")
    def _lists_match_count(self) -> GpuGroup:
        for field_name in ("uuids", "pci_bus_ids", "pcie_roots", "numa_nodes", "module_ids"):
            value = getattr(self, field_name)
            if value is not None and len(value) != self.count:
                raise ValueError(
                    f"{to_camel(field_name)}: has {len(value)} items, expected count={self.count}"
                )
        return self


class FakeProfile(_Model):
    """A fake node: what the fake backend reports instead of NVML."""

    description: Annotated[str, Field(max_length=4096)] = ""
    driver_version: Text
    cuda_driver_version: Text
    nvidia_caps_major: Major = 236
    #: Character major of /dev/nvidia-uvm (dynamic on real nodes; any free major works for fakes).
    nvidia_uvm_major: Major = 510
    gpus: Annotated[tuple[GpuGroup, ...], Field(max_length=MAX_GPUS)]

    @model_validator(mode="after")
    def _unique_minors(self) -> FakeProfile:
        total = sum(group.count for group in self.gpus)
        if total > MAX_GPUS:
            raise ValueError(f"gpus: {total} GPUs in all; a profile may have at most {MAX_GPUS}")
        seen: set[int] = set()
        for minor in (m for _, minors in self.expand_minors() for m in minors):
            if minor in seen:
                raise ValueError(f"GPU minor {minor} is used by two GPU groups (set firstMinor)")
            seen.add(minor)
        return self

    def expand_minors(self) -> list[tuple[GpuGroup, range]]:
        """Each group with its minors: from `firstMinor`, else one past the previous group's last."""
        out: list[tuple[GpuGroup, range]] = []
        following = 0
        for group in self.gpus:
            first = group.first_minor if group.first_minor is not None else following
            out.append((group, range(first, first + group.count)))
            following = first + group.count
        return out


def _one_line(err: ValidationError) -> str:
    first = err.errors()[0]
    path = field_path(first["loc"])
    message = str(first["msg"]).removeprefix("Value error, ")
    # Our own validators start their message with the nested field they blame: join the paths.
    if path and _NESTED_FIELD.match(message):
        path, message = f"{path}.{message.split(': ', 1)[0]}", message.split(": ", 1)[1]
    more = f" (and {len(err.errors()) - 1} more problems)" if len(err.errors()) > 1 else ""
    return f"{path or 'profile'}: {message}{more}"


def parse_profile(data: Any, source: str) -> FakeProfile:
    """Validate already-loaded YAML/JSON data; `source` names it in errors."""
    if not isinstance(data, dict):
        raise DiscoveryError(f"invalid fake GPU profile {source}: must be a mapping with a 'gpus' list")
    try:
        return FakeProfile.model_validate(data)
    except ValidationError as err:
        raise DiscoveryError(f"invalid fake GPU profile {source}: {_one_line(err)}") from None


def _load_yaml(text: str, source: str) -> Any:
    try:
        documents = parse_text(text, source, json_text=False)
    except FileInputError as err:
        raise DiscoveryError(f"invalid fake GPU profile {err}") from None
    if len(documents) > 1:
        raise DiscoveryError(f"invalid fake GPU profile {source}: holds {len(documents)} YAML documents")
    return documents[0] if documents else None


def load_profile_file(path: Path) -> FakeProfile:
    try:
        data = load_document(path)
    except FileInputError as err:
        raise DiscoveryError(f"invalid fake GPU profile {err}") from None
    return parse_profile(data, str(path))


def load_builtin_profile(name: str) -> FakeProfile:
    text = resources.files(_PROFILES_PACKAGE).joinpath(f"{name}.yaml").read_text()
    return parse_profile(_load_yaml(text, f"{name!r}"), f"{name!r}")


@cache
def builtin_mig_tables() -> dict[str, tuple[MigProfileSpec, ...]]:
    """MIG profile tables of real GPU models, keyed by the name profiles refer to."""
    data = _load_yaml(resources.files(_PROFILES_PACKAGE).joinpath(MIG_TABLES_FILE).read_text(), "mig tables")
    return {
        name: tuple(MigProfileSpec.model_validate(item) for item in items) for name, items in data.items()
    }
