# ruff: noqa: E501 - generator rules read best one per line
"""A hypothesis strategy for DRA CEL selectors, from the grammar of the Kubernetes 1.36 environment.

Expressions are built by type (bool, int, uint, double, string, bytes, lists, maps, quantity,
semver, ip, cidr, url, named formats, timestamp, duration, optional, dyn attributes) so that most of them
compile, with a share of deliberate mistakes mixed in: wrong operand types, unknown names and
fields, overflow, conversions that cannot succeed, syntax slips and expressions over the cost
budget. Attribute and capacity names come from what dradriver publishes for the fake profiles
(bare names under the driver's domain, `resource.kubernetes.io/...` qualified ones, and names
that do not exist).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

DRIVER = "gpu.dradriver.dev"
STANDARD = "resource.kubernetes.io"
DRIVER_ATTRS = {
    "string": ["type", "uuid", "productName", "brand", "architecture", "profile", "parentUUID"],
    "int": [
        "computeMajor",
        "computeMinor",
        "minor",
        "numaNode",
        "parentMinor",
        "placementStart",
        "placementSize",
    ],
    "bool": ["migCapable", "migEnabled"],
    "version": ["cudaComputeCapability", "driverVersion", "cudaDriverVersion"],
}
STANDARD_ATTRS = {"string": ["pciBusID", "pcieRoot"]}
CAPACITIES = ["memory", "multiprocessors", "copyEngines", "decoders", "encoders", "jpegEngines", "ofaEngines"]
MISSING = ["nosuch", "memory", "compute", "gpu"]
FORMAT_NAMES = ["dns1123Label", "dns1123Subdomain", "dns1035Label", "qualifiedName", "dns1123LabelPrefix"]
FORMAT_NAMES += [
    "dns1123SubdomainPrefix",
    "dns1035LabelPrefix",
    "labelValue",
    "uri",
    "uuid",
    "byte",
    "date",
    "datetime",
]

Draw = Callable[[st.SearchStrategy[Any]], Any]


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


STRINGS = st.sampled_from(
    [
        "",
        "gpu",
        "mig",
        "NVIDIA",
        "H100",
        "A100",
        "Hopper",
        "Ampere",
        "1g.10gb",
        "0000:07:00.0",
        "pci0000:00",
        "GPU-",
        "a,b,c",
        " x ",
        "é",
        "日本",
        "%s-%d",
        "40Gi",
        "1.2.3",
        "v1.2",
        "12x",
        "-1",
        "10.0.0.1",
        "10.0.0.0/8",
        "::1",
        "fe80::1/64",
        "https://example.com:8443/a/b?x=1",
        "2024-05-01T10:00:00Z",
        "1h30m",
        "true",
    ]
)
REGEXES = st.sampled_from(
    ["^NVIDIA", "H[0-9]+", "[a-z]+", ".*", "^$", "(", "a|b", "[0-9]{2}", "\\\\d+", "(?i)gpu"]
)
QUANTITIES = st.sampled_from(
    ["0", "1", "40Gi", "80Gi", "9728Mi", "1.5", "100m", "1e3", "-1", "1k", "x", "10Pi"]
)
VERSIONS = st.sampled_from(
    ["1.2.3", "9.0.0", "535.104.5", "12.2.0", "1.0.0-rc.1", "v1", "1.02.0", "x", "1.2"]
)
INTS = st.one_of(
    st.integers(min_value=-5, max_value=20),
    st.sampled_from([0, 1, 2, 8, 9, 80, 1000, 2**31, 2**62, 9223372036854775807, -9223372036854775808]),
)


class Gen:
    """Builds one expression; `depth` bounds nesting, `scope` holds bound variables by type."""

    def __init__(self, draw: Draw) -> None:
        self.draw = draw
        self.scope: list[tuple[str, str]] = []
        self.names = iter(f"v{i}" for i in range(1000))

    def choice(self, options: list[Callable[[int], str]], depth: int) -> str:
        index = self.draw(st.integers(min_value=0, max_value=len(options) - 1))
        return options[index](depth)

    def pick(self, items: list[str]) -> str:
        return str(self.draw(st.sampled_from(items)))

    def var(self, kind: str) -> str | None:
        names = [name for name, k in self.scope if k == kind]
        return self.pick(names) if names else None

    # -- attribute paths ------------------------------------------------------------------------

    def attr(self, kind: str) -> str:
        """A path to an attribute of the given published kind (or a missing one, rarely)."""
        if kind == "string" and self.draw(st.integers(0, 4)) == 0:
            name = self.pick(STANDARD_ATTRS["string"])
            domain = STANDARD
        elif self.draw(st.integers(0, 15)) == 0:
            name = self.pick(MISSING)
            domain = self.pick([DRIVER, STANDARD, "other.example.com"])
        else:
            name = self.pick(DRIVER_ATTRS[kind])
            domain = DRIVER
        style = self.draw(st.integers(0, 3))
        base = f"device.attributes[{_q(domain)}]"
        if style == 1:
            return f"{base}[{_q(name)}]"
        if style == 2:
            bound = self.var("attrs")
            if bound is not None:
                return f"{bound}.{name}"
        return f"{base}.{name}"

    def capacity(self) -> str:
        name = self.pick(CAPACITIES) if self.draw(st.integers(0, 10)) else self.pick(MISSING)
        domain = DRIVER if self.draw(st.integers(0, 10)) else STANDARD
        return f"device.capacity[{_q(domain)}].{name}"

    # -- typed expressions ----------------------------------------------------------------------

    def bool_(self, depth: int) -> str:
        leaves: list[Callable[[int], str]] = [
            lambda d: self.pick(["true", "false"]),
            lambda d: self.attr("bool"),
            lambda d: f"device.driver == {_q(self.pick([DRIVER, 'other.dev']))}",
            lambda d: "device.allowMultipleAllocations",
            lambda d: f"has({self.attr(self.pick(['string', 'int', 'bool']))})",
            lambda d: f"{_q(self.pick(DRIVER_ATTRS['int'] + MISSING))} in device.attributes[{_q(DRIVER)}]",
            lambda d: f"{_q(self.pick([DRIVER, STANDARD, 'x.io']))} in device.attributes",
        ]
        if depth <= 0:
            return self.choice(leaves, depth)
        compound: list[Callable[[int], str]] = [
            lambda d: (
                f"{self.int_(d - 1)} {self.pick(['<', '<=', '>', '>=', '==', '!='])} {self.int_(d - 1)}"
            ),
            lambda d: f"{self.int_(d - 1)} {self.pick(['<', '==', '>='])} {self.num(d - 1)}",
            lambda d: f"{self.str_(d - 1)} {self.pick(['==', '!=', '<', '>'])} {self.str_(d - 1)}",
            lambda d: f"{self.bool_(d - 1)} {self.pick(['&&', '||'])} {self.bool_(d - 1)}",
            lambda d: f"!{self.bool_(d - 1)}",
            lambda d: f"({self.bool_(d - 1)} ? {self.bool_(d - 1)} : {self.bool_(d - 1)})",
            lambda d: self.string_predicate(d - 1),
            lambda d: self.quantity_predicate(d - 1),
            lambda d: self.semver_predicate(d - 1),
            lambda d: self.macro(d - 1),
            lambda d: self.bind(d - 1),
            lambda d: self.list_predicate(d - 1),
            lambda d: self.network_predicate(d - 1),
            lambda d: self.format_predicate(d - 1),
            lambda d: self.time_predicate(d - 1),
            lambda d: self.optional_predicate(d - 1),
            lambda d: self.mistake(d - 1),
            lambda d: (
                f"type({self.any_(d - 1)}) == {self.pick(['int', 'string', 'bool', 'uint', 'double', 'list', 'map'])}"
            ),
            lambda d: f"{self.any_(d - 1)} == {self.any_(d - 1)}",
            lambda d: f"{self.scalar(d - 1)} in {self.list_(d - 1)}",
            lambda d: f"{self.attr(self.pick(['string', 'int']))} in {self.list_(d - 1)}",
            lambda d: self.budget(d - 1),
        ]
        return self.choice(leaves + compound + compound, depth)

    def num(self, depth: int) -> str:
        return self.choice([self.int_, self.uint, self.double], depth)

    def int_(self, depth: int) -> str:
        leaves: list[Callable[[int], str]] = [
            lambda d: str(self.draw(INTS)),
            lambda d: self.attr("int"),
            lambda d: self.var("int") or "1",
        ]
        if depth <= 0:
            return self.choice(leaves, depth)
        compound: list[Callable[[int], str]] = [
            lambda d: f"({self.int_(d - 1)} {self.pick(['+', '-', '*', '/', '%'])} {self.int_(d - 1)})",
            lambda d: f"-{self.int_(d - 1)}",
            lambda d: f"size({self.sized(d - 1)})",
            lambda d: f"{self.sized(d - 1)}.size()",
            lambda d: f"int({self.pick([self.str_(d - 1), self.double(d - 1), self.uint(d - 1)])})",
            lambda d: f"{self.str_(d - 1)}.indexOf({self.str_(d - 1)})",
            lambda d: f"{self.str_(d - 1)}.lastIndexOf({self.str_(d - 1)})",
            lambda d: f"{self.capacity()}.asInteger()",
            lambda d: f"{self.quantity(d - 1)}.compareTo({self.quantity(d - 1)})",
            lambda d: f"{self.semver(d - 1)}.{self.pick(['major', 'minor', 'patch'])}()",
            lambda d: f"{self.int_list(d - 1)}.{self.pick(['sum', 'max', 'min'])}()",
            lambda d: f"{self.int_list(d - 1)}[{self.int_(d - 1)}]",
            lambda d: f"{self.timestamp(d - 1)}.{self.pick(['getFullYear', 'getMonth', 'getHours'])}()",
            lambda d: f"{self.cidr(d - 1)}.prefixLength()",
            lambda d: f"{self.ip(d - 1)}.family()",
            lambda d: f"sign({self.quantity(d - 1)})",
        ]
        return self.choice(leaves + compound, depth)

    def uint(self, depth: int) -> str:
        options: list[Callable[[int], str]] = [
            lambda d: f"{self.draw(st.sampled_from([0, 1, 7, 18446744073709551615]))}u",
            lambda d: f"uint({self.int_(d - 1)})",
            lambda d: f"({self.uint(d - 1)} {self.pick(['+', '-', '*', '/', '%'])} {self.uint(d - 1)})",
        ]
        return self.choice(options[:1] if depth <= 0 else options, depth)

    def double(self, depth: int) -> str:
        options: list[Callable[[int], str]] = [
            lambda d: self.pick(["0.0", "1.5", "-2.5", "1e300", "3.0", "0.1"]),
            lambda d: f"double({self.int_(d - 1)})",
            lambda d: f"{self.capacity()}.asApproximateFloat()",
            lambda d: f"({self.double(d - 1)} {self.pick(['+', '-', '*', '/'])} {self.double(d - 1)})",
            lambda d: f"double({self.str_(d - 1)})",
        ]
        return self.choice(options[:1] if depth <= 0 else options, depth)

    def str_(self, depth: int) -> str:
        leaves: list[Callable[[int], str]] = [
            lambda d: _q(self.draw(STRINGS)),
            lambda d: self.attr("string"),
            lambda d: "device.driver",
            lambda d: self.var("string") or '"x"',
        ]
        if depth <= 0:
            return self.choice(leaves, depth)
        compound: list[Callable[[int], str]] = [
            lambda d: f"{self.str_(d - 1)} + {self.str_(d - 1)}",
            lambda d: f"{self.str_(d - 1)}.{self.pick(['lowerAscii', 'upperAscii', 'trim'])}()",
            lambda d: f"{self.str_(d - 1)}.substring({self.int_(d - 1)})",
            lambda d: f"{self.str_(d - 1)}.charAt({self.int_(d - 1)})",
            lambda d: f"{self.str_(d - 1)}.replace({self.str_(d - 1)}, {self.str_(d - 1)})",
            lambda d: f"{self.str_list(d - 1)}.join({self.str_(d - 1)})",
            lambda d: f"string({self.scalar(d - 1)})",
            lambda d: f"{self.str_(d - 1)}.find({_q(self.draw(REGEXES))})",
            lambda d: f"strings.quote({self.str_(d - 1)})",
            lambda d: f"{_q(self.pick(['%s', '%d-%s', 'x%v', '%.2f']))}.format([{self.scalar(d - 1)}])",
            lambda d: (
                f"{_q(self.pick(['%s', '%d', '%.3f', '%e', '%b', '%x', '%X', '%o', '<%s|%s>', '%%', '%']))}"
                f".format({self.format_args(d - 1)})"
            ),
            lambda d: f"{self.str_(d - 1)}.format([{self.any_(d - 1)}])",
            lambda d: f"string({self.pick([self.timestamp(d - 1), self.duration(d - 1), self.cidr(d - 1)])})",
            lambda d: f"{self.url(d - 1)}.getQuery()[{_q(self.pick(['x', 'y']))}][0]",
            lambda d: (
                f"{self.url(d - 1)}.{self.pick(['getScheme', 'getHost', 'getHostname', 'getPort', 'getEscapedPath'])}()"
            ),
            lambda d: f"string({self.ip(d - 1)})",
            lambda d: f"{self.str_list(d - 1)}[{self.int_(d - 1)}]",
        ]
        return self.choice(leaves + compound, depth)

    def format_args(self, depth: int) -> str:
        items = ", ".join(self.any_(depth) for _ in range(self.draw(st.integers(0, 3))))
        return f"dyn([{items}])" if self.draw(st.booleans()) else f"[{items}]"

    def scalar(self, depth: int) -> str:
        return self.choice([self.int_, self.str_, self.bool_, self.double, self.uint], depth)

    def any_(self, depth: int) -> str:
        return self.choice(
            [
                self.scalar,
                lambda d: self.attr(self.pick(["string", "int", "bool", "version"])),
                self.list_,
                self.quantity,
                self.semver,
            ],
            depth,
        )

    def sized(self, depth: int) -> str:
        return self.choice(
            [
                self.str_,
                self.list_,
                lambda d: f"device.attributes[{_q(self.pick([DRIVER, STANDARD]))}]",
                lambda d: "device.attributes",
                lambda d: f"b{_q(self.draw(STRINGS))}",
            ],
            depth,
        )

    def int_list(self, depth: int) -> str:
        options: list[Callable[[int], str]] = [
            lambda d: (
                "[" + ", ".join(str(self.draw(INTS)) for _ in range(self.draw(st.integers(0, 4)))) + "]"
            ),
            lambda d: f"[{self.int_(d - 1)}, {self.int_(d - 1)}]",
            lambda d: f"lists.range({self.draw(st.sampled_from([0, 3, 10]))})",
            lambda d: f"{self.int_list(d - 1)}.map(x, x * {self.int_(0)})",
            lambda d: f"{self.int_list(d - 1)}.filter(x, x > {self.int_(0)})",
            lambda d: f"{self.int_list(d - 1)}.{self.pick(['sort', 'reverse', 'distinct'])}()",
            lambda d: f"{self.int_list(d - 1)} + {self.int_list(d - 1)}",
            lambda d: f"{self.int_list(d - 1)}.slice(0, {self.draw(st.integers(0, 3))})",
        ]
        return self.choice(options[:1] if depth <= 0 else options, depth)

    def str_list(self, depth: int) -> str:
        options: list[Callable[[int], str]] = [
            lambda d: (
                "[" + ", ".join(_q(self.draw(STRINGS)) for _ in range(self.draw(st.integers(0, 3)))) + "]"
            ),
            lambda d: f"{self.str_(d - 1)}.split({_q(self.pick([',', ' ', '', '-', ':']))})",
            lambda d: f"{self.str_(d - 1)}.findAll({_q(self.draw(REGEXES))})",
            lambda d: f"[{self.str_(d - 1)}, {self.attr('string')}]",
            lambda d: f"device.attributes[{_q(DRIVER)}].map(k, k)",
        ]
        return self.choice(options[:1] if depth <= 0 else options, depth)

    def list_(self, depth: int) -> str:
        return self.choice(
            [
                self.int_list,
                self.str_list,
                lambda d: f"[{self.double(d - 1)}, {self.double(d - 1)}]",
                lambda d: f"[{self.scalar(d - 1)}, {self.scalar(d - 1)}]",
                lambda d: "[]",
            ],
            depth,
        )

    def quantity(self, depth: int) -> str:
        options: list[Callable[[int], str]] = [
            lambda d: f"quantity({_q(self.draw(QUANTITIES))})",
            lambda d: self.capacity(),
            lambda d: (
                f"{self.quantity(d - 1)}.{self.pick(['add', 'sub'])}({self.pick([self.quantity(d - 1), self.int_(0)])})"
            ),
        ]
        return self.choice(options[:2] if depth <= 0 else options, depth)

    def semver(self, depth: int) -> str:
        options: list[Callable[[int], str]] = [
            lambda d: f"semver({_q(self.draw(VERSIONS))})",
            lambda d: f"semver({_q(self.draw(VERSIONS))}, {self.pick(['true', 'false'])})",
            lambda d: self.attr("version"),
        ]
        return self.choice(options, depth)

    def ip(self, depth: int) -> str:
        return self.choice(
            [
                lambda d: (
                    f"ip({_q(self.pick(['10.0.0.1', '::1', '192.168.0.1', 'fe80::1', '1.2.3', '127.0.0.1']))})"
                ),
                lambda d: f"{self.cidr(d)}.ip()",
                lambda d: f"ip({self.str_(d - 1)})" if d > 0 else "ip('10.1.1.1')",
            ],
            depth,
        )

    def cidr(self, depth: int) -> str:
        values = ["10.0.0.0/8", "::1/128", "192.168.0.0/16", "fe80::/10", "10.0.0.1/33", "0.0.0.0/0"]
        options: list[Callable[[int], str]] = [
            lambda d: f"cidr({_q(self.pick(values))})",
            lambda d: f"cidr({_q(self.pick(values))}).masked()",
        ]
        return self.choice(options, depth)

    def url(self, depth: int) -> str:
        values = [
            "https://example.com:8443/a/b?x=1",
            "http://[::1]:80/",
            "/relative",
            "not a url",
            "ftp://h/p%20q",
        ]
        return f"url({_q(self.pick(values))})"

    def timestamp(self, depth: int) -> str:
        values = [
            "2024-05-01T10:00:00Z",
            "1970-01-01T00:00:00Z",
            "2024-13-01T00:00:00Z",
            "9999-12-31T23:59:59Z",
        ]
        options: list[Callable[[int], str]] = [
            lambda d: f"timestamp({_q(self.pick(values))})",
            lambda d: f"timestamp({self.int_(d - 1)})",
            lambda d: f"{self.timestamp(d - 1)} + {self.duration(d - 1)}",
        ]
        return self.choice(options[:1] if depth <= 0 else options, depth)

    def duration(self, depth: int) -> str:
        values = ["1h", "30m", "1h30m", "-5s", "1.5s", "100ms", "1d", "9999999999h"]
        options: list[Callable[[int], str]] = [
            lambda d: f"duration({_q(self.pick(values))})",
            lambda d: f"{self.timestamp(d - 1)} - {self.timestamp(d - 1)}",
        ]
        return self.choice(options[:1] if depth <= 0 else options, depth)

    # -- predicates -----------------------------------------------------------------------------

    def string_predicate(self, depth: int) -> str:
        method = self.pick(["startsWith", "endsWith", "contains", "matches"])
        argument = _q(self.draw(REGEXES)) if method == "matches" else self.str_(depth)
        return f"{self.str_(depth)}.{method}({argument})"

    def quantity_predicate(self, depth: int) -> str:
        return self.choice(
            [
                lambda d: (
                    f"{self.quantity(d)}.{self.pick(['isGreaterThan', 'isLessThan'])}({self.quantity(d)})"
                ),
                lambda d: (
                    f"{self.quantity(d)}.compareTo({self.quantity(d)}) {self.pick(['>=', '<', '=='])} 0"
                ),
                lambda d: f"{self.quantity(d)}.isInteger()",
                lambda d: f"isQuantity({self.str_(d)})",
                lambda d: f"{self.quantity(d)} == {self.quantity(d)}",
            ],
            depth,
        )

    def semver_predicate(self, depth: int) -> str:
        return self.choice(
            [
                lambda d: f"{self.semver(d)}.{self.pick(['isGreaterThan', 'isLessThan'])}({self.semver(d)})",
                lambda d: f"{self.semver(d)}.compareTo({self.semver(d)}) {self.pick(['>=', '<', '=='])} 0",
                lambda d: f"isSemver({self.str_(d)})",
                lambda d: f"isSemver({self.str_(d)}, true)",
                lambda d: f"{self.semver(d)} == {self.semver(d)}",
            ],
            depth,
        )

    def list_predicate(self, depth: int) -> str:
        return self.choice(
            [
                lambda d: f"{self.list_(d)}.isSorted()",
                lambda d: (
                    f"sets.{self.pick(['contains', 'intersects', 'equivalent'])}({self.int_list(d)}, {self.int_list(d)})"
                ),
                lambda d: f"{self.int_list(d)}.indexOf({self.int_(d)}) >= 0",
                lambda d: f"{self.str_list(d)}.size() {self.pick(['>', '=='])} {self.int_(0)}",
                lambda d: f"{self.int_list(d)} == {self.int_list(d)}",
                lambda d: f"{{{self.str_(0)}: {self.int_(d)}}}[{self.str_(0)}] > 0",
                lambda d: f"{self.str_(0)} in {{{self.str_(0)}: 1, 'b': 2}}",
                # DRA's `includes`: in the scheduler's environment always, in new selectors only
                # with DRAListTypeAttributes (the validate verdict differs from the match).
                lambda d: (
                    f"{self.pick([self.attr('string'), self.attr('int'), self.list_(d)])}.includes({self.scalar(d)})"
                ),
            ],
            depth,
        )

    def network_predicate(self, depth: int) -> str:
        return self.choice(
            [
                lambda d: f"isIP({self.str_(d)})",
                lambda d: f"isCIDR({self.str_(d)})",
                lambda d: f"isURL({self.str_(d)})",
                lambda d: f"{self.cidr(d)}.containsIP({self.pick([self.ip(d), _q('10.1.2.3'), _q('::2')])})",
                lambda d: f"{self.cidr(d)}.containsCIDR({self.pick([self.cidr(d), _q('10.1.0.0/16')])})",
                lambda d: (
                    f"{self.ip(d)}.{self.pick(['isLoopback', 'isUnspecified', 'isGlobalUnicast', 'isLinkLocalUnicast', 'isLinkLocalMulticast'])}()"
                ),
                lambda d: f"ip.isCanonical({_q(self.pick(['10.0.0.1', '::1', '2001:db8::0:1', 'x']))})",
                lambda d: f"{self.ip(d)} == {self.ip(d)}",
                lambda d: f"{self.url(d)} == {self.url(d)}",
            ],
            depth,
        )

    def named_format(self, depth: int) -> str:
        options: list[Callable[[int], str]] = [
            lambda d: f"format.{self.pick(FORMAT_NAMES)}()",
            lambda d: f"format.named({_q(self.pick([*FORMAT_NAMES, 'nope', 'URI']))}).value()",
            lambda d: f"format.named({self.str_(d - 1)}).orValue(format.{self.pick(FORMAT_NAMES)}())",
        ]
        return self.choice(options[:1] if depth <= 0 else options, depth)

    def format_predicate(self, depth: int) -> str:
        return self.choice(
            [
                lambda d: f"{self.named_format(d)}.validate({self.str_(d)}).hasValue()",
                lambda d: f"{self.named_format(d)}.validate({self.str_(d)}) == optional.none()",
                lambda d: (
                    f"{self.named_format(d)}.validate({self.str_(d)}).orValue([]).size() {self.pick(['>', '=='])} {self.int_(0)}"
                ),
                lambda d: (
                    f"{self.named_format(d)}.validate({self.str_(d)}).orValue(['']).join('; ').contains({self.str_(d)})"
                ),
                lambda d: f"format.named({self.str_(d)}).hasValue()",
                lambda d: f"{self.named_format(d)} {self.pick(['==', '!='])} {self.named_format(d)}",
                lambda d: (
                    f"{self.named_format(d)}.validate({self.pick([self.int_(d), 'dyn(1)', self.attr('int')])}).hasValue()"
                ),
            ],
            depth,
        )

    def time_predicate(self, depth: int) -> str:
        return self.choice(
            [
                lambda d: f"{self.timestamp(d)} {self.pick(['<', '==', '>='])} {self.timestamp(d)}",
                lambda d: f"{self.duration(d)} {self.pick(['<', '==', '>'])} {self.duration(d)}",
                lambda d: (
                    f"{self.timestamp(d)}.getDayOfWeek({_q(self.pick(['UTC', 'America/New_York', 'Bogus/Zone', '+02:00']))}) >= 0"
                ),
                lambda d: f"string({self.duration(d)}) != ''",
                lambda d: (
                    f"{self.timestamp(d)}.{self.pick(['getFullYear', 'getMonth', 'getDayOfYear', 'getDate', 'getMinutes', 'getMilliseconds'])}({_q(self.pick(['UTC', 'Asia/Kolkata', '-05:30', 'x:y']))}) >= 0"
                ),
                lambda d: f"{self.duration(d)}.{self.pick(['getHours', 'getMinutes', 'getSeconds'])}() != 0",
                lambda d: f"[{self.duration(d)}, {self.duration(d)}].sum() > duration('0s')",
            ],
            depth,
        )

    def optional_predicate(self, depth: int) -> str:
        domain = _q(self.pick([DRIVER, STANDARD]))
        name = self.pick(DRIVER_ATTRS["string"] + MISSING)
        return self.choice(
            [
                lambda d: f"device.attributes[{domain}].?{name}.hasValue()",
                lambda d: f"device.attributes[{domain}][?{_q(name)}].orValue('x') == {self.str_(d)}",
                lambda d: f"optional.of({self.int_(d)}).value() == {self.int_(d)}",
                lambda d: f"optional.none().orValue({self.int_(d)}) > 0",
                lambda d: f"optional.ofNonZeroValue({self.str_(d)}).hasValue()",
                lambda d: f"[?optional.none(), {self.int_(d)}].size() == 1",
                lambda d: f"{{?'a': optional.of({self.int_(d)})}}.size() == 1",
                lambda d: "device.attributes.?x.orValue({}).size() == 0",
                lambda d: f"device.attributes[{domain}].?{name}.optMap(v, v + 'x').orValue('') != ''",
                lambda d: f"{self.int_list(d)}.{self.pick(['first', 'last'])}().orValue(0) >= 0",
                lambda d: f"optional.unwrap([optional.of({self.int_(d)}), optional.none()]).size() == 1",
                lambda d: f"{{'a': {self.int_(d)}}}.?b.or(optional.of(1)).value() > 0",
                lambda d: f"[1, 2][?{self.int_(d)}].hasValue()",
            ],
            depth,
        )

    def macro(self, depth: int) -> str:
        kind = self.pick(["all", "exists", "exists_one"])
        source = self.draw(st.integers(0, 4))
        name = next(self.names)
        if source == 0:
            inner = self._scoped(name, "int", lambda: self.bool_(depth))
            return f"{self.int_list(depth)}.{kind}({name}, {inner})"
        if source == 1:
            inner = self._scoped(name, "string", lambda: self.bool_(depth))
            return f"device.attributes[{_q(DRIVER)}].{kind}({name}, {inner})"
        if source == 2:
            inner = self._scoped(name, "string", lambda: self.bool_(depth))
            return f"device.attributes.{kind}({name}, {inner})"
        if source == 3:
            second = next(self.names)
            self.scope.append((name, "int"))
            inner = self._scoped(second, "string", lambda: self.bool_(depth))
            self.scope.pop()
            return f"{self.str_list(depth)}.{self.pick(['all', 'exists', 'existsOne'])}({name}, {second}, {inner})"
        inner = self._scoped(name, "string", lambda: self.bool_(depth))
        return f"{self.str_list(depth)}.{kind}({name}, {inner})"

    def bind(self, depth: int) -> str:
        name = next(self.names)
        if self.draw(st.booleans()):
            value = f"device.attributes[{_q(DRIVER)}]"
            inner = self._scoped(name, "attrs", lambda: self.bool_(depth))
        else:
            kind = self.pick(["int", "string"])
            value = self.int_(depth) if kind == "int" else self.str_(depth)
            inner = self._scoped(name, kind, lambda: self.bool_(depth))
        return f"cel.bind({name}, {value}, {inner})"

    def _scoped(self, name: str, kind: str, body: Callable[[], str]) -> str:
        self.scope.append((name, kind))
        try:
            return body()
        finally:
            self.scope.pop()

    def mistake(self, depth: int) -> str:
        """Expressions the API server or the scheduler rejects."""
        return self.choice(
            [
                lambda d: f"{self.attr('version')} {self.pick(['==', '!=', '<'])} {_q(self.draw(VERSIONS))}",
                lambda d: f"{self.attr('string')} + 1 == 2",
                lambda d: f"{self.attr('int')} == {_q('9')}",
                lambda d: f"{self.capacity()} > {self.pick(['1', _q('40Gi')])}",
                lambda d: f"{self.int_(d)} == {self.str_(d)}",
                lambda d: f"{self.pick(['nosuch', 'attributes', 'dev'])}.x == 1",
                lambda d: f"device.{self.pick(['name', 'pool', 'attribute', 'capacities'])} == 'x'",
                lambda d: f"int({_q(self.pick(['12x', '99999999999999999999', '7', ' 1']))}) == 7",
                lambda d: f"uint({self.pick(['-1', '-1.5', '1e20', '3'])}) > 0u",
                lambda d: f"9223372036854775807 + {self.int_(d)} > 0",
                lambda d: f"-9223372036854775808 - {self.int_(d)} < 0",
                lambda d: f"{self.int_(d)} / {self.pick(['0', '-1'])} == 1",
                lambda d: f"({self.bool_(d)}",
                lambda d: f"{self.bool_(d)})",
                lambda d: f"{self.bool_(d)} &&",
                lambda d: f"{self.bool_(d)} & {self.bool_(d)}",
                lambda d: f"{self.attr('string')}.?x == 'a'",
                lambda d: f"{self.str_(d)}.matches({_q('(')})",
                lambda d: f"{self.int_(d)}",
                lambda d: f"{self.str_(d)}",
                lambda d: self.attr(self.pick(["string", "int", "bool"])),
                lambda d: f"device.attributes[{_q(DRIVER)}].{self.pick(MISSING)} in []",
                lambda d: "[1, 'a'] == [1]",
                lambda d: f"{self.str_(d)}.size() > 'a'",
                lambda d: "1 == 1 ? 'a' : 2",
                lambda d: f"'{self.draw(STRINGS)}",
                lambda d: f"{self.bool_(d)} ? {self.bool_(d)}",
                lambda d: (
                    f"device.attributes[{_q(DRIVER)}].{self.pick(DRIVER_ATTRS['int'])}.{self.pick(['startsWith', 'size', 'all'])}('x')"
                ),
                lambda d: f"timestamp({_q('not a time')}) < now",
                lambda d: f"duration({_q('1x')}) > duration('1s')",
            ],
            depth,
        )

    def budget(self, depth: int) -> str:
        """Expressions near or over the cost limit, at estimate time or at run time."""
        return self.choice(
            [
                lambda d: (
                    f"lists.range({self.pick(['100', '1000', '2000'])}).all(i, lists.range({self.pick(['10', '500', '1000'])}).all(j, i >= 0))"
                ),
                lambda d: (
                    "device.attributes.all(d, device.attributes[d].all(a, device.attributes.all(e, true)))"
                ),
                lambda d: (
                    f"{self.str_(d)}.replace('', {_q('x' * self.draw(st.sampled_from([1, 100])))}).size() > 0"
                ),
                lambda d: (
                    "device.attributes.exists(d, device.attributes[d].exists(a, string(device.attributes[d][a]).matches('x+y')))"
                ),
                lambda d: f"lists.range({self.pick(['3000', '100000'])}).map(x, x * 2).size() > 0",
            ],
            depth,
        )


@st.composite
def selectors(draw: Draw, depth: int = 3) -> str:
    """One selector expression (most compile; some are deliberate mistakes)."""
    max_depth = draw(st.integers(min_value=0, max_value=depth))
    return Gen(draw).bool_(max_depth)
