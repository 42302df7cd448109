"""Partitionable counters tell the truth for every MIG layout of A100-40GB, A100-80GB and H100-80GB.

The reference below is NVIDIA's Multi-Instance GPU User Guide, "Supported MIG Profiles"
(https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html): per GPU
instance profile its compute fraction (x/7 SMs), engines, "Number of Instances Available" and,
as `nvidia-smi mig -lgipp` prints them in the guide, its placements `{starts}:size` in memory
slices. A layout (a set of GPU instances) is valid when every instance sits at one of its
profile's placements, no two share a memory slice, and no profile has more instances than
available. That rule is written here independently of the device model; the tests check that
the published counters allow exactly the valid layouts, from an empty GPU and from every valid
layout of operator-made MIG devices.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import pytest

from dradriver.backend.fake.discovery import inventory_from_profile
from dradriver.backend.fake.profile import builtin_mig_tables, parse_profile
from dradriver.devicemodel import PossibleMig, build_devices
from dradriver.discovery.model import NodeInventory
from dradriver.quantity import Quantity

DRIVER = "gpu.dradriver.dev"


@dataclass(frozen=True)
class Reference:
    """One row of the guide's table: name, compute slices, NVDEC/JPEG/OFA, copy engines, instances,
    placement starts and size."""

    name: str
    compute: int
    decoders: int
    jpeg: int
    ofa: int
    copy_engines: int
    instances: int
    starts: tuple[int, ...]
    size: int


ONE_TO_SEVEN = (0, 1, 2, 3, 4, 5, 6)


def _a100(mem: tuple[str, str, str, str, str, str, str]) -> tuple[Reference, ...]:
    one, one_me, one_double, two, three, four, seven = mem
    return (
        Reference(one, 1, 0, 0, 0, 1, 7, ONE_TO_SEVEN, 1),
        Reference(one_me, 1, 1, 1, 1, 1, 1, ONE_TO_SEVEN, 1),
        Reference(one_double, 1, 1, 0, 0, 1, 4, (0, 2, 4, 6), 2),
        Reference(two, 2, 1, 0, 0, 2, 3, (0, 2, 4), 2),
        Reference(three, 3, 2, 0, 0, 3, 2, (0, 4), 4),
        Reference(four, 4, 2, 0, 0, 4, 1, (0,), 4),
        Reference(seven, 7, 5, 1, 1, 7, 1, (0,), 8),
    )


GUIDE: dict[str, tuple[Reference, ...]] = {
    # "A100 MIG Profiles": the A100-SXM4-40GB table (the PCIe 40GB has the same profiles).
    "a100-pcie-40gb": _a100(("1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")),
    # "For A100-SXM4-80GB, the profile names will change according to the memory proportion".
    "a100-sxm4-80gb": _a100(("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")),
    # "H100 MIG Profiles": the H100-SXM5-80GB / H100-PCIE-80GB table.
    "h100-80gb": (
        Reference("1g.10gb", 1, 1, 1, 0, 1, 7, ONE_TO_SEVEN, 1),
        Reference("1g.10gb+me", 1, 1, 1, 1, 1, 1, ONE_TO_SEVEN, 1),
        Reference("1g.20gb", 1, 1, 1, 0, 1, 4, (0, 2, 4, 6), 2),
        Reference("2g.20gb", 2, 2, 2, 0, 2, 3, (0, 2, 4), 2),
        Reference("3g.40gb", 3, 3, 3, 0, 3, 2, (0, 4), 4),
        Reference("4g.40gb", 4, 4, 4, 0, 4, 1, (0,), 4),
        Reference("7g.80gb", 7, 7, 7, 1, 8, 1, (0,), 8),
    ),
}
#: Product, architecture and total memory (MiB, what NVML reports) of a GPU using each table.
GPUS = {
    "a100-pcie-40gb": ("NVIDIA A100-PCIE-40GB", "Ampere", "8.0", 40960),
    "a100-sxm4-80gb": ("NVIDIA A100-SXM4-80GB", "Ampere", "8.0", 81920),
    "h100-80gb": ("NVIDIA H100 80GB HBM3", "Hopper", "9.0", 81559),
}

Instance = tuple[str, int]  # (profile, placement start)
Layout = frozenset[Instance]


def _slices(table: str, instance: Instance) -> range:
    size = next(r.size for r in GUIDE[table] if r.name == instance[0])
    return range(instance[1], instance[1] + size)


def valid(table: str, layout: Layout) -> bool:
    """The guide's rule, nothing else."""
    used: set[int] = set()
    for instance in layout:
        slices = set(_slices(table, instance))
        if used & slices:
            return False
        used |= slices
    counts: dict[str, int] = {}
    for name, _ in layout:
        counts[name] = counts.get(name, 0) + 1
    limits = {r.name: r.instances for r in GUIDE[table]}
    return all(count <= limits[name] for name, count in counts.items())


