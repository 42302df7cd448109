"""Quantities at the edges of what Kubernetes accepts: parsing costs work in proportion to the
text whatever the exponent, values are Kubernetes' (kubernetes#141203, #141306), and what would
need a huge number is refused instead of built."""

from __future__ import annotations

import pytest

from dradriver.quantity import MAX_DIGITS, Quantity, QuantityError, tenant_quantity


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1e-9999999", "0.000000001"),  # below a nano: rounds up to 1n without a divisor
        ("-1e-2147483647", "-0.000000001"),
        ("0e-2147483647", "0"),
        ("0." + "0" * 5000 + "1Ki", "0.000000001"),
        ("15e-10", "0.000000002"),
        ("1000000000000000000000e-30", "0.000000001"),
        ("1000000000000000000001e-30", "0.000000002"),
        ("1" + "0" * 5000, "1e5000"),  # trailing zeros are an exponent, not digits
        ("1e2147483647", "1e2147483647"),
        ("1e" + "0" * 50_000 + "5", "100000"),  # leading zeros of an exponent, as strconv reads them
    ],
)
def test_extreme_exponents_parse_to_kubernetes_values(text: str, value: str) -> None:
    assert str(Quantity.parse(text)) == value


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1e2147483648", "suffix"),  # beyond int32: refused, not truncated (kubernetes#141203)
        ("1e-2147483648", "suffix"),
        ("1e4294967297", "suffix"),
        ("1e1" + "0" * 50_000, "suffix"),  # no int() of 50,000 digits
        ("1" * (MAX_DIGITS + 1) + "e-5", "significant digits"),
    ],
)
def test_what_cannot_be_used_is_refused(text: str, message: str) -> None:
    with pytest.raises(QuantityError, match=message):
        Quantity.parse(text)


def test_values_far_apart_compare_without_a_common_exponent() -> None:
    huge, tiny = Quantity.parse("1e2147483647"), Quantity.parse("1e-2147483647")
    assert huge.compare(tiny) == 1
    assert tiny.compare(huge) == -1
    assert Quantity.parse("-1e2147483647").compare(tiny) == -1
    assert huge.compare(Quantity.parse("1e2147483646")) == 1
    assert huge.as_int64() is None
    assert huge.as_approximate_float() == float("inf")
    with pytest.raises(QuantityError, match="too large"):
        huge.exact()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1" * 65, "longer than 64 characters"),
        ("1e19", "must be within ±9223372036854775807"),
        ("-1e2147483647", "must be within"),
        ("1e-2147483648", "suffix"),
    ],
)
def test_tenant_quantities_are_bounded(text: str, message: str) -> None:
    with pytest.raises(QuantityError, match=message):
        tenant_quantity(text)


def test_binary_quantities_clamp_to_int64_as_in_kubernetes() -> None:
    assert str(tenant_quantity("9" * 30 + "Ei")) == "9223372036854775807"
