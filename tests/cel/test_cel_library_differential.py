"""Edge cases of the IP/CIDR, URL, optional, time and format libraries against dra-oracle.

The generated selectors (test_cel_differential.py) reach these libraries with a few typical
values; here every library's parsing and formatting corners are crossed systematically (Go's
netip and net/url rules, RFC 3339 and ParseDuration, every format clause on every type) and
each expression goes through the same comparison: outcome, messages, actual and estimated cost,
and the API server's verdict.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.cel.test_cel_differential import check
from tests.oracle import Oracle


def _q(text: str) -> str:
    return json.dumps(text)


def _ip_cases() -> Iterator[str]:
    addresses = ["1.2.3.4", "01.2.3.4", "0.0.0.0", "256.1.1.1", "1.2.3.4.5", "1..2.3", "1.2.3.", "1.2.3"]
    addresses += ["1.2.3.4:80", "::", "::1", "1::", "1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7:8:9", "1::2::3"]
    addresses += ["::ffff:1.2.3.4", "::1.2.3.4", "1:2:3:4:5:6:1.2.3.4", "12345::1", "g::1", "fe80::1%eth0"]
    addresses += ["%eth0", "2001:DB8::1", "2001:db8:0:0:1:0:0:1", "0:0:1:0:0:1:0:0", "1:", "abc", ""]
    addresses += ["224.0.0.1", "ff02::1", "169.254.1.1", "fe80::", "127.0.0.1", "fc00::1"]
    for text in addresses:
        yield f"string(ip({_q(text)})) == ''"
        yield f"isIP({_q(text)}) || ip.isCanonical({_q(text)})"
        for member in ("isLoopback", "isUnspecified", "isGlobalUnicast", "isLinkLocalUnicast"):
            yield f"ip({_q(text)}).{member}() || ip({_q(text)}).family() == 4"
        yield f"ip({_q(text)}).isLinkLocalMulticast()"
    networks = ["10.0.0.0/8", "10.0.0.1/8", "10.0.0.1/33", "10.0.0.1/-1", "10.0.0.1/01", "::/0", "::1/129"]
    networks += [
        "fe80::1%eth0/64",
        "10.0.0.1",
        "10.0.0.1/",
        "::ffff:1.2.3.4/120",
        "10.0.0.1/99999999999999999999",
    ]
    for text in networks:
        yield f"string(cidr({_q(text)}).masked()) == '' || isCIDR({_q(text)})"
        yield f"cidr({_q(text)}).prefixLength() == 8 && string(cidr({_q(text)}).ip()) != ''"
        for other in ("10.1.2.3", "::1", "x"):
            yield f"cidr({_q(text)}).containsIP({_q(other)}) || cidr({_q(text)}).containsIP(ip({_q(other)}))"
        for other in ("10.1.0.0/16", "0.0.0.0/0", "::/0", "x", "10.0.0.0/7"):
            yield f"cidr({_q(text)}).containsCIDR({_q(other)})"


def _url_cases() -> Iterator[str]:
    urls = ["https://example.com:8443/a/b?x=1", "http://[::1]:80/", "/relative", "not a url", "", "*"]
    urls += ["ftp://h/p%20q", "http://", "http:a/b", "mailto:x@y.com", "1http://x", ":x", "//host/path"]
    urls += ["https://a/b#fr%20ag", "https://a/b#%zz", "https://u:p@h/", "https://u p@h/", "https://h:port/"]
    urls += ["https://h:80:80/", "http://::1/", "https://[::1/", "https://[10.0.0.1]/", "https://[zz]/"]
    urls += [
        "https://[fe80::1%25en0]:8080/",
        "https://h%41/",
        "https://hé.com/",
        "https://h/%2",
        "https://h/a b",
    ]
    urls += [
        "https://h/?a=1;b=2&c=%zz&d=+",
        "https://h/?",
        "HTTPS://H/",
        "http://a/%7e",
        "https://h/%e2%82%ac",
    ]
    for text in urls:
        yield f"isURL({_q(text)})"
        for getter in ("getScheme", "getHost", "getHostname", "getPort", "getEscapedPath"):
            yield f"url({_q(text)}).{getter}() == ''"
        yield f"url({_q(text)}).getQuery().size() == 1"
        yield f"url({_q(text)}) == url({_q(urls[0])})"


def _optional_cases() -> Iterator[str]:
    attrs = 'device.attributes["gpu.dradriver.dev"]'
    yield from (
        f"{attrs}.?productName.hasValue() && !{attrs}.?nosuch.hasValue()",
        f'{attrs}[?"uuid"].orValue("x") != "x"',
        f"{attrs}.?minor.optMap(m, m + 1).orValue(0) >= 0",
        "device.attributes.?x.orValue({}).size() == 0",
        "device.?driver.hasValue()",
        "has(device.attributes.?x)",
        "device.attributes.?",
        "[?1]",
        "[?optional.of(1), ?optional.none()] == [1]",
        '{?"a": optional.none(), "b": 2} == {"b": 2}',
        '{"a": {"b": 2}}.?a.b.value() == 2',
        "[1, 2, 3][?5].hasValue() || [1, 2, 3][?-1].hasValue()",
        "optional.of([1])[3].hasValue()",
        "optional.of(1) == optional.of(1.0) && optional.none() != optional.of(1)",
        "dyn(optional.of(1)) == 1",
        "optional.none().value() == 1",
        "optional.none().orValue(1 / 0) == 1",
        "optional.of(1).orValue(1 / 0) == 1",
        'optional.ofNonZeroValue("").hasValue() || optional.ofNonZeroValue(duration("0s")).hasValue()',
        "optional.unwrap([dyn(1)]) == []",
        "[optional.none(), optional.of(2)].unwrapOpt() == [2] && [].last() == optional.none()",
        "optional.of(1).optMap(1, 2).value() == 2",
        "type(optional.none()) == optional_type",
    )


def _time_cases() -> Iterator[str]:
    stamps = ["2024-05-01T10:00:00Z", "2024-13-01T00:00:00Z", "9999-12-31T23:59:59Z", "0001-01-01T00:00:00Z"]
    stamps += [
        "2024-02-29T12:34:56.789Z",
        "2023-02-29T00:00:00Z",
        "2024-05-01T10:00:00+05:30",
        "2024-05-01T1:00:00Z",
    ]
    stamps += ["2024-05-01T10:00:00.123456789123-08:00", "2024-05-01 10:00:00Z", "2024-05-01T10:00:00,5Z"]
    for text in stamps:
        yield f"string(timestamp({_q(text)})) == ''"
        yield f"timestamp(dyn([{_q(text)}])[0]) < timestamp(0)"
    spans = ["1h30m", "-1.5s", "100ms", "1d", "9999999999h", "0", "", "+1s", ".5s", "1µs", "1e3s"]
    spans += ["2562047h47m16.854775807s", "2562047h47m16.854775808s", "-2562047h47m16.854775808s"]
    for text in spans:
        yield f"string(duration({_q(text)})) == '' || duration({_q(text)}).getMilliseconds() == 1"
        yield f"duration(dyn([{_q(text)}])[0]).getHours() == 1"
    for zone in ("UTC", "America/New_York", "Bogus/Zone", "+02:00", "-05:30", "x:y", ""):
        for getter in ("getFullYear", "getDayOfYear", "getDayOfWeek", "getHours", "getMinutes"):
            yield f'timestamp("2024-02-29T23:34:56.789-03:00").{getter}({_q(zone)}) == 1'
    yield 'timestamp("9999-12-31T23:59:59Z") + duration("1s") > timestamp(0)'
    yield 'timestamp("9999-12-31T23:59:59Z").getFullYear("Asia/Kolkata") == 10000'
    yield 'string(timestamp("9999-12-31T23:59:59Z") - timestamp("0001-01-01T00:00:00Z")) == ""'
    yield '-duration("-2562047h47m16.854775808s") > duration("0s")'
    yield "[timestamp(1), timestamp(0)].sort() == [timestamp(0), timestamp(1)]"
    yield "duration(1000000000) == duration('1s')"


def _format_cases() -> Iterator[str]:
    values = ["1", "-7", "18446744073709551615u", "1.5", "-0.0", "1e300", "1.0/0.0", "0.0/0.0"]
    values += ["123456789.125", '"abc"', '"NaN"', '"-Infinity"', 'b"ab"', 'b"\\xff"', "true", "null"]
    values += ["int", "[1, 2]", '{"k": 1}', "timestamp(0)", 'duration("1.5s")', 'quantity("1")']
    values += ["optional.of(1)", '[b"\\x00", "\\n", 2.5, null]', '{1: "a", true: "c"}', "[[]]"]
    for clause in ("%s", "%d", "%f", "%.2f", "%e", "%.3e", "%b", "%x", "%X", "%o"):
        for value in values:
            yield f'"{clause}".format([{value}]) == ""'
            yield f'"<{clause}>".format(dyn([{value}])) == ""'
    for text in ("%s %s", "%", "%%", "%.", "%.x", "%5d", "abc%", "%z"):
        yield f'"{text}".format(["a"]) == ""'
        yield f'"{text}".format(dyn(["a"])) == ""'
    yield '"%s".format(["a", "b"]) == ""'
    yield 'device.attributes["gpu.dradriver.dev"].productName.format([1, 2]) == ""'


LIBRARIES = {
    "ip-cidr": _ip_cases,
    "url": _url_cases,
    "optional": _optional_cases,
    "time": _time_cases,
    "format": _format_cases,
}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("library", sorted(LIBRARIES))
def test_library_edge_cases_agree_with_kubernetes(cel_oracle: Oracle, library: str) -> None:
    failures = []
    cases = list(LIBRARIES[library]())
    for expression in cases:
        try:
            check(cel_oracle, expression, [0])
        except AssertionError as err:
            failures.append(str(err).splitlines()[0])
    assert not failures, f"{len(failures)} of {len(cases)} disagree:\n" + "\n".join(failures[:20])
