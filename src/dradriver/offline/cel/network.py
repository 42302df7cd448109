"""The Kubernetes IP and CIDR CEL libraries (k8s.io/apiserver pkg/cel/library ip.go, cidr.go).

Addresses are parsed the way Go's `net/netip` parses them (ParseAddr, ParsePrefix), with its
error messages, because the library reports them verbatim; Python's `ipaddress` accepts and
words things differently (leading zeros, scoped addresses), so it is not used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dradriver.offline.cel.errors import EvalError
from dradriver.offline.cel.values import OpaqueValue, expect, go_quote

STRING_TRAVERSAL_COST_FACTOR = 0.1


@dataclass(frozen=True, slots=True)
class IP(OpaqueValue):
    """A netip.Addr without zone: `bits` is 32 or 128 (IPv4-mapped IPv6 is refused)."""

    cel_type_name = "net.IP"

    bits: int
    value: int

    def __str__(self) -> str:
        if self.bits == 32:
            return ".".join(str((self.value >> shift) & 0xFF) for shift in (24, 16, 8, 0))
        groups = [(self.value >> (112 - 16 * i)) & 0xFFFF for i in range(8)]
        start, end = 255, 255
        for i in range(8):
            j = i
            while j < 8 and groups[j] == 0:
                j += 1
            if j - i >= 2 and j - i > end - start:
                start, end = i, j
        out: list[str] = []
        i = 0
        while i < 8:
            if i == start:
                out.append("::")
                i = end
                if i >= 8:
                    break
            elif i > 0:
                out.append(":")
            out.append(f"{groups[i]:x}")
            i += 1
        return "".join(out)

    def size(self) -> int:
        return self.bits // 8

    def masked(self, prefix: int) -> IP:
        keep = ((1 << prefix) - 1) << (self.bits - prefix)
        return IP(self.bits, self.value & keep)


@dataclass(frozen=True, slots=True)
class CIDR(OpaqueValue):
    """A netip.Prefix: the address as written (not masked) and the prefix length."""

    cel_type_name = "net.CIDR"

    addr: IP
    prefix: int

    def __str__(self) -> str:
        return f"{self.addr}/{self.prefix}"

    def size(self) -> int:
        return math.ceil(self.prefix / 8)

    def contains(self, ip: IP) -> bool:
        return ip.bits == self.addr.bits and ip.masked(self.prefix) == self.addr.masked(self.prefix)

    def overlaps(self, other: CIDR) -> bool:
        if self == other:
            return True
        if self.addr.bits != other.addr.bits:
            return False
        shortest = min(self.prefix, other.prefix)
        return self.addr.masked(shortest) == other.addr.masked(shortest)


class _ParseAddrError(Exception):
    def __init__(self, text: str, message: str, at: str = "") -> None:
        detail = f"ParseAddr({go_quote(text)}): {message}"
        super().__init__(detail + (f" (at {go_quote(at)})" if at else ""))


def _ipv4_fields(text: str, part: str) -> list[int]:
    fields: list[int] = []
    value = digits = 0
    for i, ch in enumerate(part):
        if "0" <= ch <= "9":
            if digits == 1 and value == 0:
                raise _ParseAddrError(text, "IPv4 field has octet with leading zero")
            value = value * 10 + ord(ch) - 48
            digits += 1
            if value > 255:
                raise _ParseAddrError(text, "IPv4 field has value >255")
        elif ch == ".":
            if i == 0 or i == len(part) - 1 or part[i - 1] == ".":
                raise _ParseAddrError(text, "IPv4 field must have at least one digit", part[i:])
            if len(fields) == 3:
                raise _ParseAddrError(text, "IPv4 address too long")
            fields.append(value)
            value = digits = 0
        else:
            raise _ParseAddrError(text, "unexpected character", part[i:])
    if len(fields) < 3:
        raise _ParseAddrError(text, "IPv4 address too short")
    fields.append(value)
    return fields


_HEX = {c: int(c, 16) for c in "0123456789abcdefABCDEF"}


def _parse_ipv6(text: str) -> tuple[IP, str]:
    s, zone = text, ""
    if "%" in s:
        s, zone = s.split("%", 1)
        if not zone:
            raise _ParseAddrError(text, "zone must be a non-empty string")
    groups: list[int] = []  # 16-bit groups
    ellipsis = -1
    if s.startswith("::"):
        ellipsis = 0
        s = s[2:]
        if not s:
            return IP(128, 0), zone
    while len(groups) < 8:
        acc, off = _hex_field(text, s)
        if off < len(s) and s[off] == ".":
            if ellipsis < 0 and len(groups) != 6:
                raise _ParseAddrError(
                    text, "embedded IPv4 address must replace the final 2 fields of the address", s
                )
            if len(groups) + 2 > 8:
                raise _ParseAddrError(
                    text, "too many hex fields to fit an embedded IPv4 at the end of the address", s
                )
            a, b, c, d = _ipv4_fields(text, s)
            groups += [a << 8 | b, c << 8 | d]
            s = ""
            break
        groups.append(acc)
        s = s[off:]
        if not s:
            break
        if s[0] != ":":
            raise _ParseAddrError(text, "unexpected character, want colon", s)
        if len(s) == 1:
            raise _ParseAddrError(text, "colon must be followed by more characters", s)
        s = s[1:]
        if s[0] == ":":
            if ellipsis >= 0:
                raise _ParseAddrError(text, "multiple :: in address", s)
            ellipsis = len(groups)
            s = s[1:]
            if not s:
                break
    if s:
        raise _ParseAddrError(text, "trailing garbage after address", s)
    return _ipv6_value(text, groups, ellipsis), zone


def _hex_field(text: str, s: str) -> tuple[int, int]:
    """The hex field at the start of `s`: its value and its length (at least one digit)."""
    off = acc = 0
    while off < len(s) and s[off] in _HEX:
        acc = (acc << 4) + _HEX[s[off]]
        if off > 3:
            raise _ParseAddrError(text, "each group must have 4 or less digits", s)
        if acc > 0xFFFF:
            raise _ParseAddrError(text, "IPv6 field has value >=2^16", s)
        off += 1
    if off == 0:
        raise _ParseAddrError(text, "each colon-separated field must have at least one digit", s)
    return acc, off


def _ipv6_value(text: str, groups: list[int], ellipsis: int) -> IP:
    """The address of its groups, the `::` (at index `ellipsis`, or -1) expanded to zeros."""
    if len(groups) < 8:
        if ellipsis < 0:
            raise _ParseAddrError(text, "address string too short")
        groups = groups[:ellipsis] + [0] * (8 - len(groups)) + groups[ellipsis:]
    elif ellipsis >= 0:
        raise _ParseAddrError(text, "the :: must expand to at least one field of zeros")
    value = 0
    for group in groups:
        value = value << 16 | group
    return IP(128, value)


def _parse_addr(text: str) -> tuple[IP, str]:
    """netip.ParseAddr: the address and its zone; _ParseAddrError with Go's message."""
    for ch in text:
        if ch == ".":
            a, b, c, d = _ipv4_fields(text, text)
            return IP(32, a << 24 | b << 16 | c << 8 | d), ""
        if ch == ":":
            return _parse_ipv6(text)
        if ch == "%":
            raise _ParseAddrError(text, "missing IPv6 address")
    raise _ParseAddrError(text, "unable to parse IP")


