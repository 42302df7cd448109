"""Kubernetes resource quantities with `k8s.io/apimachinery/pkg/api/resource` semantics.

One implementation serves the CEL `kubernetes.Quantity` type, ResourceSlice validation and opaque
config checks, so that all three accept exactly what the API server accepts.

A Go Quantity keeps its value either as a scaled int64 (`int64Amount{value, scale}`) or, when
that cannot represent it exactly, as an arbitrary-precision decimal (`inf.Dec`). The split is
visible from CEL: `asInteger()`/`isInteger()` only succeed on the int64 form with a
non-negative scale, so `quantity("1000m").isInteger()` is false and so is
`quantity("1.5Gi").isInteger()`. We keep the same representation, ported from
`quantity.go` (ParseQuantity, Add, Sub, Cmp, AsInt64, AsApproximateFloat64) and `amount.go`.

Parsing is bounded, as the Go code is not (kubernetes#141166): a quantity costs work in
proportion to its length, whatever its exponent. A value below one nano rounds up to `1n`
without building the divisor (kubernetes#141306), a value too large for a float keeps its
exponent instead of being scaled to nanos, and comparisons look at magnitudes first. Three
deviations keep it so: an exponent beyond int32 is refused (Kubernetes 1.36 truncates it, newer
releases refuse it: kubernetes#141203), so is a mantissa of more than MAX_DIGITS significant
digits, and `exact()` refuses values of more than about a thousand digits.
"""

from __future__ import annotations

import math
from fractions import Fraction

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_NANO = -9
_MAX_INT64_FACTORS = 18
# The largest value a BinarySI quantity is clamped to (maxAllowed in quantity.go).
_MAX_ALLOWED = _INT64_MAX
_MAX_INT32 = 2**31 - 1
#: Significant digits a mantissa may have (Python's int() refuses more than 4,300).
MAX_DIGITS = 1000
# A value more than this many digits above a nano keeps its exponent rather than being scaled to
# nanos: Go's AsApproximateFloat64 is infinite for it either way.
_COMPACT_ABOVE = 330
# Ei (2**60) has fewer than 19 decimal digits.
_BINARY_DIGITS = 19
#: Quantities a tenant writes (opaque configs, claims) longer than this are refused unparsed.
MAX_TENANT_LENGTH = 64

ERR_FORMAT_WRONG = (
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)
ERR_NUMERIC = "unable to parse numeric part of quantity"
ERR_SUFFIX = "unable to parse quantity's suffix"
ERR_DIGITS = f"more than {MAX_DIGITS} significant digits"
ERR_TOO_LARGE = f"too large to use (more than {MAX_DIGITS + _COMPACT_ABOVE} digits)"

_DECIMAL_SI = "DecimalSI"
_BINARY_SI = "BinarySI"
_DECIMAL_EXPONENT = "DecimalExponent"

_DEC_SUFFIXES = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BIN_SUFFIXES = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
# Go's suffixer has no suffix for other (base, exponent) pairs and then prints none.
_SUFFIX_OF = {
    **{(10, exponent): suffix for suffix, exponent in _DEC_SUFFIXES.items()},
    **{(2, exponent): suffix for suffix, exponent in _BIN_SUFFIXES.items()},
}
_SUFFIX_CHARS = frozenset("eEinumkKMGTP")
_DIGITS = frozenset("0123456789")
_LOG10_2 = math.log10(2)


class QuantityError(ValueError):
    """A string that resource.ParseQuantity rejects."""


def _fits_int64(value: int) -> bool:
    return _INT64_MIN <= value <= _INT64_MAX


def _split(text: str) -> tuple[bool, str, str, str, str]:
    """parseQuantityString: sign, numeric text, integer digits, fraction digits, suffix."""
    positive = True
    pos = 0
    end = len(text)
    if pos < end and text[0] in "+-":
        positive = text[0] == "+"
        pos += 1
    while pos < end and text[pos] == "0":
        pos += 1
    if pos >= end:
        return positive, "0", "0", "", ""
    start = pos
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    num = text[start:pos] or "0"
    if pos >= end:
        return positive, text, num, "", ""
    denom = ""
    if text[pos] == ".":
        pos += 1
        start = pos
        while pos < end and text[pos] in _DIGITS:
            pos += 1
        denom = text[start:pos]
        if pos >= end:
            return positive, text, num, denom, ""
    value = text[:pos]
    suffix_start = pos
    while pos < end and text[pos] in _SUFFIX_CHARS:
        pos += 1
    if pos < end and text[pos] in "+-":
        pos += 1
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    if pos < end:
        raise QuantityError(ERR_FORMAT_WRONG)
    return positive, value, num, denom, text[suffix_start:]


