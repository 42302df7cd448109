"""CEL timestamps and durations as cel-go has them (common/types/timestamp.go, duration.go,
overflow.go), with Go's `time` parsing and formatting rules (RFC 3339, ParseDuration).

A timestamp is an instant (Unix seconds and nanoseconds) plus the UTC offset it was written
with, which only its string form shows; getters without a time zone read it in UTC, as the
Kubernetes environment's cel-go does.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from decimal import Decimal
from functools import cache
from zoneinfo import ZoneInfo

from dradriver.offline.cel.errors import EvalError

NANOS = 1_000_000_000
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MIN_UNIX = -62135596800  # 0001-01-01T00:00:00Z
MAX_UNIX = 253402300799  # 9999-12-31T23:59:59Z
TIMESTAMP_TYPE = "google.protobuf.Timestamp"
DURATION_TYPE = "google.protobuf.Duration"


@dataclass(frozen=True, slots=True)
class Timestamp:
    seconds: int
    nanos: int = 0
    offset: int = 0

    def key(self) -> tuple[int, int]:
        """What Go's time.Time compares: its seconds since year 1, an int64 that wraps for Unix
        seconds within 62135596800 of int64's maximum (a Timestamp message literal's)."""
        seconds = self.seconds - MIN_UNIX
        return ((seconds - INT64_MIN) % 2**64 + INT64_MIN, self.nanos)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Timestamp) and self.key() == other.key()

    def __hash__(self) -> int:
        return hash(self.key())

    def __repr__(self) -> str:
        return f"timestamp({format_timestamp(Timestamp(self.seconds, self.nanos))!r})"


@dataclass(frozen=True, slots=True)
class Duration:
    nanos: int

    def __repr__(self) -> str:
        return f"duration({format_duration(self)!r})"


def _checked(value: int) -> int:
    if value < INT64_MIN or value > INT64_MAX:
        raise EvalError("integer overflow")
    return value


# -- parsing ---------------------------------------------------------------------------------------

# time.Parse(time.RFC3339, s): its fast path, and the general layout parser it falls back to
# (which also takes a one-digit hour and a comma before the fraction).
_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})T(\d{1,2}):(\d{2}):(\d{2})(?:[.,](\d+))?(?:(Z)|([+-])(\d{2}):(\d{2}))", re.ASCII
)
_TIMESTAMP_ERROR = f"type conversion error from 'string' to '{TIMESTAMP_TYPE}'"


def _is_leap(year: int) -> bool:
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def _days_in(month: int, year: int) -> int:
    if month == 2:
        return 29 if _is_leap(year) else 28
    return 30 if month in (4, 6, 9, 11) else 31


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 in the proleptic Gregorian calendar (year 0 included)."""
    year -= month <= 2
    era = year // 400
    year_of_era = year - era * 400
    day_of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146097 + day_of_era - 719468


def parse_timestamp(text: str) -> Timestamp:
    match = _RFC3339.fullmatch(text)
    if match is None:
        raise EvalError(_TIMESTAMP_ERROR)
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    if (
        not 1 <= month <= 12
        or not 1 <= day <= _days_in(month, year)
        or hour > 23
        or minute > 59
        or second > 59
    ):
        raise EvalError(_TIMESTAMP_ERROR)
    fraction = (match.group(7) or "")[:9]
    nanos = int(fraction.ljust(9, "0")) if fraction else 0
    offset = 0
    if match.group(8) is None:
        tz_hour, tz_minute = int(match.group(10)), int(match.group(11))
        if tz_hour > 23 or tz_minute > 59:
            raise EvalError(_TIMESTAMP_ERROR)
        offset = (tz_hour * 60 + tz_minute) * 60 * (-1 if match.group(9) == "-" else 1)
    seconds = _days_from_civil(year, month, day) * 86400 + hour * 3600 + minute * 60 + second - offset
    if seconds < MIN_UNIX or seconds > MAX_UNIX:
        raise EvalError("timestamp overflow")
    return Timestamp(seconds, nanos, offset)


def timestamp_from_int(seconds: int) -> Timestamp:
    if seconds < MIN_UNIX or seconds > MAX_UNIX:
        raise EvalError("timestamp overflow")
    return Timestamp(seconds)