def parse_ip_literal(hostname: str) -> None:
    """net/url parseHost: only an IPv6 address (a zone allowed) may sit inside brackets."""
    try:
        ip, _ = _parse_addr(hostname)
    except _ParseAddrError as err:
        raise ValueError(f"invalid host: {err}") from None
    if ip.bits == 32:
        raise ValueError("invalid IP-literal")


def _is_4in6(ip: IP) -> bool:
    return ip.bits == 128 and ip.value >> 32 == 0xFFFF


def parse_ip(text: str) -> IP:
    """library.parseIPAddr."""
    try:
        ip, zone = _parse_addr(text)
    except _ParseAddrError as err:
        quoted = go_quote(text)
        raise EvalError(f"IP Address {quoted} parse error during conversion from string: {err}") from None
    if zone:
        raise EvalError(f"IP address {go_quote(text)} with zone value is not allowed")
    if _is_4in6(ip):
        raise EvalError(f"IPv4-mapped IPv6 address {go_quote(text)} is not allowed")
    return ip


def _parse_prefix(text: str) -> CIDR:
    """netip.ParsePrefix, raising its message."""
    quoted = go_quote(text)
    slash = text.rfind("/")
    if slash < 0:
        raise ValueError(f"netip.ParsePrefix({quoted}): no '/'")
    try:
        ip, zone = _parse_addr(text[:slash])
    except _ParseAddrError as err:
        raise ValueError(f"netip.ParsePrefix({quoted}): {err}") from None
    if ip.bits == 128 and zone:
        raise ValueError(f"netip.ParsePrefix({quoted}): IPv6 zones cannot be present in a prefix")
    bits_text = text[slash + 1 :]
    bad = f"netip.ParsePrefix({quoted}): bad bits after slash: {go_quote(bits_text)}"
    # strconv.Atoi after a check that refuses signs and leading zeros; Atoi's range is int64.
    if len(bits_text) > 1 and not "1" <= bits_text[0] <= "9":
        raise ValueError(bad)
    if not bits_text or not all("0" <= ch <= "9" for ch in bits_text) or int(bits_text) >= 2**63:
        raise ValueError(bad)
    bits = int(bits_text)
    if bits > ip.bits:
        raise ValueError(f"netip.ParsePrefix({quoted}): prefix length out of range")
    return CIDR(ip, bits)


