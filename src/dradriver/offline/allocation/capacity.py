"""Consumable capacity (DRAConsumableCapacity, on by default in 1.36) as the scheduler checks it.

Ported from structured/internal/incubating consumable_capacity.go (release-1.36): a request's
`capacity.requests` must name capacities the device has and fit what is left of them, rounded up
by the capacity's `requestPolicy`; a device with `allowMultipleAllocations` is shared, each
allocation consuming the rounded request, its policy's default or, without either, the whole
capacity. Names match exactly, as in 1.36 (a request for `gpu.example.com/memory` does not match
a capacity published as `memory`). Pure: quantities in, verdicts and amounts out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from dradriver.quantity import Quantity, QuantityError


class CapacityError(ValueError):
    """A capacity or request that is not a quantity; the message names it."""


@dataclass(frozen=True)
class Amount:
    """A quantity's exact value and the format Kubernetes prints it in."""

    value: Fraction
    binary: bool = False
    exponent: bool = False

    def __str__(self) -> str:
        """Quantity.String(): the canonical form in the quantity's own format."""
        return Quantity.in_nanos(self.value, binary=self.binary, exponent=self.exponent).canonical()


def parse_amount(text: Any, where: str) -> Amount:
    try:
        quantity = Quantity.parse(str(text))
    except QuantityError as err:
        raise CapacityError(f"{where}: {err}") from None
    suffix = str(text).lstrip("+-0123456789.")
    return Amount(quantity.exact(), binary=suffix.endswith("i"), exponent=suffix[:1] in ("e", "E"))


@dataclass(frozen=True)
class Capacity:
    """One capacity of a device with its request policy."""

    value: Amount
    default: Amount | None = None
    minimum: Amount | None = None
    maximum: Amount | None = None
    step: Amount | None = None
    valid_values: tuple[Amount, ...] | None = None


def device_capacities(body: Mapping[str, Any], where: str) -> dict[str, Capacity]:
    """A device's `capacity` map, parsed."""
    out: dict[str, Capacity] = {}
    raw = body.get("capacity")
    if not isinstance(raw, Mapping):
        return out
    for name, entry in raw.items():
        if not isinstance(entry, Mapping):
            continue
        at = f"{where}: capacity {name}"
        policy = entry.get("requestPolicy")
        policy = policy if isinstance(policy, Mapping) else {}
        bounds = policy.get("validRange")
        bounds = bounds if isinstance(bounds, Mapping) else None
        values = policy.get("validValues")

        def optional(value: Any, field: str) -> Amount | None:
            return None if value is None else parse_amount(value, f"{at} requestPolicy.{field}")  # noqa: B023

        out[str(name)] = Capacity(
            value=parse_amount(entry.get("value"), f"{at} value"),
            default=optional(policy.get("default"), "default"),
            minimum=optional(bounds.get("min"), "validRange.min") if bounds else None,
            maximum=optional(bounds.get("max"), "validRange.max") if bounds else None,
            step=optional(bounds.get("step"), "validRange.step") if bounds else None,
            valid_values=(
                tuple(parse_amount(v, f"{at} requestPolicy.validValues") for v in values)
                if isinstance(values, list) and values
                else None
            ),
        )
    return out


def _ceil(value: Fraction) -> int:
    """Quantity.Value(): rounded up to an integer."""
    return -(-value.numerator // value.denominator)


def _consumed(requested: Amount | None, capacity: Capacity) -> tuple[Amount, bool]:
    """calculateConsumedCapacity, and whether the amount is the policy's default."""
    if requested is None:
        if capacity.default is not None:
            return capacity.default, True
        return capacity.value, False
    if capacity.minimum is not None:
        if requested.value < capacity.minimum.value:
            return capacity.minimum, False
        if capacity.step is None:
            return requested, False
        low, step = _ceil(capacity.minimum.value), _ceil(capacity.step.value)
        steps = -(-(_ceil(requested.value) - low) // step)  # requested >= min: a whole number of steps up
        return Amount(Fraction(low + step * steps), capacity.step.binary, capacity.step.exponent), False
    if capacity.valid_values is not None:
        for option in capacity.valid_values:
            if requested.value <= option.value:
                return option, False
    return requested, False


def _violates(amount: Amount, capacity: Capacity) -> bool:
    """violatesPolicy (integer arithmetic, as 1.36 does)."""
    if capacity.minimum is not None:
        if capacity.maximum is not None and amount.value > capacity.maximum.value:
            return True
        if capacity.step is not None:
            offset = _ceil(amount.value) - _ceil(capacity.minimum.value)
            return offset % _ceil(capacity.step.value) != 0
        return False
    if capacity.valid_values:
        return all(amount.value != option.value for option in capacity.valid_values)
    return False


def consumption(
    requests: Mapping[str, Amount], capacities: Mapping[str, Capacity]
) -> dict[str, Amount] | None:
    """What one allocation consumes of every capacity (GetConsumedCapacityFromRequest), or None
    when the request names a capacity the device lacks or breaks a request policy."""
    if any(name not in capacities for name in requests):
        return None
    out: dict[str, Amount] = {}
    for name, capacity in capacities.items():
        amount, is_default = _consumed(requests.get(name), capacity)
        if not is_default and _violates(amount, capacity):
            return None
        out[name] = amount
    return out


def fits(
    consumed: Mapping[str, Amount],
    capacities: Mapping[str, Capacity],
    *in_use: Mapping[str, Fraction],
) -> bool:
    """CmpRequestOverCapacity's last step: every capacity holds what is in use plus `consumed`."""
    for name, capacity in capacities.items():
        total = consumed[name].value + sum(used.get(name, 0) for used in in_use)
        if total > capacity.value.value:
            return False
    return True


def add_to(totals: dict[str, Fraction], amounts: Iterable[tuple[str, Fraction]], sign: int = 1) -> None:
    for name, value in amounts:
        totals[name] = totals.get(name, Fraction(0)) + sign * value
