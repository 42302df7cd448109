"""`dradriver.offline.allocation.capacity`: request policies and quantities as the 1.36 allocator reads them.

The allocation scenarios (`test_allocation_scenarios.py`) and the differential test against
dra-oracle cover the allocator's use of these; here, the pieces with values read off
`resource.Quantity` and `consumable_capacity.go`.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import pytest

from dradriver.offline.allocation.capacity import (
    Capacity,
    CapacityError,
    consumption,
    device_capacities,
    fits,
    parse_amount,
)


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("20Gi", "20Gi"),
        ("1536Mi", "1536Mi"),
        ("1.5Gi", "1536Mi"),
        ("1025Ki", "1025Ki"),
        ("1000Ki", "1000Ki"),
        ("512", "512"),
        ("20000", "20k"),
        ("1500000", "1500k"),
        ("1.5", "1500m"),
        ("2e3", "2e3"),
        ("0", "0"),
        ("100m", "100m"),
    ],
)
def test_amounts_print_as_kubernetes_prints_quantities(text: str, canonical: str) -> None:
    assert str(parse_amount(text, "x")) == canonical


def test_a_bad_quantity_names_where_it_is() -> None:
    with pytest.raises(CapacityError, match=r"^device d: capacity memory value: quantities must match"):
        device_capacities({"capacity": {"memory": {"value": "80 GB"}}}, "device d")


def capacities(policy: Mapping[str, Any] | None, value: str = "80Gi") -> dict[str, Capacity]:
    entry: dict[str, Any] = {"value": value}
    if policy is not None:
        entry["requestPolicy"] = policy
    return device_capacities({"capacity": {"memory": entry, "multiprocessors": {"value": "132"}}}, "d")


RANGE = {"default": "10Gi", "validRange": {"min": "10Gi", "max": "40Gi", "step": "10Gi"}}


@pytest.mark.parametrize(
    ("policy", "requested", "memory"),
    [
        (RANGE, None, "10Gi"),  # the default
        (RANGE, "1Gi", "10Gi"),  # below min: min
        (RANGE, "15Gi", "20Gi"),  # a whole number of steps up from min
        (RANGE, "40Gi", "40Gi"),
        (RANGE, "41Gi", None),  # rounded to 50Gi, past max
        ({"validRange": {"min": "4Gi"}}, "5Gi", "5Gi"),  # no step: as asked
        ({"default": "1Gi", "validValues": ["1Gi", "4Gi"]}, "2Gi", "4Gi"),
        ({"default": "1Gi", "validValues": ["1Gi", "4Gi"]}, "5Gi", None),
        ({"validRange": {"min": "1Gi", "max": "8Gi"}}, None, None),  # the whole 80Gi, past max
        (None, None, "80Gi"),  # no policy, no request: everything
        (None, "3Gi", "3Gi"),
    ],
)
def test_what_one_allocation_consumes(
    policy: Mapping[str, Any] | None, requested: str | None, memory: str | None
) -> None:
    asked = {} if requested is None else {"memory": parse_amount(requested, "request")}
    consumed = consumption(asked, capacities(policy))
    if memory is None:
        assert consumed is None
    else:
        assert consumed is not None
        assert (str(consumed["memory"]), str(consumed["multiprocessors"])) == (memory, "132")


def test_a_request_for_a_capacity_the_device_lacks_consumes_nothing_there() -> None:
    assert consumption({"bandwidth": parse_amount("1", "request")}, capacities(None)) is None


def test_fits_adds_every_use_to_what_the_allocation_consumes() -> None:
    caps = capacities(RANGE)
    consumed = consumption({"memory": parse_amount("30Gi", "r")}, caps)
    assert consumed is not None
    gib = Fraction(1024**3)
    assert fits(consumed, caps, {"memory": 50 * gib})
    assert not fits(consumed, caps, {"memory": 40 * gib}, {"memory": 20 * gib})
    assert not fits(consumed, caps, {"multiprocessors": Fraction(1)})