_UNITS = {"ns": 1, "us": 10**3, "\u00b5s": 10**3, "\u03bcs": 10**3, "ms": 10**6, "s": NANOS}
_UNITS |= {"m": 60 * NANOS, "h": 3600 * NANOS}
_DURATION_ERROR = f"type conversion error from 'string' to '{DURATION_TYPE}'"


def parse_duration(text: str) -> Duration:
    """time.ParseDuration; cel-go reports every failure as one conversion error."""
    s = text
    negative = False
    if s and s[0] in "+-":
        negative, s = s[0] == "-", s[1:]
    if s == "0":
        return Duration(0)
    if not s:
        raise EvalError(_DURATION_ERROR)
    total = 0
    while s:
        value, s = _duration_term(s)
        total += value
        if total > 2**63:
            raise EvalError(_DURATION_ERROR)
    if negative:
        return Duration(-total)
    if total > INT64_MAX:
        raise EvalError(_DURATION_ERROR)
    return Duration(total)


def _duration_term(s: str) -> tuple[int, str]:
    """One `<number><unit>` of a duration: its nanoseconds and the text after it."""
    if not (s[0] == "." or "0" <= s[0] <= "9"):
        raise EvalError(_DURATION_ERROR)
    digits = re.match(r"[0-9]*", s, re.ASCII)
    assert digits is not None
    whole_text, s = digits.group(), s[digits.end() :]
    if whole_text and int(whole_text) >= 2**63:
        raise EvalError(_DURATION_ERROR)
    whole = int(whole_text or "0")
    fraction, scale = 0, 1
    has_fraction = False
    if s.startswith("."):
        frac = re.match(r"[0-9]*", s[1:], re.ASCII)
        assert frac is not None
        has_fraction = bool(frac.group())
        for ch in frac.group():  # leadingFraction: stops accumulating before overflow
            if fraction > (2**63 - 1) // 10:
                break
            fraction, scale = fraction * 10 + int(ch), scale * 10
        s = s[1 + frac.end() :]
    if not whole_text and not has_fraction:
        raise EvalError(_DURATION_ERROR)
    unit_match = re.match(r"[^0-9.]*", s)
    assert unit_match is not None
    unit_text, s = unit_match.group(), s[unit_match.end() :]
    unit = _UNITS.get(unit_text)
    if unit is None:
        raise EvalError(_DURATION_ERROR)
    if whole > 2**63 // unit:
        raise EvalError(_DURATION_ERROR)
    value = whole * unit
    if fraction > 0:
        value += int(float(fraction) * (float(unit) / scale))
        if value > 2**63:
            raise EvalError(_DURATION_ERROR)
    return value, s


# -- arithmetic (overflow.go) ------------------------------------------------------------------------


def add_duration(t: Timestamp, d: Duration) -> Timestamp:
    sec2, nsec2 = int(d.nanos / NANOS), d.nanos - int(d.nanos / NANOS) * NANOS  # Go truncates
    seconds = _checked(t.seconds + sec2)
    nanos = t.nanos + nsec2
    if nanos < 0 or nanos >= NANOS:
        carry = int(nanos / NANOS)
        seconds = _checked(seconds + carry)
        nanos -= carry * NANOS
        if nanos < 0:
            seconds = _checked(seconds - 1)
            nanos += NANOS
    if seconds < MIN_UNIX or seconds > MAX_UNIX:
        raise EvalError("timestamp overflow")
    return Timestamp(seconds, nanos, t.offset)


def subtract_timestamps(a: Timestamp, b: Timestamp) -> Duration:
    seconds = _checked(a.seconds - b.seconds)
    return Duration(_checked(_checked(seconds * NANOS) + a.nanos - b.nanos))


def negate_duration(d: Duration) -> Duration:
    return Duration(_checked(-d.nanos))


def add_durations(a: Duration, b: Duration) -> Duration:
    return Duration(_checked(a.nanos + b.nanos))


def subtract_durations(a: Duration, b: Duration) -> Duration:
    return Duration(_checked(a.nanos - b.nanos))


def sort_key(value: Timestamp | Duration) -> tuple[int, int]:
    return value.key() if isinstance(value, Timestamp) else (value.nanos, 0)


def compare(a: Timestamp | Duration, b: Timestamp | Duration) -> int:
    x, y = sort_key(a), sort_key(b)
    return (x > y) - (x < y)


# -- formatting and conversions ------------------------------------------------------------------------


def _fraction(nanos: int) -> str:
    return ("." + f"{nanos:09d}".rstrip("0")) if nanos else ""


