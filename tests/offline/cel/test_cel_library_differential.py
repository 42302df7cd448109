"""Edge cases of the IP/CIDR, URL, optional, time, format and named-format libraries against dra-oracle.

The generated selectors (test_cel_differential.py) reach these libraries with a few typical
values; here every library's parsing and formatting corners are crossed systematically (Go's
netip and net/url rules, RFC 3339 and ParseDuration, every format clause on every type, every
named format on valid and invalid names, URIs, UUIDs, base64 and dates) and
each expression goes through the same comparison: outcome, messages, actual and estimated cost,
and the API server's verdict.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.offline.cel.test_cel_differential import check
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


FORMAT_NAMES = ["dns1123Label", "dns1123Subdomain", "dns1035Label", "qualifiedName", "dns1123LabelPrefix"]
FORMAT_NAMES += ["dns1123SubdomainPrefix", "dns1035LabelPrefix", "labelValue", "uri", "uuid", "byte", "date"]
FORMAT_NAMES += ["datetime"]


def _named_format_texts() -> list[str]:
    names = ["", "abc", "my-name", "-abc", "abc-", "-", "--", "a-", "A-", "ABC", "aBc", "a.b", "a..b", "a.b-"]
    names += ["1abc", "a" * 63, "a" * 64, "a" * 63 + "-", "a" * 64 + "-", "A" * 70, "a" * 253, "a" * 254]
    names += ["a" * 253 + "-", "é", "é-", "ab_c", "a b", "a/b", "/b", "a/", "a.com/b", "A.com/b", "a/b/c"]
    names += ["a" * 254 + "/x", "example.com/" + "n" * 64, "x/" + "-" * 64]
    uris = ["http://example.com", "https://[::1]:80/p?q#f", "/relative", "x", "not a url", "http://a b"]
    uris += ["http://%zz", "*", "mailto:a@b", "a\x01b", "http://h:port/", "//host/p"]
    uuids = ["123e4567-e89b-12d3-a456-426614174000", "123E4567-E89B-12D3-A456-426614174000"]
    uuids += ["123e4567e89b12d3a456426614174000", "123e4567-e89b12d3-a456-426614174000"]
    uuids += ["123e4567-e89b-12d3-a456-42661417400", "{123e4567-e89b-12d3-a456-426614174000}"]
    uuids += ["g23e4567-e89b-12d3-a456-426614174000"]
    base64 = ["aGVsbG8=", "aGVsbA==", "aGVs", "aGVsbA=", "aGVsbA", "aGV-bA==", "aGV_bA==", "aGVsbG8=aGVs"]
    base64 += ["aGVs\n", "+/+/"]
    dates = ["2021-01-01", "2020-02-29", "2021-02-29", "1900-02-29", "2000-02-29", "2021-13-01", "2021-1-01"]
    dates += ["0000-01-01", "2021-01-00", "2021-04-31", "2021-01-01 ", "+021-01-01"]
    times = ["2021-01-01T00:00:00Z", "2021-01-01t00:00:00z", "2021-01-01T00:00:00.123+01:00"]
    times += [
        "2021-01-01T00:00:00.Z",
        "2021-01-01T00:00:00x1Z",
        "2021-01-01T24:00:00Z",
        "2021-01-01T23:60:00Z",
    ]
    times += [
        "2021-01-01T23:59:60Z",
        "2021-01-01T23:59:59",
        "2021-01-01T00:00:00ZTfoo",
        "2021-01-01 00:00:00Z",
    ]
    times += ["2021-01-01T00:00:00+0100", "2021-01-01T00:00:00Z\n", "2021-01-01T00:00:00\u01305Z"]
    times += ["2021-02-30T00:00:00Z", "T00:00:00Z", "2021-01-01T00:00:00\n1Z"]
    return names + uris + uuids + base64 + dates + times


def _named_format_cases() -> Iterator[str]:
    # Every format on every text; a missing key shows the messages themselves in the error.
    for name in FORMAT_NAMES:
        for text in _named_format_texts():
            yield f'{{"": 0}}[format.{name}().validate({_q(text)}).orValue(["valid"]).join(" | ")] == 0'
    product = 'device.attributes["gpu.dradriver.dev"].productName'
    for name in FORMAT_NAMES:
        yield f"format.named({_q(name)}).value().validate({product}) == optional.none()"
        yield f"format.{name}().validate({product}.lowerAscii()).hasValue()"
        yield f"format.{name}() == format.named({_q(name)}).value()"
    yield from (
        'format.named("nope").hasValue() || format.named("URI").hasValue() || format.named("").hasValue()',
        'format.named("nope").value().validate("x").hasValue()',
        'format.named("nope").orValue(format.uuid()) == format.uuid() && format.uri() != format.uuid()',
        f"format.named({product}).hasValue()",
        "format.named(dyn(1)).hasValue()",
        "format.uri().validate(dyn(1)).hasValue()",
        'dyn(1).validate("a") == optional.none()',
        'dyn(format.uri()).validate("x").hasValue()',
        "dyn(format.uri()) == 1 || 1 == dyn(format.uri())",
        "dyn(format.uri()) == dyn(format.uuid())",
        "dyn(format.uri()).all(x, true)",
        "dyn(format.uri()).size() == 1",
        'format.named("uri") == optional.of(format.uri())',
        "type(format.uri()) == type(format.uuid())",
        "type(format.uri()) == kubernetes.NamedFormat",
        'string(format.uri()) == ""',
        "format.uri() == 1",
        "format.uri()",
        'format.uri().validate("x")',
        "format.uri().validate(1).hasValue()",
        'format.uri().validate("a", "b").hasValue()',
        "format.dns1123Label(1) == format.uri()",
        "format.named().hasValue()",
        'format.named("a", "b").hasValue()',
        "format.nope() == format.uri()",
        'format.validate("a").hasValue()',
        '"%s".format([format.uri()]) == ""',
        '"%s".format(dyn([format.uri()])) == ""',
        "format.uri() in [format.uuid(), format.uri()]",
        '{"a": format.uri()}["a"] == format.uri()',
        "[format.uri(), format.uuid()].exists(f, f.validate(device.driver).hasValue())",
        'format.uri().validate("x").value().size() == 1 && format.uri().validate("x").value()[0] != ""',
        'device.attributes["gpu.dradriver.dev"].exists(k, format.qualifiedName().validate(k).hasValue())',
        f"format.labelValue().validate({product} + '-' + {product}).orValue([]).size() == 0",
    )


LIBRARIES = {
    "ip-cidr": _ip_cases,
    "url": _url_cases,
    "optional": _optional_cases,
    "time": _time_cases,
    "format": _format_cases,
    "named-format": _named_format_cases,
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