def _interpret_suffix(suffix: str) -> tuple[int, int, str]:
    if suffix in _DEC_SUFFIXES:
        return 10, _DEC_SUFFIXES[suffix], _DECIMAL_SI
    if suffix in _BIN_SUFFIXES:
        return 2, _BIN_SUFFIXES[suffix], _BINARY_SI
    if len(suffix) > 1 and suffix[0] in "eE":
        exponent_text = suffix[1:]
        body = exponent_text[1:] if exponent_text[0] in "+-" else exponent_text
        # Ten digits hold any int32: longer ones are out of range without converting them.
        significant = body.lstrip("0")
        if body and all(ch in _DIGITS for ch in body) and len(significant) <= 10:
            exponent = -int(significant or "0") if exponent_text[0] == "-" else int(significant or "0")
            if -_MAX_INT32 <= exponent <= _MAX_INT32:
                return 10, exponent, _DECIMAL_EXPONENT
    raise QuantityError(ERR_SUFFIX)


def _parse_decimal(text: str) -> tuple[bool, str, int]:
    """inf.Dec.SetString for the numeric part, left as text: (negative, significant digits,
    exponent) with value = digits * 10**exponent; no digits for zero."""
    negative = text[:1] == "-"
    text = text.removeprefix("-").removeprefix("+")
    whole, dot, fraction = text.partition(".")
    digits = whole + fraction
    if not digits or not all(ch in _DIGITS for ch in digits) or (dot and not fraction and not whole):
        raise QuantityError(ERR_NUMERIC)
    significant = digits.strip("0")
    trailing_zeros = len(digits.lstrip("0")) - len(significant)
    return negative, significant, trailing_zeros - len(fraction)