def all_instances(table: str) -> list[Instance]:
    return [(r.name, start) for r in GUIDE[table] for start in r.starts]


@cache
def valid_layouts(table: str) -> tuple[Layout, ...]:
    """Every valid layout, the empty one included (depth-first over the placements in order)."""
    instances = all_instances(table)
    found: list[Layout] = []

    def extend(layout: Layout, after: int) -> None:
        found.append(layout)
        for index in range(after, len(instances)):
            bigger = layout | {instances[index]}
            if valid(table, bigger):
                extend(bigger, index + 1)

    extend(frozenset(), 0)
    return tuple(found)


def inventory(table: str, existing: Layout) -> NodeInventory:
    product, architecture, capability, memory = GPUS[table]
    devices = [{"profile": name, "start": start} for name, start in sorted(existing, key=lambda i: i[1])]
    profile = parse_profile(
        {
            "driverVersion": "570.124.06",
            "cudaDriverVersion": "12.8",
            "gpus": [
                {
                    "productName": product,
                    "architecture": architecture,
                    "computeCapability": capability,
                    "memoryMiB": memory,
                    "mig": {"table": table, "enabled": True, "devices": devices},
                }
            ],
        },
        "test",
    )
    return inventory_from_profile(profile, seed=table)


def _amount(value: str) -> int:
    """A counter value in the scheduler's arithmetic (Kubernetes quantities; ours are integers)."""
    amount = Quantity.parse(value).as_int64()
    assert amount is not None, value
    return amount


class Counters:
    """The published counter set of GPU 0 and what each placement consumes, as the scheduler adds them."""

    def __init__(self, table: str, existing: Layout) -> None:
        devices = build_devices(inventory(table, existing), driver_name=DRIVER, partitionable=True)
        assert devices.get("gpu-0") is None, "a GPU in MIG mode is never offered whole"
        self.capacity: dict[str, int] = {}
        for counter_set in devices.counter_sets:
            assert counter_set["name"] == "gpu-0-counters"
            self.capacity = {k: _amount(v["value"]) for k, v in counter_set["counters"].items()}
        self.static = {
            (d.json["attributes"]["profile"]["string"], d.json["attributes"]["placementStart"]["int"])
            for d in devices.devices
            if not isinstance(d.hardware, PossibleMig)
        }
        self.placements: dict[Instance, dict[str, int]] = {}
        for device in devices.devices:
            if isinstance(device.hardware, PossibleMig):
                [consumption] = device.json["consumesCounters"]
                assert consumption["counterSet"] == "gpu-0-counters"
                counters = consumption["counters"]
                assert set(counters) <= set(self.capacity), "a counter outside the set makes the pool invalid"
                key = (device.hardware.profile.name, device.hardware.placement.start)
                self.placements[key] = {k: _amount(v["value"]) for k, v in counters.items()}

    def fits(self, chosen: Sequence[Instance]) -> bool:
        total: dict[str, int] = {}
        for instance in chosen:
            for name, amount in self.placements[instance].items():
                total[name] = total.get(name, 0) + amount
        return all(self.capacity[name] >= amount for name, amount in total.items())

    def allocatable_sets(self) -> set[Layout]:
        """Every set of published placements the scheduler could allocate together."""
        instances = list(self.placements)
        found: set[Layout] = set()

        def extend(chosen: list[Instance], after: int) -> None:
            found.add(frozenset(chosen))
            for index in range(after, len(instances)):
                if self.fits([*chosen, instances[index]]):
                    extend([*chosen, instances[index]], index + 1)

        extend([], 0)
        return found