def parse_cidr(text: str) -> CIDR:
    """library.stringToCIDR (whose message repeats parseCIDR's prefix, as Kubernetes does)."""
    prefix = "network address parse error during conversion from string: "
    try:
        cidr = _parse_prefix(text)
    except ValueError as err:
        raise EvalError(prefix + prefix + str(err)) from None
    if _is_4in6(cidr.addr):
        raise EvalError(prefix + f"IPv4-mapped IPv6 address {go_quote(text)} is not allowed")
    return cidr


# -- the library functions ----------------------------------------------------------------------


def ip(value: Any) -> IP:
    """`ip(string)` and the member `cidr.ip()`."""
    if type(value) is CIDR:
        return value.addr
    return parse_ip(expect(value, str))


def is_ip(value: Any) -> bool:
    text = expect(value, str)
    try:
        parse_ip(text)
    except EvalError:
        return False
    return True


def ip_is_canonical(value: Any) -> bool:
    text = expect(value, str)
    return str(parse_ip(text)) == text


def family(value: Any) -> int:
    return 4 if expect(value, IP).bits == 32 else 6


def is_unspecified(value: Any) -> bool:
    return expect(value, IP).value == 0


def is_loopback(value: Any) -> bool:
    addr = expect(value, IP)
    return addr.value >> 24 == 127 if addr.bits == 32 else addr.value == 1


def _is_multicast(addr: IP) -> bool:
    return addr.value >> 28 == 0xE if addr.bits == 32 else addr.value >> 120 == 0xFF


def _is_link_local_unicast(addr: IP) -> bool:
    return addr.value >> 16 == 0xA9FE if addr.bits == 32 else addr.value >> 118 == 0xFE80 >> 6


def is_link_local_multicast(value: Any) -> bool:
    addr = expect(value, IP)
    if addr.bits == 32:
        return addr.value >> 8 == 0xE00000
    return (addr.value >> 112) & 0xFF0F == 0xFF02


def is_link_local_unicast(value: Any) -> bool:
    return _is_link_local_unicast(expect(value, IP))


def is_global_unicast(value: Any) -> bool:
    addr = expect(value, IP)
    if addr.bits == 32 and addr.value in (0, 0xFFFFFFFF):
        return False
    return not (
        (addr.bits == 128 and addr.value == 0)
        or is_loopback(addr)
        or _is_multicast(addr)
        or _is_link_local_unicast(addr)
    )


def cidr(value: Any) -> CIDR:
    return parse_cidr(expect(value, str))


def is_cidr(value: Any) -> bool:
    text = expect(value, str)
    try:
        parse_cidr(text)
    except EvalError:
        return False
    return True


def contains_ip(network: Any, other: Any) -> bool:
    # cidrContainsIPString passes a failed parse on as an argument of the wrong type, which
    # cidrContainsIP reports as "no such overload", not as the parse error.
    if type(other) is str:
        try:
            other = parse_ip(other)
        except EvalError:
            raise EvalError("no such overload") from None
    return expect(network, CIDR).contains(expect(other, IP))


def contains_cidr(network: Any, other: Any) -> bool:
    if type(other) is str:
        other = parse_cidr(other)
    outer, inner = expect(network, CIDR), expect(other, CIDR)
    return outer.overlaps(inner) and outer.prefix <= inner.prefix


def prefix_length(value: Any) -> int:
    return expect(value, CIDR).prefix


def masked(value: Any) -> CIDR:
    network = expect(value, CIDR)
    return CIDR(network.addr.masked(network.prefix), network.prefix)


# -- runtime costs (library CostEstimator.CallCost) --------------------------------------------


def _size(value: Any) -> int:
    """cel-go actualSize: the Sizer's size (IP: address bytes, CIDR: prefix bytes), else 1."""
    if isinstance(value, IP | CIDR):
        return value.size()
    if isinstance(value, str):
        return len(value.encode())
    return 1


def _traversal(value: Any, factor: float = STRING_TRAVERSAL_COST_FACTOR) -> int:
    return math.ceil(_size(value) * factor)


def ip_cost(args: Any) -> int:
    return 1 if type(args[0]) is CIDR else _traversal(args[0])


def contains_cost(args: Any, *, of_cidr: bool, parse: bool = True) -> int:
    """`parse`: the call's overload id is the `_string` one, whose argument is parsed (and sized
    as 1 when it is an error)."""
    network = _size(args[0])
    cost = math.ceil(2 * network * STRING_TRAVERSAL_COST_FACTOR)
    if of_cidr:
        cost += math.ceil(network * STRING_TRAVERSAL_COST_FACTOR) + 1
    if parse:
        cost += _traversal(args[1])
    return cost