def _ceil_to_nano(unscaled: int, exponent: int) -> tuple[int, int]:
    """inf.Dec.Round(x, 9, RoundUp) of a positive value: scale 9, except for a value more than
    _COMPACT_ABOVE digits above a nano (a multiple of a nano already), which keeps its exponent."""
    shift = exponent - _NANO
    if shift > _COMPACT_ABOVE:
        return unscaled, exponent
    if shift >= 0:
        return unscaled * 10**shift, _NANO
    return -(-unscaled // 10**-shift), _NANO


class Quantity:
    """An immutable resource quantity. Compare with `compare`; arithmetic returns new values."""

    __slots__ = ("_dec", "_exp", "_format", "_text", "_unscaled")

    def __init__(self, unscaled: int, exponent: int, *, dec: bool, fmt: str, text: str | None = None) -> None:
        # value = unscaled * 10**exponent; `dec` marks Go's inf.Dec representation; `fmt` is the
        # Format the quantity prints in (the one it was parsed with); `text` the string Go keeps
        # as the printed form when the parsed one looked canonical.
        self._unscaled = unscaled
        self._exp = exponent
        self._dec = dec
        self._format = fmt
        self._text = text

    @classmethod
    def parse(cls, text: str) -> Quantity:
        """resource.ParseQuantity."""
        if not text:
            raise QuantityError(ERR_FORMAT_WRONG)
        if text == "0":
            return cls(0, 0, dec=False, fmt=_DECIMAL_SI, text=text)
        positive, value, num, denom, suffix = _split(text)
        base, exponent, fmt = _interpret_suffix(suffix)
        precision = 0
        scale = 0
        mantissa = 1
        if fmt in (_DECIMAL_EXPONENT, _DECIMAL_SI):
            scale = exponent
            precision = _MAX_INT64_FACTORS - (len(num) + len(denom))
        elif exponent >= 0 and not denom:
            mantissa = 1 << exponent
            precision = 15 - len(num) - int(exponent * 3 / 10) - 1
        else:
            precision = -1
        if precision >= 0:
            scale -= len(denom)
            if scale >= _NANO:
                digits = num + denom
                shifted = int(digits)
                result = shifted * mantissa
                if _fits_int64(result) and _fits_int64(shifted):
                    # ParseQuantity reuses the string as is when it looks canonical (`+1Ki`, `1E3`).
                    if fmt == _BINARY_SI:
                        kept = shifted & 7 != 0
                    else:
                        kept = scale % 3 == 0 and not digits.endswith("000") and digits[0] != "0"
                    return cls(
                        result if positive else -result,
                        scale,
                        dec=False,
                        fmt=fmt,
                        text=text if kept else None,
                    )
        return cls._parse_big(value, base, exponent, fmt)

    @classmethod
    def _parse_big(cls, value: str, base: int, exponent: int, fmt: str) -> Quantity:
        negative, digits, exp = _parse_decimal(value)
        if not digits:
            return cls(0, 0, dec=True, fmt=fmt)
        if base == 10:
            exp += exponent
        # digits * 10**exp < 10**(len(digits) + exp): below a nano, even times 2**60 for base 2.
        if len(digits) + exp <= _NANO - (0 if base == 10 else _BINARY_DIGITS):
            unscaled, exp = 1, _NANO
        elif len(digits) > MAX_DIGITS:
            raise QuantityError(ERR_DIGITS)
        else:
            unscaled = int(digits) << (0 if base == 10 else exponent)
            unscaled, exp = _ceil_to_nano(unscaled, exp)
        if fmt == _BINARY_SI and _compare_exact(unscaled, exp, _MAX_ALLOWED, 0) > 0:
            unscaled, exp = _MAX_ALLOWED, 0
        if fmt == _BINARY_SI and unscaled and _compare_exact(unscaled, exp, 1, 0) < 0:
            fmt = _DECIMAL_SI  # a binary fraction below 1 (`0.5Ki`) is decimal
        return cls(-unscaled if negative else unscaled, exp, dec=True, fmt=fmt)

    @classmethod
    def in_nanos(cls, value: Fraction, *, binary: bool = False, exponent: bool = False) -> Quantity:
        """`value` rounded up to whole nano units (the finest Kubernetes keeps), printing in
        BinarySI, DecimalExponent or else DecimalSI."""
        fmt = _BINARY_SI if binary else _DECIMAL_EXPONENT if exponent else _DECIMAL_SI
        nanos = value * 10**-_NANO
        return cls(-(-nanos.numerator // nanos.denominator), _NANO, dec=True, fmt=fmt)

    @classmethod
    def from_int(cls, value: int) -> Quantity:
        """resource.NewQuantity(value, DecimalExponent)."""
        return cls(value, 0, dec=False, fmt=_DECIMAL_EXPONENT)

    # -- comparisons -----------------------------------------------------------------------

    def compare(self, other: Quantity) -> int:
        return _compare_exact(self._unscaled, self._exp, other._unscaled, other._exp)

    def within(self, limit: int) -> bool:
        """Whether -limit <= value <= limit, decided without building a large number."""
        return _compare_exact(abs(self._unscaled), self._exp, limit, 0) <= 0

    def sign(self) -> int:
        return (self._unscaled > 0) - (self._unscaled < 0)

    # -- arithmetic (Quantity.Add / Quantity.Sub) --------------------------------------------

    def add(self, other: Quantity) -> Quantity:
        return self._add(other, other._unscaled)

    def sub(self, other: Quantity) -> Quantity:
        return self._add(other, -other._unscaled)

    def _add(self, other: Quantity, unscaled: int) -> Quantity:
        """int64Amount.Add while both are int64 and the sum fits, else inf.Dec.Add (exact, with
        the smaller exponent). A zero quantity takes the other operand's format."""
        fmt = other._format if self._unscaled == 0 else self._format
        if not self._dec and not other._dec:
            summed = _int64_amount_add(self._unscaled, self._exp, unscaled, other._exp)
            if summed is not None:
                return Quantity(summed[0], summed[1], dec=False, fmt=fmt)
        low = min(self._exp, other._exp)
        total = self._unscaled * 10 ** (self._exp - low) + unscaled * 10 ** (other._exp - low)
        return Quantity(total, low, dec=True, fmt=fmt)

    # -- conversions -------------------------------------------------------------------------

    def as_int64(self) -> int | None:
        """Quantity.AsInt64: the value if the int64 form holds it exactly with scale >= 0."""
        if self._dec:
            return None
        if self._exp == 0 or not self._unscaled:
            return self._unscaled if self._exp >= 0 else None
        if not 0 < self._exp <= _MAX_INT64_FACTORS:
            return None
        value = self._unscaled * 10**self._exp
        return value if _fits_int64(value) else None

    def exact(self) -> Fraction:
        """The exact value, for arithmetic the Go type does not offer (steps, modulo); QuantityError
        for a value too large to build."""
        if self._unscaled and self._exp > _COMPACT_ABOVE:
            raise QuantityError(ERR_TOO_LARGE)
        return Fraction(self._unscaled) * Fraction(10) ** self._exp

    def as_approximate_float(self) -> float:
        """Quantity.AsApproximateFloat64: float(unscaled) * 10**exponent."""
        try:
            base = float(self._unscaled)
        except OverflowError:  # big.Float.Float64 gives an infinity
            base = math.copysign(math.inf, self._unscaled)
        if self._exp == 0:
            return base
        return base * _pow10(self._exp)

    def canonical(self) -> str:
        """Quantity.String(): CanonicalizeBytes in the quantity's format (`1k` for `1000`)."""
        if self._text is not None:
            return self._text
        if not self._unscaled:
            return "0"
        fmt = self._format
        if fmt == _BINARY_SI and (abs(self.exact()) < 1024 or self.exact().denominator != 1):
            fmt = _DECIMAL_SI  # small or fractional binary quantities print in decimal
        if fmt == _BINARY_SI:
            number, power = int(self.exact()), 0
            while abs(number) >= 1024 and number % 1024 == 0:
                number, power = number // 1024, power + 10
            return f"{number}{_SUFFIX_OF.get((2, power), '')}"
        # AsCanonicalBytes: the factors of ten moved into an exponent that is a multiple of three.
        number, exponent = self._unscaled, self._exp
        while number % 10 == 0:
            number, exponent = number // 10, exponent + 1
        number, exponent = number * 10 ** (exponent % 3), exponent - exponent % 3
        if fmt == _DECIMAL_EXPONENT:
            return f"{number}e{exponent}" if exponent else str(number)
        return f"{number}{_SUFFIX_OF.get((10, exponent), '')}"

    def __str__(self) -> str:
        if self._unscaled and self._exp > _COMPACT_ABOVE:
            return f"{self._unscaled}e{self._exp}"
        value = self._unscaled * 10**self._exp if self._exp >= 0 else None
        if value is not None:
            return str(value)
        digits = str(abs(self._unscaled)).rjust(-self._exp + 1, "0")
        whole, fraction = digits[: self._exp], digits[self._exp :].rstrip("0")
        text = f"{whole}.{fraction}" if fraction else whole
        return ("-" if self._unscaled < 0 else "") + text

    def __repr__(self) -> str:
        return f"quantity({str(self)!r})"


def _pow10(exponent: int) -> float:
    """Go's math.Pow10: exact table values, 0 below 1e-323 and +Inf above 1e308."""
    if exponent < -323:
        return 0.0
    if exponent > 308:
        return math.inf
    return float(10**exponent) if exponent >= 0 else 1.0 / float(10**-exponent)


def _compare_exact(a: int, a_exp: int, b: int, b_exp: int) -> int:
    sign_a, sign_b = (a > 0) - (a < 0), (b > 0) - (b < 0)
    if sign_a != sign_b or not sign_a:
        return (sign_a > sign_b) - (sign_a < sign_b)
    # Same sign: digits of magnitude first (bit_length * log10(2) is within one digit of it),
    # so that values far apart never scale to a common exponent.
    gap = (a_exp + abs(a).bit_length() * _LOG10_2) - (b_exp + abs(b).bit_length() * _LOG10_2)
    if abs(gap) > 2:
        return sign_a if gap > 0 else -sign_a
    low = min(a_exp, b_exp)
    left = a * _ten_to(a_exp - low)
    right = b * _ten_to(b_exp - low)
    return (left > right) - (left < right)


def _ten_to(exponent: int) -> int:
    """10**exponent for exponent >= 0, typed as an int."""
    return int(10**exponent)


def _int64_amount_add(a: int, a_scale: int, b: int, b_scale: int) -> tuple[int, int] | None:
    """int64Amount.Add: the sum in int64 form, or None when it would overflow."""
    if b == 0:
        return a, a_scale
    if a == 0:
        return b, b_scale
    if a_scale == b_scale:
        total, scale = a + b, a_scale
    elif a_scale > b_scale:
        scaled = a * 10 ** (a_scale - b_scale)
        if not _fits_int64(scaled):
            return None
        total, scale = scaled + b, b_scale
    else:
        scaled = b * 10 ** (b_scale - a_scale)
        if not _fits_int64(scaled):
            return None
        total, scale = a + scaled, a_scale
    return (total, scale) if _fits_int64(total) else None


def tenant_quantity(text: str, maximum: int = _INT64_MAX) -> Quantity:
    """A quantity a tenant wrote (opaque config, claim): at most MAX_TENANT_LENGTH characters,
    accepted by Kubernetes, at most `maximum` either side of zero (int64: what any amount here
    fits). QuantityError otherwise; all of it checked before any arithmetic."""
    if len(text) > MAX_TENANT_LENGTH:
        raise QuantityError(f"longer than {MAX_TENANT_LENGTH} characters")
    quantity = Quantity.parse(text)
    if not quantity.within(maximum):
        raise QuantityError(f"must be within ±{maximum}")
    return quantity


def quantity_error(value: object) -> str | None:
    """None for a valid quantity string; else the API server's message (also for non-strings,
    which our JSON must never contain: quantities are always written as strings)."""
    if not isinstance(value, str):
        return f'must be a quantity string like "80Gi", not {type(value).__name__}'
    try:
        Quantity.parse(value)
    except QuantityError as err:
        return str(err)
    return None


def parse_quantity(value: str) -> Fraction | None:
    """The exact value of a quantity string, or None if it is not one."""
    try:
        return Quantity.parse(value).exact()
    except QuantityError:
        return None