@pytest.mark.parametrize("table", sorted(GUIDE))
def test_builtin_tables_are_the_guides(table: str) -> None:
    built_in = {p.name: p for p in builtin_mig_tables()[table]}
    assert sorted(built_in) == sorted(r.name for r in GUIDE[table])  # in NVML's order, not the guide's
    for reference in GUIDE[table]:
        spec = built_in[reference.name]
        assert (spec.slice_count, spec.instance_count) == (reference.compute, reference.instances)
        assert (spec.decoders, spec.jpeg_engines, spec.ofa_engines) == (
            reference.decoders,
            reference.jpeg,
            reference.ofa,
        )
        assert spec.copy_engines == reference.copy_engines
        assert (spec.placement_starts, spec.placement_size) == (reference.starts, reference.size)


@pytest.mark.parametrize("table", sorted(GUIDE))
def test_empty_gpu_allows_exactly_the_valid_layouts(table: str) -> None:
    counters = Counters(table, frozenset())
    assert set(counters.placements) == set(all_instances(table))
    assert counters.allocatable_sets() == set(valid_layouts(table))


def _layouts_with_existing(table: str) -> Iterator[Layout]:
    yield from (layout for layout in valid_layouts(table) if layout)


@pytest.mark.parametrize("table", sorted(GUIDE))
def test_existing_mig_devices_leave_exactly_the_valid_extensions(table: str) -> None:
    """For every valid layout made by an operator: the devices are published as they are, and the
    placements and counters left allow exactly the sets that complete it to a valid layout."""
    layouts = set(valid_layouts(table))
    checked = 0
    for existing in _layouts_with_existing(table):
        counters = Counters(table, existing)
        assert counters.static == set(existing)
        expected = {layout - existing for layout in layouts if existing <= layout}
        assert counters.allocatable_sets() == expected, sorted(existing)
        checked += 1
    assert checked == len(layouts) - 1


def test_layout_counts_are_what_the_guide_allows() -> None:
    """A sanity check of the enumeration itself: the same count for all three, 7 1g instances at most."""
    counts = {table: len(valid_layouts(table)) for table in GUIDE}
    assert len(set(counts.values())) == 1, counts
    assert max(len(layout) for layout in valid_layouts("h100-80gb")) == 7


def _counter_values(counter_set: Mapping[str, Any]) -> dict[str, str]:
    return {k: v["value"] for k, v in counter_set["counters"].items()}


def test_counter_set_of_a100_80gb_with_a_3g_device() -> None:
    """One rendering spelled out: a 3g.40gb at 0 takes slices 0-3, 42 SMs, 3 copy engines, 2 NVDECs."""
    devices = build_devices(
        inventory("a100-sxm4-80gb", frozenset({("3g.40gb", 0)})), driver_name=DRIVER, partitionable=True
    )
    [counter_set] = devices.counter_sets
    assert _counter_values(counter_set) == {
        "memory": "41728Mi",  # 81920 - 40192
        "multiprocessors": "56",
        "copy-engines": "4",
        "decoders": "3",
        "jpeg-engines": "1",
        "ofa-engines": "1",
        **{f"memory-slice-{i}": "1" for i in range(4, 8)},
    }
    names = [d.name for d in devices.devices]
    assert names[0] == "gpu-0-mig-3g40gb-0"  # the operator's device, as it is
    assert "consumesCounters" not in devices.devices[0].json
    assert names[1:] == [
        "gpu-0-mig-1g10gb-6",
        "gpu-0-mig-1g10gb-5",
        "gpu-0-mig-1g10gb-4",
        "gpu-0-mig-1g10gbme-6",
        "gpu-0-mig-1g10gbme-5",
        "gpu-0-mig-1g10gbme-4",
        "gpu-0-mig-1g20gb-6",
        "gpu-0-mig-1g20gb-4",
        "gpu-0-mig-2g20gb-4",
        "gpu-0-mig-3g40gb-4",
    ]