def format_timestamp(t: Timestamp) -> str:
    """t.Format(time.RFC3339Nano), in the offset the timestamp was written with."""
    days, rest = divmod(t.seconds + t.offset, 86400)
    year, month, day = _civil_from_days(days)
    hour, minute, second = rest // 3600, rest // 60 % 60, rest % 60
    text = f"{year:04d}-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}"
    text += _fraction(t.nanos)
    if t.offset == 0:
        return text + "Z"
    sign = "+" if t.offset > 0 else "-"
    hours, minutes = divmod(abs(t.offset) // 60, 60)
    return f"{text}{sign}{hours:02d}:{minutes:02d}"


def _truncated(nanos: int, unit: int) -> tuple[int, int]:
    """Go's `d / unit` and `d % unit`: both truncate towards zero."""
    whole = abs(nanos) // unit * (1 if nanos >= 0 else -1)
    return whole, nanos - whole * unit


def format_duration(d: Duration) -> str:
    """strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s"."""
    seconds, nanos = _truncated(d.nanos, NANOS)
    value = float(seconds) + float(nanos) / 1e9
    text = format(Decimal(repr(value)), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text + "s"


# -- getters ---------------------------------------------------------------------------------------------


@cache
def _zone(name: str) -> dt.tzinfo:
    if name in ("", "UTC", "Local"):  # Kubernetes' control plane runs in UTC
        return dt.UTC
    try:
        return ZoneInfo(name)
    except (ValueError, OSError, KeyError):
        raise EvalError(f"unknown time zone {name}") from None


def _go_atoi(text: str) -> int:
    if not re.fullmatch(r"[+-]?[0-9]+", text, re.ASCII):
        raise EvalError(f'strconv.Atoi: parsing "{text}": invalid syntax')
    return int(text)


def _offset(t: Timestamp, tz: str | None) -> int:
    """Seconds east of UTC of the zone at this instant (none given: UTC)."""
    if tz is None:
        return 0
    colon = tz.find(":")
    if colon >= 0:
        hours, minutes = _go_atoi(tz[:colon]), _go_atoi(tz[colon + 1 :])
        return (hours * 60 - minutes if tz[0] == "-" else hours * 60 + minutes) * 60
    zone = _zone(tz)
    # Python's datetime stops at years 1 and 9999; the zone's rules do not change that far out.
    clamped = min(max(t.seconds, MIN_UNIX + 2 * 86400), MAX_UNIX - 2 * 86400)
    instant = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=clamped)
    offset = instant.astimezone(zone).utcoffset()
    return int(offset.total_seconds()) if offset is not None else 0


def _civil_from_days(days: int) -> tuple[int, int, int]:
    """The proleptic Gregorian date `days` after 1970-01-01 (the inverse of _days_from_civil)."""
    days += 719468
    era = days // 146097
    day_of_era = days - era * 146097
    year_of_era = (day_of_era - day_of_era // 1460 + day_of_era // 36524 - day_of_era // 146096) // 365
    day_of_year = day_of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    mp = (5 * day_of_year + 2) // 153
    day = day_of_year - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    return year_of_era + era * 400 + (month <= 2), month, day


def timestamp_part(t: Timestamp, part: str, tz: str | None = None) -> int:
    days, rest = divmod(t.seconds + _offset(t, tz), 86400)
    year, month, day = _civil_from_days(days)
    values = {
        "year": lambda: year,
        "month": lambda: month - 1,
        "day_of_year": lambda: days - _days_from_civil(year, 1, 1),
        "day_of_month": lambda: day - 1,
        "date": lambda: day,
        "day_of_week": lambda: (days + 4) % 7,  # 1970-01-01 was a Thursday
        "hours": lambda: rest // 3600,
        "minutes": lambda: rest // 60 % 60,
        "seconds": lambda: rest % 60,
        "milliseconds": lambda: t.nanos // 1_000_000,
    }
    return values[part]()


DURATION_PARTS = frozenset({"hours", "minutes", "seconds", "milliseconds"})


def duration_part(d: Duration, part: str) -> int:
    """Hours(), Minutes(), Seconds() truncated to int, and Milliseconds()."""
    units = {"hours": 3600 * NANOS, "minutes": 60 * NANOS, "seconds": NANOS, "milliseconds": 10**6}
    return _truncated(d.nanos, units[part])[0]
